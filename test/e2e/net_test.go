package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/test/fakenet"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// airlock runs the binary inside the stand-in host, resolving through the
// world's DNS, with the world's servers (TEST-NET-1, a documentation range
// the guard blocks) opened by the operator's --egress-allow-net.
type fakeInternet struct {
	*fakenet.Internet
	env  []string // more environment for the airlock commands it runs
	wall string   // the --isolation of its runs ("": the default)
}

// onWalls runs an egress check once per wall (walls: the same checks,
// the same fake internet, each wall's own sandboxes), a subtest each; the
// gvisor wall needs runsc (needRunsc).
func onWalls(t *testing.T, f func(t *testing.T, wall string)) {
	for _, w := range walls {
		t.Run(w.name, func(t *testing.T) {
			if w.name == "gvisor" {
				needRunsc(t)
			}
			f(t, w.name)
		})
	}
}

var inNS = fakenet.InNS

func (fi *fakeInternet) airlock(t *testing.T, args ...string) result {
	t.Helper()
	if len(args) > 0 && args[0] == "run" {
		pre := []string{"run", "--dns-upstream", "192.0.2.53:53", "--egress-allow-net", "192.0.2.0/24"}
		if fi.wall != "" {
			pre = append(pre, "--isolation", fi.wall)
		}
		args = append(pre, args[1:]...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, airlockBin, append([]string{"--state-dir", stateDir, "--data-dir", dataDir}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if fi.env != nil {
		cmd.Env = append(os.Environ(), fi.env...)
	}
	var err error
	inNS(t, fi.Host, func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// sandbox runs the attack helper with ARGS in a proxy-mode sandbox that
// allows allow, with the test CA in its workspace.
func (fi *fakeInternet) sandbox(t *testing.T, allow []string, extra []string, args ...string) result {
	t.Helper()
	ws := workspace(t)
	ca, _ := os.ReadFile(fi.CAFile)
	_ = os.WriteFile(filepath.Join(ws, "ca.pem"), ca, 0o644)
	full := []string{"run", "--workspace", ws}
	for _, a := range allow {
		full = append(full, "--allow", a)
	}
	full = append(append(full, extra...), "--", "/workspace/attack")
	return fi.airlock(t, append(full, args...)...)
}

// residueIn lists airlock's links and nftables tables left in ns.
func residueIn(t *testing.T, ns netns.NsHandle) []string {
	var left []string
	h, _ := netlink.NewHandleAt(ns)
	defer h.Close()
	links, _ := h.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "alk") {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	inNS(t, ns, func() {
		c, err := nftables.New()
		if err != nil {
			return
		}
		tables, _ := c.ListTables()
		for _, tb := range tables {
			if strings.HasPrefix(tb.Name, "airlock") {
				left = append(left, "nft table "+tb.Name)
			}
		}
	})
	return left
}

// ca is the fake internet's CA inside a sandbox (fakeInternet.sandbox).
const ca = "/workspace/ca.pem"

// check fails the test unless the attack's output holds want and nothing
// it calls VULNERABLE.
func check(t *testing.T, r result, want string) {
	t.Helper()
	if !strings.Contains(r.stdout, want) || strings.Contains(r.stdout, "VULNERABLE") {
		t.Fatalf("want %q:\n%s", want, r)
	}
}

// TestEgress attacks the egress policy from inside sandboxes, against a
// fake internet of network namespaces, on every wall.
func TestEgress(t *testing.T) {
	fi := &fakeInternet{Internet: fakenet.New(t)}
	t.Run("the fake internet is live", func(t *testing.T) { egressTheFakeInternetIsLive(t, fi) })
	onWalls(t, func(t *testing.T, wall string) {
		on := *fi
		on.wall = wall
		egressChecks(t, &on)
	})
	// Veths go with their namespaces, which the kernel tears down
	// asynchronously: give it a moment.
	deadline := time.Now().Add(5 * time.Second)
	for left := residueIn(t, fi.Host); len(left) > 0; left = residueIn(t, fi.Host) {
		if time.Now().After(deadline) {
			t.Fatalf("left in the host namespace: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// egressChecks are TestEgress's checks on one wall.
func egressChecks(t *testing.T, fi *fakeInternet) {
	t.Run("allowed via explicit proxy, HTTP and HTTPS", func(t *testing.T) { egressAllowedViaExplicitProxyHTTPAndHTTPS(t, fi) })
	t.Run("allowed transparently, HTTP and HTTPS", func(t *testing.T) { egressAllowedTransparentlyHTTPAndHTTPS(t, fi) })
	t.Run("denied host gets 403 naming the rule", func(t *testing.T) { egressDeniedHostGets403NamingTheRule(t, fi) })
	t.Run("IP literals", func(t *testing.T) { egressIPLiterals(t, fi) })
	t.Run("DNS answers only allowed names", func(t *testing.T) { egressDNSAnswersOnlyAllowedNames(t, fi) })
	t.Run("DNS rebinding and metadata", func(t *testing.T) { egressDNSRebindingAndMetadata(t, fi) })
	t.Run("direct TCP and UDP go nowhere", func(t *testing.T) { egressDirectTCPAndUDPGoNowhere(t, fi) })
	t.Run("domain fronting and raw sockets", func(t *testing.T) { egressDomainFrontingAndRawSockets(t, fi) })
	t.Run("no IPv6", func(t *testing.T) { egressNoIPv6(t, fi) })
	t.Run("the host's services are out of reach", func(t *testing.T) { egressTheHostsServicesAreOutOfReach(t, fi) })
	t.Run("the host's own addresses are out of reach through the proxy", func(t *testing.T) { egressTheHostsOwnAddressesAreOutOfReachThroughTheProxy(t, fi) })
	t.Run("a host process cannot use a sandbox's proxy or DNS", func(t *testing.T) { egressAHostProcessCannotUseASandboxsProxyOrDNS(t, fi) })
	t.Run("bytes-out cap", func(t *testing.T) { egressBytesOutCap(t, fi) })
	t.Run("every attempt is logged", func(t *testing.T) { egressEveryAttemptIsLogged(t, fi) })
	t.Run("a key in a request body is a finding in the run's log", func(t *testing.T) { egressAKeyInARequestBodyIsAFindingInTheRunsLog(t, fi) })
	t.Run("policy file", func(t *testing.T) { egressPolicyFile(t, fi) })
	t.Run("other sandboxes are out of reach, and denied packets are counted", func(t *testing.T) { egressOtherSandboxesAreOutOfReachAndDeniedPacketsAreCounted(t, fi) })
}

func egressTheFakeInternetIsLive(t *testing.T, fi *fakeInternet) {
	// Straight from the stand-in host, without airlock, every target
	// answers: a blocked connection below means the policy held.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			inNS(t, fi.Host, func() { c, err = (&net.Dialer{}).DialContext(ctx, network, addr) })
			return c, err
		},
	}}
	for _, u := range []string{"http://192.0.2.10/", "http://192.0.2.11/", "http://169.254.169.254/", "http://10.99.0.5/", "http://10.99.0.5:8080/", "http://192.0.2.10:2222/"} {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatalf("%s unreachable from the stand-in host: %v", u, err)
		}
		resp.Body.Close()
	}
}

func egressAllowedViaExplicitProxyHTTPAndHTTPS(t *testing.T, fi *fakeInternet) {
	r := fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "http://allowed.test/x", "-", "proxy")
	check(t, r, "STATUS 200 hello from allowed (Host allowed.test)")
	r = fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "https://allowed.test/x", ca, "proxy")
	check(t, r, "STATUS 200 hello from allowed (Host allowed.test)")
	if !strings.Contains(r.stderr, "1 request allowed, 0 denied") {
		t.Errorf("summary: %s", r.stderr)
	}
}

func egressAllowedTransparentlyHTTPAndHTTPS(t *testing.T, fi *fakeInternet) {
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "http://allowed.test/", "-", "direct"), "STATUS 200 hello from allowed")
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "https://allowed.test/", ca, "direct"), "STATUS 200 hello from allowed")
}

