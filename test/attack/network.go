package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Attacks on and measurements of the network: the agent's socket, the
// egress proxy, direct connections, DNS.

// agent: the agent's socket lives in a host directory (ARGS): it must
// be unreachable by path, and no other unix socket may lead to it.
func agent(args []string) {
	for _, p := range args {
		c, err := net.Dial("unix", p)
		if c != nil {
			c.Close()
		}
		expectErr("connect to "+p, err)
	}
	b, _ := os.ReadFile("/proc/net/unix")
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 8 {
			continue
		}
		name := f[7]
		if strings.HasPrefix(name, "@") {
			name = "\x00" + name[1:]
		}
		c, err := net.Dial("unix", name)
		if err == nil {
			c.Close()
			vulnerable("connected to unix socket %q", f[7])
		}
	}
	blocked("no unix socket reaches the agent")
}

// post URL SIZE: an upload through the proxy.
func post(args []string) {
	n, _ := strconv.Atoi(args[1])
	resp, err := http.Post(args[0], "application/octet-stream", strings.NewReader(strings.Repeat("x", n)))
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	fmt.Println("STATUS", resp.StatusCode, strings.TrimSpace(string(b)))
}

// front HOST SNI: a CONNECT tunnel to HOST through the explicit
// proxy, then a TLS handshake naming SNI (domain fronting).
func front(args []string) {
	pu, _ := url.Parse(os.Getenv("HTTPS_PROXY"))
	c, err := net.DialTimeout("tcp", pu.Host, 3*time.Second)
	if err != nil {
		vulnerable("no proxy: %v", err)
		return
	}
	fmt.Fprintf(c, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", args[0], args[0])
	br := bufio.NewReader(c)
	line, _ := br.ReadString('\n')
	for l := line; l != "\r\n" && l != ""; l, _ = br.ReadString('\n') {
	}
	tc := tls.Client(&bufConn{c, br}, &tls.Config{ServerName: args[1], InsecureSkipVerify: true})
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	err = tc.Handshake()
	c.Close()
	expectErr(fmt.Sprintf("TLS for %s through a tunnel to %s", args[1], args[0]), err)
}

// download URL: through the proxy; prints "BYTES n SECONDS s".
func download(args []string) {
	start := time.Now()
	resp, err := http.Get(args[0])
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Printf("BYTES %d SECONDS %.6f\n", n, time.Since(start).Seconds())
}

// getloop URL N: N small GETs on one kept-alive connection through
// the proxy; prints "MEDIAN_US m RPS r".
func getloop(args []string) {
	n, _ := strconv.Atoi(args[1])
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		resp, err := http.Get(args[0])
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	slices.Sort(lat)
	fmt.Printf("MEDIAN_US %d RPS %.0f\n", lat[len(lat)/2].Microseconds(), float64(n)/total.Seconds())
}

// tlsloop URL N CAFILE keepalive|fresh [ENVVAR]: N HTTPS GETs
// through the proxy, trusting CAFILE, on one kept-alive connection
// or a new one each, with "Authorization: Bearer $ENVVAR" when
// named; prints "MEDIAN_US m P99_US p RPS r".
func tlsloop(args []string) {
	n, _ := strconv.Atoi(args[1])
	pem, err := os.ReadFile(args[2])
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: args[3] == "fresh"}
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		req, _ := http.NewRequest("GET", args[0], nil)
		if len(args) > 4 {
			req.Header.Set("Authorization", "Bearer "+os.Getenv(args[4]))
		}
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fmt.Println("ERROR status", resp.StatusCode)
			return
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	slices.Sort(lat)
	fmt.Printf("MEDIAN_US %d P99_US %d RPS %.0f\n", lat[len(lat)/2].Microseconds(), lat[len(lat)*99/100].Microseconds(), float64(n)/total.Seconds())
}

// dial NETWORK ADDR: a direct connection, which must not succeed.
// GATEWAY in ADDR stands for the sandbox's resolver (the host end
// of its veth).
func dial(args []string) {
	addr := args[1]
	if strings.Contains(addr, "GATEWAY") {
		b, _ := os.ReadFile("/etc/resolv.conf")
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
				addr = strings.Replace(addr, "GATEWAY", f[1], 1)
			}
		}
	}
	c, err := net.DialTimeout(args[0], addr, 2*time.Second)
	if err == nil && args[0] == "udp" {
		_, _ = c.Write([]byte("x"))
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 16))
	}
	if c != nil {
		c.Close()
	}
	expectErr("direct "+args[0]+" to "+args[1], err)
}

// resolve NAME [SERVER]: prints the addresses or "ERROR".
func resolve(args []string) {
	r := net.DefaultResolver
	if len(args) > 1 {
		server := args[1]
		r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	ips, err := r.LookupHost(ctx, args[0])
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	fmt.Println("ADDRS", strings.Join(ips, " "))
}

// addrs prints every interface's addresses.
func addrs(_ []string) {
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		as, _ := i.Addrs()
		for _, a := range as {
			fmt.Println(i.Name, a.String())
		}
	}
}

// rawSocket: no raw or packet socket can be opened.
func rawSocket(_ []string) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if err == nil {
		unix.Close(fd)
	}
	expectErr("raw socket", err)
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err == nil {
		unix.Close(fd)
	}
	expectErr("packet socket", err)
}

// network: without a proxy, only lo exists and nothing is reachable.
func network(_ []string) {
	ifs, _ := net.Interfaces()
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	if len(ifs) != 1 || ifs[0].Name != "lo" {
		vulnerable("interfaces %v", names)
	} else {
		blocked("only interface is lo")
	}
	// TEST-NET-1: no route exists, so nothing is sent.
	c, err := net.DialTimeout("tcp", "192.0.2.1:80", 500*time.Millisecond)
	if c != nil {
		c.Close()
	}
	expectErr("connect 192.0.2.1:80", err)
}

// fetch URL CAFILE proxy|direct: prints "STATUS n body" or "ERROR e".
func fetch(u, caFile string, direct bool) {
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
	if direct {
		tr.Proxy = nil
	}
	if caFile != "-" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		fmt.Println("ERROR", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	fmt.Println("STATUS", resp.StatusCode, strings.TrimSpace(string(b)))
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }
