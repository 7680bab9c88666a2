package cmdutil

import (
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Regression (issue 14): a wrong --address and a missing local file of
// cp both said "the daemon is not running". Only a failed dial speaks of
// the daemon, naming where it was looked for; other errors stay theirs.
func TestAPIErrSaysWhyTheDaemonIsOutOfReach(t *testing.T) {
	dial := func(errno unix.Errno) error {
		return &url.Error{Op: "Get", URL: "http://unix/v1/sandboxes", Err: &net.OpError{Op: "dial", Net: "unix",
			Addr: &net.UnixAddr{Name: "/tmp/wrong.sock", Net: "unix"}, Err: os.NewSyscallError("connect", errno)}}
	}
	for errno, want := range map[unix.Errno]string{
		unix.ENOENT:       "no daemon socket at /tmp/wrong.sock",
		unix.ECONNREFUSED: "nothing accepts connections at /tmp/wrong.sock",
		unix.EACCES:       "/tmp/wrong.sock is not yours to open",
		unix.ETIMEDOUT:    "cannot reach the daemon at /tmp/wrong.sock",
	} {
		err := APIErr(dial(errno))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v", errno, err)
		}
	}
	if err := APIErr(dial(unix.ENOENT)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a missing socket is not unavailable: %v", err)
	}
	local := &os.PathError{Op: "open", Path: "results.tar", Err: unix.ENOENT}
	if err := APIErr(local); err != local || strings.Contains(err.Error(), "daemon") {
		t.Errorf("a local file's error became %v", err)
	}
}
