package envd

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/api/filesystem"
	"github.com/airlock-sandbox/airlock/api/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// statFake answers Stat and counts the calls that reached it.
type statFake struct {
	*fake
	calls int
}

func (f *statFake) Stat(_ context.Context, _ *tenant.Principal, _, p, _ string) (*api.FileEntry, error) {
	f.calls++
	return &api.FileEntry{Name: "x", Path: "/x", Type: "file"}, nil
}

// A Connect message larger than maxMessage is refused before the
// service sees it, gzip-compressed (a few KiB that inflate to more) or
// not: the daemon does not hold whatever a caller sends.
func TestConnectMessagesAreCapped(t *testing.T) {
	f := &statFake{fake: &fake{}}
	h := New(f)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithTarget(r.Context(), Target{Principal: &tenant.Principal{ID: "t"}, ID: "sb"})))
	}))
	defer srv.Close()
	for _, gz := range []bool{false, true} {
		opts := []connect.ClientOption{}
		if gz {
			opts = append(opts, connect.WithSendGzip())
		}
		cl := filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, opts...)
		_, err := cl.Stat(context.Background(), connect.NewRequest(&filesystem.StatRequest{Path: "/" + strings.Repeat("a", maxMessage)}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Errorf("gzip %v: a message over the cap: %v", gz, err)
		}
		if _, err := cl.Stat(context.Background(), connect.NewRequest(&filesystem.StatRequest{Path: "/x"})); err != nil {
			t.Errorf("gzip %v: a small message: %v", gz, err)
		}
	}
	if f.calls != 2 {
		t.Errorf("%d calls reached the service, want the 2 small ones", f.calls)
	}
}
