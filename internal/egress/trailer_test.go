package egress

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
)

// seeAll is an Inspector that intercepts nothing and records what it was
// shown of each request.
type seeAll struct {
	mu   sync.Mutex
	seen []string
}

func (s *seeAll) Intercepts(string, int) bool                  { return false }
func (s *seeAll) Certificate(string) (*tls.Certificate, error) { return nil, fmt.Errorf("none") }
func (s *seeAll) Redact([]string, []string) []eventlog.Finding { return nil }

func (s *seeAll) Inspect(in *Inspected) Verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, fmt.Sprint(in.Req.Header, string(in.Body)))
	return Verdict{}
}

// A request's trailers come after its body, past what the inspector is
// shown: a chunked request declaring "Trailer: X-Leak" carried a value
// (a placeholder, a pasted key) to the server that neither the scanner nor
// the placeholder stripping had read. Request trailers are not sent on.
func TestProxyDropsRequestTrailers(t *testing.T) {
	got := make(chan string, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- fmt.Sprintf("body=%d bytes trailer=%v", len(b), r.Trailer)
	}))
	t.Cleanup(up.Close)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	in := &seeAll{}
	startProxyWith(t, func(c *Config) { c.Inspector = in }, "allowed.test:"+port)
	leak := "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	// A body the inspector reads whole, and one past MaxInspectBody (the
	// rest streams, the trailers last).
	for _, n := range []int{3, MaxInspectBody + 10} {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).Dial("tcp", net.JoinHostPort(testListen, strconv.Itoa(PortExplicit)))
		if err != nil {
			t.Fatal(err)
		}
		target, host := "http://allowed.test:"+port+"/x", "allowed.test:"+port
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\nTrailer: X-Leak\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\nX-Leak: %s\r\n\r\n", target, host, n, strings.Repeat("a", n), leak)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, _ := io.ReadAll(c)
		c.Close()
		select {
		case s := <-got:
			if strings.Contains(s, leak) {
				t.Errorf("a request trailer the inspector never saw reached the server: %s", s)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the request did not arrive: %q", resp)
		}
	}
}
