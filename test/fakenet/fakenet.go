// Package fakenet builds a small "internet" out of network namespaces on
// this machine, for tests and benchmarks of egress: a stand-in host (where
// airlock runs, with its own nftables and links) wired to a world of
// servers on TEST-NET addresses, a DNS server, a fake metadata server at
// 169.254.169.254 and a fake private host at 10.99.0.5. A broken policy
// shows up as a connection that succeeded; nothing can leave the machine,
// because the world has no uplink. Needs root.
package fakenet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Internet is a stand-in host (where airlock runs) wired to a stand-in
// world of web servers on TEST-NET addresses and a DNS server; the world
// routes to a "metadata server" at 169.254.169.254 and a "private host" at
// 10.99.0.5, each in a network namespace of its own. A broken policy shows
// up as a connection that succeeded; nothing can leave the machine (no
// namespace has an uplink).
type Internet struct {
	Host, World netns.NsHandle // where airlock runs; the servers
	Meta, Priv  netns.NsHandle // the metadata server; the private host
	CAFile      string         // PEM of the CA that signed the servers' certificates
	// GitUser and GitPassword are what git.test asks of every request
	// (read or push); GitRoot holds its bare repositories.
	GitUser, GitPassword string
	GitRoot              string
	closers              []func()
	mu                   sync.Mutex
	seen                 []string
}

// Seen lists the requests api.test and git.test received, one line each:
// "HOST METHOD URI auth=AUTHORIZATION-HEADER x-api-key=... body=BODY".
func (fi *Internet) Seen() []string {
	fi.mu.Lock()
	defer fi.mu.Unlock()
	return slices.Clone(fi.seen)
}

func (fi *Internet) saw(r *http.Request, body []byte) {
	fi.mu.Lock()
	defer fi.mu.Unlock()
	fi.seen = append(fi.seen, fmt.Sprintf("%s %s %s auth=%q x-api-key=%q body=%q", r.Host, r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), body))
}

// Addrs is the world's DNS: name -> address.
var Addrs = map[string]string{
	"allowed.test": "192.0.2.10", "evil.test": "192.0.2.11", "rebind.test": "10.99.0.5",
	"meta.test": "169.254.169.254", "dns.test": "192.0.2.53", "bench.test": "192.0.2.12",
	"api.test": "192.0.2.20", "git.test": "192.0.2.21",
	"host.test": "198.51.100.1", // the stand-in host's own address
}

// InNS runs f on a locked OS thread inside ns.
func InNS(t testing.TB, ns netns.NsHandle, f func()) {
	t.Helper()
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err)
		}
	}()
	f()
}

// New builds the internet; t.Cleanup tears it down.
func New(t testing.TB) *Internet {
	t.Helper()
	fi := &Internet{}
	goruntime.LockOSThread()
	orig, _ := netns.Get()
	var err error
	if fi.Host, err = netns.New(); err == nil {
		if fi.World, err = netns.New(); err == nil {
			if fi.Meta, err = netns.New(); err == nil {
				fi.Priv, err = netns.New()
			}
		}
	}
	if serr := netns.Set(orig); serr != nil {
		panic(serr)
	}
	orig.Close()
	goruntime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fi.Close)

	hh, _ := netlink.NewHandleAt(fi.Host)
	wh, _ := netlink.NewHandleAt(fi.World)
	defer hh.Close()
	defer wh.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "inet0"}, PeerName: "uplink0", PeerNamespace: netlink.NsFd(fi.World)}))
	up := func(h *netlink.Handle, name, cidr string) netlink.Link {
		l, err := h.LinkByName(name)
		must(err)
		if cidr != "" {
			a, _ := netlink.ParseAddr(cidr)
			must(h.AddrAdd(l, a))
		}
		must(h.LinkSetUp(l))
		return l
	}
	up(hh, "lo", "")
	inet0 := up(hh, "inet0", "198.51.100.1/24")
	must(hh.RouteAdd(&netlink.Route{LinkIndex: inet0.Attrs().Index, Gw: net.ParseIP("198.51.100.2")}))
	lo := up(wh, "lo", "")
	up(wh, "uplink0", "198.51.100.2/24")
	for _, ip := range []string{"192.0.2.10", "192.0.2.11", "192.0.2.12", "192.0.2.20", "192.0.2.21", "192.0.2.53"} {
		a, _ := netlink.ParseAddr(ip + "/32")
		must(wh.AddrAdd(lo, a))
	}
	// The metadata server and the private host, each behind a veth of the
	// world, which routes to them (and they back to everyone through it).
	for i, side := range []struct {
		ns   netns.NsHandle
		addr string
	}{{fi.Meta, "169.254.169.254"}, {fi.Priv, "10.99.0.5"}} {
		worldIf, farIf := fmt.Sprintf("side%d", i), "uplink0"
		must(wh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: worldIf}, PeerName: farIf, PeerNamespace: netlink.NsFd(side.ns)}))
		fh, _ := netlink.NewHandleAt(side.ns)
		wl := up(wh, worldIf, fmt.Sprintf("203.0.113.%d/30", 1+4*i))
		up(fh, "lo", "")
		fl := up(fh, farIf, fmt.Sprintf("203.0.113.%d/30", 2+4*i))
		a, _ := netlink.ParseAddr(side.addr + "/32")
		must(fh.AddrAdd(fl, a))
		must(fh.RouteAdd(&netlink.Route{LinkIndex: fl.Attrs().Index, Gw: net.ParseIP(fmt.Sprintf("203.0.113.%d", 1+4*i))}))
		_, dst, _ := net.ParseCIDR(side.addr + "/32")
		must(wh.RouteAdd(&netlink.Route{LinkIndex: wl.Attrs().Index, Dst: dst, Gw: net.ParseIP(fmt.Sprintf("203.0.113.%d", 2+4*i))}))
		fh.Close()
	}
	// The world forwards between the host and the side namespaces.
	InNS(t, fi.World, func() { must(os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0)) })
	fi.serve(t)
	return fi
}