func egressDeniedHostGets403NamingTheRule(t *testing.T, fi *fakeInternet) {
	r := fi.sandbox(t, []string{"allowed.test"}, []string{"--deny", "evil.test"}, "fetch", "http://evil.test/", "-", "proxy")
	check(t, r, `STATUS 403 airlock egress: evil.test:80 denied by rule "evil.test"`)
	r = fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "https://evil.test/", ca, "proxy")
	check(t, r, "ERROR")
	if strings.Contains(r.stdout, "hello from evil") || !strings.Contains(r.stderr, "denied (evil.test x1)") {
		t.Fatalf("%s", r)
	}
}

func egressIPLiterals(t *testing.T, fi *fakeInternet) {
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "http://192.0.2.11/", "-", "proxy"), "STATUS 403 airlock egress: 192.0.2.11:80 IP addresses are refused")
	// Straight at the address, ignoring the proxy: redirected, judged by Host.
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "http://192.0.2.11/", "-", "direct"), "STATUS 403")
	check(t, fi.sandbox(t, []string{"192.0.2.10"}, nil, "fetch", "http://192.0.2.10/", "-", "proxy"), "STATUS 200 hello from allowed")
}

func egressDNSAnswersOnlyAllowedNames(t *testing.T, fi *fakeInternet) {
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "resolve", "allowed.test"), "ADDRS 192.0.2.10")
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "resolve", "evil.test"), "ERROR")
	// Another resolver, directly: blocked like everything else.
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "resolve", "allowed.test", "192.0.2.53:53"), "ERROR")
}

func egressDNSRebindingAndMetadata(t *testing.T, fi *fakeInternet) {
	r := fi.sandbox(t, []string{"rebind.test", "meta.test"}, nil, "fetch", "http://rebind.test/", "-", "proxy")
	check(t, r, "STATUS 403 airlock egress: dial tcp 10.99.0.5:80: blocked destination: 10.99.0.5 is in 10.0.0.0/8")
	check(t, fi.sandbox(t, []string{"meta.test"}, nil, "fetch", "http://meta.test/", "-", "proxy"), "blocked destination: 169.254.169.254 is in 169.254.0.0/16")
	check(t, fi.sandbox(t, []string{"meta.test"}, nil, "fetch", "https://meta.test/", ca, "direct"), "ERROR")
	check(t, fi.sandbox(t, []string{"allowed.test"}, nil, "fetch", "http://169.254.169.254/", "-", "direct"), "STATUS 403")
}

func egressDirectTCPAndUDPGoNowhere(t *testing.T, fi *fakeInternet) {
	// Ports 80 and 443 are redirected to the proxy (and judged there);
	// everything else must not connect, though servers listen there.
	for _, a := range [][]string{{"tcp", "192.0.2.10:2222"}, {"tcp", "10.99.0.5:8080"}, {"tcp", "169.254.169.254:8080"}, {"udp", "192.0.2.53:53"}, {"tcp", "198.51.100.1:22"}} {
		r := fi.sandbox(t, []string{"allowed.test"}, nil, "dial", a[0], a[1])
		if r.code != 0 || strings.Contains(r.stdout, "VULNERABLE") {
			t.Fatalf("%v: %s", a, r)
		}
	}
}

func egressDomainFrontingAndRawSockets(t *testing.T, fi *fakeInternet) {
	for _, args := range [][]string{{"front", "allowed.test", "evil.test"}, {"raw-socket"}} {
		r := fi.sandbox(t, []string{"allowed.test"}, nil, args...)
		if r.code != 0 || strings.Contains(r.stdout, "VULNERABLE") {
			t.Fatalf("%v: %s", args, r)
		}
	}
}

func egressNoIPv6(t *testing.T, fi *fakeInternet) {
	r := fi.sandbox(t, []string{"allowed.test"}, nil, "addrs")
	if strings.Contains(r.stdout, ":") && strings.Contains(r.stdout, "/64") || strings.Contains(r.stdout, "::1") {
		t.Fatalf("IPv6 addresses inside:\n%s", r.stdout)
	}
}

func egressTheHostsServicesAreOutOfReach(t *testing.T, fi *fakeInternet) {
	var ln net.Listener
	inNS(t, fi.Host, func() { ln, _ = net.Listen("tcp", "0.0.0.0:9999") })
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// The proxy's own address on other ports, and loopback (the
	// sandbox's own).
	r := fi.sandbox(t, []string{"allowed.test"}, []string{"--json"}, "dial", "tcp", "127.0.0.1:9999")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	for _, host := range []string{"GATEWAY", "198.51.100.1"} {
		r := fi.sandbox(t, []string{"allowed.test"}, nil, "dial", "tcp", host+":9999")
		if r.code != 0 || strings.Contains(r.stdout, "VULNERABLE") {
			t.Fatalf("%s: %s", host, r)
		}
	}
}

func egressTheHostsOwnAddressesAreOutOfReachThroughTheProxy(t *testing.T, fi *fakeInternet) {
	// Host-only services on the stand-in host's uplink address (in
	// TEST-NET-2, opened below by the operator, so only the host rule
	// stands in the way) and on an address of an interface made for
	// the test (in TEST-NET-1, opened for every run here).
	h, _ := netlink.NewHandleAt(fi.Host)
	defer h.Close()
	extra := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hostonly0"}, PeerName: "hostonly1"}
	if err := h.LinkAdd(extra); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.LinkDel(extra) }()
	a, _ := netlink.ParseAddr("192.0.2.99/32")
	if err := h.AddrAdd(extra, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(extra); err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	for _, addr := range []string{"198.51.100.1:8080", "192.0.2.99:80"} {
		var ln net.Listener
		var err error
		inNS(t, fi.Host, func() { ln, err = net.Listen("tcp", addr) })
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			accepted.Add(1)
			_, _ = w.Write([]byte("VULNERABLE: a host-only service answered"))
		})}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	allow := []string{"198.51.100.1:8080", "192.0.2.99", "host.test:8080", "host.test"}
	opened := []string{"--egress-allow-net", "198.51.100.0/24"}
	for _, c := range [][]string{
		{"http://198.51.100.1:8080/", "proxy"},
		{"http://host.test:8080/", "proxy"},
		{"http://192.0.2.99/", "proxy"},
		{"http://192.0.2.99/", "direct"},
	} {
		r := fi.sandbox(t, allow, opened, "fetch", c[0], "-", c[1])
		check(t, r, "STATUS 403")
		if c[1] == "proxy" && !strings.Contains(r.stdout, "is an address of this host") {
			t.Errorf("%s: %s", c[0], r)
		}
	}
	// The forwarder gives no address of the host either.
	check(t, fi.sandbox(t, allow, opened, "resolve", "host.test"), "ERROR")
	if n := accepted.Load(); n != 0 {
		t.Fatalf("host-only services answered %d requests", n)
	}
}

// hostVethAddr waits (10 s at most) for a sandbox's veth to come up in the
// stand-in host and returns the host side's address ("" if none came).
func hostVethAddr(t *testing.T, fi *fakeInternet) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		h, _ := netlink.NewHandleAt(fi.Host)
		links, _ := h.LinkList()
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "alk") {
				if addrs, _ := h.AddrList(l, netlink.FAMILY_V4); len(addrs) == 1 {
					h.Close()
					return addrs[0].IP.String()
				}
			}
		}
		h.Close()
	}
	return ""
}

func egressAHostProcessCannotUseASandboxsProxyOrDNS(t *testing.T, fi *fakeInternet) {
	log := filepath.Join(t.TempDir(), "net.jsonl")
	ch := make(chan result, 1)
	go func() {
		ch <- fi.airlock(t, "run", "--allow", "allowed.test", "--net-log", log, "--", "sleep", "4")
	}()
	gw := hostVethAddr(t, fi)
	if gw == "" {
		t.Fatal("the sandbox did not come up")
	}
	time.Sleep(500 * time.Millisecond) // its proxy listening
	inNS(t, fi.Host, func() {
		for _, port := range []string{"3128", "3129", "3130", "53"} {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(gw, port), 2*time.Second)
			if err != nil {
				continue // refused: the listener is bound to the veth
			}
			fmt.Fprintf(c, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			b, _ := io.ReadAll(c)
			c.Close()
			if len(b) > 0 {
				t.Errorf("port %s answered a host process: %q", port, b)
			}
		}
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		if r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, net.JoinHostPort(gw, "53")); err == nil {
			t.Errorf("DNS answered a host process: %v", r)
		}
	})
	r := <-ch
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	if b, _ := os.ReadFile(log); len(bytes.TrimSpace(b)) != 0 {
		t.Errorf("a host process's traffic recorded as the sandbox's:\n%s", b)
	}
}

