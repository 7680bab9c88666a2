package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// downloadSize is what one iteration of BenchmarkProxyDownload fetches.
const downloadSize = 64 << 20

// bigHandler serves downloadSize bytes with a Content-Length.
var bigHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", fmt.Sprint(downloadSize))
	buf := make([]byte, 1<<20)
	for i := 0; i < downloadSize/len(buf); i++ {
		if _, err := w.Write(buf); err != nil {
			return
		}
	}
})

// BenchmarkProxyDownload fetches downloadSize bytes through the proxy's
// plain HTTP path and through a CONNECT tunnel, each beside the same
// download made directly, on loopback: the proxy's own cost per byte.
func BenchmarkProxyDownload(b *testing.B) {
	plain := httptest.NewServer(bigHandler)
	b.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(bigHandler)
	b.Cleanup(secure.Close)
	_, pport, _ := net.SplitHostPort(plain.Listener.Addr().String())
	_, sport, _ := net.SplitHostPort(secure.Listener.Addr().String())
	startProxyWith(b, nil, "allowed.test:"+pport, "allowed.test:"+sport)
	proxyURL, _ := url.Parse("http://" + testListen + ":3128")
	toLoopback := func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, _ := net.SplitHostPort(addr)
		return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	tlsConf := &tls.Config{InsecureSkipVerify: true, ServerName: "allowed.test"}
	for _, c := range []struct {
		name string
		url  string
		tr   *http.Transport
	}{
		{"http/direct", "http://allowed.test:" + pport + "/big", &http.Transport{DialContext: toLoopback}},
		{"http/proxy", "http://allowed.test:" + pport + "/big", &http.Transport{Proxy: http.ProxyURL(proxyURL)}},
		{"connect/direct", "https://allowed.test:" + sport + "/big", &http.Transport{DialContext: toLoopback, TLSClientConfig: tlsConf}},
		{"connect/proxy", "https://allowed.test:" + sport + "/big", &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: tlsConf}},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: c.tr, Timeout: time.Minute}
			defer c.tr.CloseIdleConnections()
			b.SetBytes(downloadSize)
			cpu0 := cpuTime()
			for b.Loop() {
				resp, err := client.Get(c.url)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != downloadSize {
					b.Fatalf("%d bytes: %v", n, err)
				}
			}
			// CPU time, not wall time: what a byte costs the process
			// (server, proxy and client alike), which a loaded host
			// distorts far less than the rate.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/downloadSize, "cpu-ns/B")
		})
	}
}

// BenchmarkProxyFreshConnections makes small GETs through the proxy, each
// on a new connection to it (a client that does not keep connections).
func BenchmarkProxyFreshConnections(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	b.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	startProxyWith(b, nil, "allowed.test:"+port)
	proxyURL, _ := url.Parse("http://" + testListen + ":3128")
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true}}
	for b.Loop() {
		resp, err := client.Get("http://allowed.test:" + port + "/")
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