// gitServer is git's smart HTTP (git http-backend) over two bare
// repositories, acme/shop.git and acme/other.git, each with one commit,
// pushes allowed, every request behind basic auth.
func (fi *Internet) gitServer(t testing.TB) http.Handler {
	fi.GitRoot = t.TempDir()
	fi.GitUser, fi.GitPassword = "x-access-token", "gitREALpassword0"+strings.Repeat("x", 8)
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "HOME="+fi.GitRoot)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	for _, name := range []string{"shop", "other"} {
		src := filepath.Join(fi.GitRoot, "src-"+name)
		_ = os.MkdirAll(src, 0o755)
		run(src, "init", "-q", "-b", "main")
		_ = os.WriteFile(filepath.Join(src, "README"), []byte(name+"\n"), 0o644)
		_ = os.WriteFile(filepath.Join(src, "test.sh"), []byte("#!/bin/sh\necho tests of "+name+" pass\n"), 0o755)
		run(src, "add", ".")
		run(src, "commit", "-q", "-m", "first commit of "+name)
		bare := filepath.Join(fi.GitRoot, "acme", name+".git")
		run(fi.GitRoot, "clone", "-q", "--bare", src, bare)
		run(bare, "config", "http.receivepack", "true")
	}
	backend := &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend", Env: []string{"GIT_PROJECT_ROOT=" + fi.GitRoot, "GIT_HTTP_EXPORT_ALL=1"}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fi.saw(r, nil)
		if u, p, ok := r.BasicAuth(); !ok || u != fi.GitUser || p != fi.GitPassword {
			w.Header().Set("WWW-Authenticate", `Basic realm="git.test"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})
}

// Close stops the servers and drops both namespaces.
func (fi *Internet) Close() {
	for i := len(fi.closers) - 1; i >= 0; i-- {
		fi.closers[i]()
	}
	fi.Priv.Close()
	fi.Meta.Close()
	fi.World.Close()
	fi.Host.Close()
}

// serve starts the world's servers: HTTP and HTTPS for allowed.test and
// evil.test, the metadata and private hosts, a raw TCP port, and DNS.
func (fi *Internet) serve(t testing.TB) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock test CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	fi.CAFile = filepath.Join(t.TempDir(), "ca.pem")
	_ = os.WriteFile(fi.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "test"}, DNSNames: []string{"allowed.test", "evil.test", "rebind.test", "meta.test", "api.test", "git.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, _ := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	cert := tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}

	handler := func(who string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := r.Body.Read(make([]byte, 1))
			_ = n
			fmt.Fprintf(w, "hello from %s (Host %s)", who, r.Host)
		})
	}
	listen := func(addr string, h http.Handler, useTLS bool) {
		var ln net.Listener
		var err error
		ns := fi.World
		switch {
		case strings.HasPrefix(addr, "169.254.169.254:"):
			ns = fi.Meta
		case strings.HasPrefix(addr, "10.99.0.5:"):
			ns = fi.Priv
		}
		InNS(t, ns, func() { ln, err = net.Listen("tcp", addr) })
		if err != nil {
			t.Fatal(err)
		}
		if useTLS {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		srv := &http.Server{Handler: h}
		go func() { _ = srv.Serve(ln) }()
		fi.closers = append(fi.closers, func() { srv.Close() })
	}
	for _, a := range []struct{ ip, who string }{{"192.0.2.10", "allowed"}, {"192.0.2.11", "evil"}, {"169.254.169.254", "METADATA"}, {"10.99.0.5", "PRIVATE"}} {
		listen(a.ip+":80", handler(a.who), false)
		listen(a.ip+":443", handler(a.who), true)
	}
	listen("192.0.2.10:2222", handler("raw-port"), false)
	// 100 MiB for throughput measurements.
	big := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(100<<20))
		buf := make([]byte, 1<<20)
		for i := 0; i < 100; i++ {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	})
	mux := http.NewServeMux()
	mux.Handle("/big", big)
	mux.Handle("/", handler("allowed-bench"))
	listen("192.0.2.12:80", mux, false)
	listen("10.99.0.5:8080", handler("private-raw"), false)
	// api.test records what it receives (a fake API behind a grant).
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		fi.saw(r, b)
		fmt.Fprintf(w, "api.test: %s %s\n", r.Method, r.URL.Path)
	})
	listen("192.0.2.20:443", api, true)
	listen("192.0.2.20:80", api, false)
	listen("192.0.2.21:443", fi.gitServer(t), true)
	listen("169.254.169.254:8080", handler("metadata-raw"), false)

	dnsHandler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		name := strings.TrimSuffix(q.Name, ".")
		ip, ok := Addrs[name]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN A %s", q.Name, ip))
			m.Answer = append(m.Answer, rr)
		case q.Qtype == dns.TypeTXT:
			rr, _ := dns.NewRR(q.Name + ` 60 IN TXT "exfiltration-channel"`)
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})
	var pc net.PacketConn
	var tl net.Listener
	var err error
	InNS(t, fi.World, func() {
		if pc, err = net.ListenPacket("udp", "192.0.2.53:53"); err == nil {
			tl, err = net.Listen("tcp", "192.0.2.53:53")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: dnsHandler}, {Listener: tl, Handler: dnsHandler}} {
		s := s
		go func() { _ = s.ActivateAndServe() }()
		fi.closers = append(fi.closers, func() { _ = s.Shutdown() })
	}
}
