package image

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/miekg/dns"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/progress"
)

// loopbackDNS is a resolver on loopback that answers every question with
// rcode: nothing is asked of any resolver off the machine.
func loopbackDNS(t *testing.T, rcode int) *net.Resolver {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(q, rcode)
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return resolverAt(pc.LocalAddr().String())
}

// resolverAt is a Go resolver that asks only addr.
func resolverAt(addr string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", addr)
	}}
}

// closedPort is an address on loopback where nothing listens.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentListener accepts connections and never answers on them.
func silentListener(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// dialTo dials addr whatever address the pull asks for.
func dialTo(addr string) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
}

// localRegistry is an in-memory registry on loopback holding acme/tool:1.
func localRegistry(t *testing.T) string {
	srv := httptest.NewServer(registry.New())
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/acme/tool:1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return host
}

// A failed pull says which of a registry's or the network's failures it
// was, in the class that gives it its exit code and API code, for the
// host's user and (summarised) for a tenant alike: not "not found" for a
// network that failed.
func TestPullFailuresAreToldApart(t *testing.T) {
	reg := localRegistry(t)
	deny, _ := fakeRegistry(t, http.StatusUnauthorized)
	forbid, _ := fakeRegistry(t, http.StatusForbidden)
	down, _ := fakeRegistry(t, http.StatusServiceUnavailable)
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	defer tlsSrv.Close()
	nx := &net.Dialer{Resolver: loopbackDNS(t, dns.RcodeNameError)}
	servfail := &net.Dialer{Resolver: resolverAt(closedPort(t))}
	silent := silentListener(t)
	refused := closedPort(t)
	cases := []struct {
		name     string
		ref      string
		dial     func(context.Context, string, string) (net.Conn, error)
		deadline time.Duration
		retried  bool // the pull retries (seconds): tried for a tenant only
		class    error
		says     string
	}{
		{"no such host", "registry.invalid/acme/tool:1", nx.DialContext, 0, false, errdefs.ErrNotFound, "does not exist (DNS"},
		{"resolver fails", "registry.invalid/acme/tool:1", servfail.DialContext, 0, true, errdefs.ErrUnavailable, "could not be looked up"},
		{"connection refused", refused + "/acme/tool:1", nil, 0, false, errdefs.ErrUnavailable, "refused the connection"},
		{"no answer", silent + "/acme/tool:1", nil, 300 * time.Millisecond, false, errdefs.ErrTimeout, "did not answer in time"},
		{"tls", "registry.example/acme/tool:1", dialTo(strings.TrimPrefix(tlsSrv.URL, "https://")), 0, false, errdefs.ErrUnavailable, "TLS handshake"},
		{"401", deny + "/acme/tool:1", nil, 0, false, errdefs.ErrPermissionDenied, "HTTP 401"},
		{"403", forbid + "/acme/tool:1", nil, 0, false, errdefs.ErrPermissionDenied, "HTTP 403"},
		{"503", down + "/acme/tool:1", nil, 0, true, errdefs.ErrUnavailable, "HTTP 503"},
		{"no such tag", reg + "/acme/tool:2", nil, 0, false, errdefs.ErrNotFound, "has no acme/tool:2 (HTTP 404, manifest unknown: no such tag)"},
		{"no such repository", reg + "/acme/tools:1", nil, 0, false, errdefs.ErrNotFound, "has no repository acme/tools (HTTP 404, name unknown)"},
	}
	for _, c := range cases {
		for _, tenants := range []bool{false, true} {
			if c.retried && !tenants {
				continue
			}
			r, err := name.ParseReference(c.ref)
			if err != nil {
				t.Fatal(err)
			}
			dial := c.dial
			if dial == nil {
				dial = (&net.Dialer{}).DialContext
			}
			s := tenantStore(t, dial, r.Context().RegistryStr())
			s.Tenants = tenants
			ctx := context.Background()
			if c.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.deadline)
				defer cancel()
			}
			_, err = s.Resolve(ctx, c.ref, nil)
			if !errors.Is(err, c.class) || err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("%s (tenants %v): %v, want %v saying %q", c.name, tenants, err, c.class, c.says)
				continue
			}
			if strings.Contains(err.Error(), remoteBody) {
				t.Errorf("%s (tenants %v): the registry's body reached the answer: %v", c.name, tenants, err)
			}
		}
	}
}

// Before a pull's first packet, its sink hears what is pulled and from
// where, in full: a typo is visible. Here the dial is refused in the
// process: nothing leaves the machine.
func TestPullSaysWhatAndWhere(t *testing.T) {
	s := tenantStore(t, func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	})
	s.Tenants = false
	var got []progress.Event
	ctx := progress.With(context.Background(), func(e progress.Event) { got = append(got, e) })
	_, err := s.Resolve(ctx, "pythn:3.12", nil)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a refused dial: %v", err)
	}
	if len(got) == 0 || got[0].Message != "pulling docker.io/library/pythn:3.12 (index.docker.io)" {
		t.Errorf("events %+v, want the first to say what is pulled from where", got)
	}
}

// A pull that fails as not found (or refused, as Docker Hub answers for a
// repository that does not exist) suggests the near miss of a well-known
// form, or for the host's user of an image in the cache; a tenant is
// never told what the shared cache holds.
func TestPullSuggestsNearMisses(t *testing.T) {
	for ref, want := range map[string]string{
		"pythn:3.12":               "python:3.12",
		"pyhton:3.12":              "python:3.12",
		"python:3.12-slm":          "python:3.12-slim",
		"library/ubunut:24.04":     "library/ubuntu:24.04",
		"ghcr.oi/acme/tool:1":      "ghcr.io/acme/tool:1",
		"node:22-bokworm":          "node:22-bookworm",
		"python:3.12":              "",
		"acme/pythn:1":             "",
		"registry.example/pythn:1": "",
	} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		got := tenantStore(t, nil).suggest(ref, r)
		if want == "" && got != "" || want != "" && got != " (did you mean "+want+"?)" {
			t.Errorf("%s: %q, want %q", ref, got, want)
		}
	}

	reg := localRegistry(t)
	s := tenantStore(t, (&net.Dialer{}).DialContext, reg)
	s.Tenants = false
	l, err := s.Resolve(context.Background(), reg+"/acme/tool:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Done()
	_, err = s.Resolve(context.Background(), reg+"/acme/tool:l", nil)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "did you mean "+reg+"/acme/tool:1, which is in the image cache?") {
		t.Errorf("a near miss of a cached image: %v", err)
	}
	s.Tenants = true
	_, err = s.Resolve(context.Background(), reg+"/acme/tool:l", nil)
	if !errors.Is(err, errdefs.ErrNotFound) || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("a tenant was told of the cache: %v", err)
	}
}