func egressBytesOutCap(t *testing.T, fi *fakeInternet) {
	r := fi.sandbox(t, []string{"allowed.test"}, []string{"--egress-bytes", "64K"}, "post", "http://allowed.test/up", "200000")
	if strings.Contains(r.stdout, "STATUS 200") || !strings.Contains(r.stderr, "egress byte limit (64.0KiB) reached") && !strings.Contains(r.stderr, "egress byte limit (64KiB) reached") {
		t.Fatalf("%s", r)
	}
}

func egressEveryAttemptIsLogged(t *testing.T, fi *fakeInternet) {
	log := filepath.Join(t.TempDir(), "net.jsonl")
	ws := workspace(t)
	r := fi.airlock(t, "run", "--workspace", ws, "--allow", "allowed.test", "--net-log", log, "--json", "--", "sh", "-c",
		"/workspace/attack fetch http://allowed.test/a - proxy; /workspace/attack fetch http://evil.test/b - proxy; /workspace/attack fetch http://169.254.169.254/ - direct")
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	b, _ := os.ReadFile(log)
	// An event is written once its request is done: a request that was
	// relayed can end after the next one was refused, so the events are
	// looked up by host, not by their order in the log.
	events := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if e["kind"] != "dns" {
			events[fmt.Sprint(e["host"])] = e
		}
	}
	allowed, evil, metadata := events["allowed.test"], events["evil.test"], events["169.254.169.254"]
	if len(events) != 3 || allowed["decision"] != "allowed" || allowed["path"] != "/a" || evil["decision"] != "denied" || metadata["decision"] != "denied" {
		t.Fatalf("events: %v", events)
	}
	if !strings.Contains(r.stderr, "1 request allowed, 2 denied") {
		t.Fatalf("summary: %s", r.stderr)
	}
	if j := lastJSON(t, r.stdout); j.SandboxID != allowed["sandbox"] {
		t.Errorf("the events are of sandbox %v, the run's is %s", allowed["sandbox"], j.SandboxID)
	}
}

// Regression (issue 13): `run --scan record` wrote no secret.finding
// for what its proxy found in a request; the daemon's log had one.
func egressAKeyInARequestBodyIsAFindingInTheRunsLog(t *testing.T, fi *fakeInternet) {
	const key = "AKIAQ4ZT6WX2LR7NPJ3V"
	logFile := filepath.Join(t.TempDir(), "run.audit")
	r := fi.airlock(t, "run", "--allow", "allowed.test", "--scan", "record", "--audit", logFile, "-e", "K="+key, "--", "python3", "-c",
		"import os, urllib.request as u; print(u.urlopen(u.Request('http://allowed.test/', data=('key=' + os.environ['K']).encode())).status)")
	if r.code != 0 || !strings.Contains(r.stdout, "200") {
		t.Fatalf("%s", r)
	}
	b, _ := os.ReadFile(logFile)
	if !regexp.MustCompile(`"kind":"secret.finding"[^\n]*"call":"egress"[^\n]*"where":"body"`).Match(b) {
		t.Errorf("no egress finding in the run's log:\n%s", b)
	}
	if strings.Contains(string(b), key) {
		t.Error("the run's log holds the key")
	}
}

func egressPolicyFile(t *testing.T, fi *fakeInternet) {
	pf := filepath.Join(t.TempDir(), "policy.yaml")
	_ = os.WriteFile(pf, []byte("allow:\n  - \"*.test\"\ndeny:\n  - evil.test\n"), 0o644)
	check(t, fi.sandbox(t, nil, []string{"--policy", pf}, "fetch", "http://allowed.test/", "-", "proxy"), "STATUS 200")
	check(t, fi.sandbox(t, nil, []string{"--policy", pf}, "fetch", "http://evil.test/", "-", "proxy"), "STATUS 403")
	_ = os.WriteFile(pf, []byte("allow: [a.test]\nallwo: [b.test]\n"), 0o644)
	if r := fi.sandbox(t, nil, []string{"--policy", pf}, "whoami"); r.code != 125 || !strings.Contains(r.stderr, "allwo") {
		t.Fatalf("unknown field accepted: %s", r)
	}
}

func egressOtherSandboxesAreOutOfReachAndDeniedPacketsAreCounted(t *testing.T, fi *fakeInternet) {
	// A listens on its own address; B is told where and must not reach it.
	type out struct{ r result }
	ch := make(chan out, 1)
	go func() {
		ch <- out{fi.airlock(t, "run", "--allow", "allowed.test", "--", "python3", "-c",
			"import socket,time; s=socket.socket(); s.bind(('0.0.0.0',7000)); s.listen(); s.settimeout(15)\ntry: s.accept(); print('ACCEPTED')\nexcept Exception: print('nobody came')")}
	}()
	var peer string
	if gw := net.ParseIP(hostVethAddr(t, fi)).To4(); gw != nil {
		peer = net.IPv4(gw[0], gw[1], gw[2], gw[3]+1).String() // the sandbox's side of the /30
	}
	if peer == "" {
		t.Fatal("sandbox A did not come up")
	}
	b := fi.sandbox(t, []string{"allowed.test"}, []string{"--json"}, "dial", "tcp", peer+":7000")
	// Through B's proxy, with a rule naming A and all of 10/8 opened
	// by the operator: the subnet pool stays closed.
	viaProxy := fi.sandbox(t, []string{peer + ":7000"}, []string{"--egress-allow-net", "10.0.0.0/8"}, "fetch", "http://"+peer+":7000/", "-", "proxy")
	a := (<-ch).r
	if b.code != 0 || strings.Contains(b.stdout, "VULNERABLE") || strings.Contains(a.stdout, "ACCEPTED") {
		t.Fatalf("A: %s\nB: %s\nB through its proxy: %s", a, b, viaProxy)
	}
	if !strings.Contains(viaProxy.stdout, "STATUS 403") || !strings.Contains(viaProxy.stdout, "subnet pool") {
		t.Fatalf("B through its proxy: %s", viaProxy)
	}
	var j struct {
		Egress struct {
			DeniedPackets int `json:"denied_packets"`
		} `json:"egress"`
	}
	i := strings.LastIndex(b.stdout, "{\n  \"sandbox_id\"")
	if err := json.Unmarshal([]byte(b.stdout[i:]), &j); err != nil || j.Egress.DeniedPackets == 0 {
		t.Fatalf("denied packets not counted: %v %s", err, b.stdout)
	}
}

// A gvisor sandbox's host-side table outlives a run that was killed (it
// never closed its network); once the sandbox's veth is gone with its
// namespace, gc deletes it.
func TestGVisorKilledRunsHostSideRulesAreReaped(t *testing.T) {
	needRunsc(t)
	defer noGVisorResidue(t)
	fi := &fakeInternet{Internet: fakenet.New(t)}
	cmd := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", dataDir, "run", "--isolation", "gvisor",
		"--dns-upstream", "192.0.2.53:53", "--allow", "allowed.test", "--", "sleep", "60")
	var err error
	inNS(t, fi.Host, func() { err = cmd.Start() })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	tables := func() (out []string) {
		for _, l := range residueIn(t, fi.Host) {
			if strings.HasPrefix(l, "nft table airlock-alk") {
				out = append(out, l)
			}
		}
		return out
	}
	for deadline := time.Now().Add(30 * time.Second); len(tables()) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox's host-side table never came")
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if len(tables()) == 0 {
		t.Fatal("the table went with the killed run: nothing to reap")
	}
	gc := func() {
		t.Helper()
		c := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", dataDir, "gc")
		var out []byte
		inNS(t, fi.Host, func() { out, err = c.CombinedOutput() })
		if err != nil {
			t.Fatalf("gc: %v\n%s", err, out)
		}
	}
	gc() // ends what is left of the sandbox: its namespace goes, and its veth
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		links := 0
		for _, l := range residueIn(t, fi.Host) {
			if strings.HasPrefix(l, "link ") {
				links++
			}
		}
		if links == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox's veth outlived gc")
		}
	}
	gc()
	if left := tables(); len(left) != 0 {
		t.Fatalf("after gc: %v", left)
	}
}
