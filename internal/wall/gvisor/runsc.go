package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Pinned is the gvisor.dev/gvisor version this airlock runs: the one
// third_party/runsc/go.mod requires and scripts/runsc.sh builds (it stamps
// it into the binary as runsc's version).
const Pinned = "v0.0.0-20260213200628-444f74c20034"

// DefaultRunsc is where scripts/install.sh puts runsc.
const DefaultRunsc = "/usr/local/lib/airlock/runsc"

// Runsc is what was found at the configured path.
type Runsc struct {
	Path    string
	Version string // runsc's own report ("" when it could not be run)
	// Err says why this runsc cannot be used (nil: it can).
	Err error
}

// Check looks at the runsc at path: it must be a regular file owned by
// root that no one else may write (the daemon runs it as root), and report
// the pinned version. A wrong runsc is an error, never a fallback.
func Check(path string) Runsc {
	r := Runsc{Path: path}
	fail := func(format string, a ...any) Runsc {
		r.Err = errdefs.Unavailable(fmt.Sprintf("--isolation gvisor needs runsc %s at %s: ", Pinned, path) +
			fmt.Sprintf(format, a...) + "; build it with scripts/runsc.sh, or name another with --runsc")
		return r
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fail("%v", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fail("not a regular file")
	case st.Uid != 0:
		return fail("owned by uid %d, not root", st.Uid)
	case st.Mode&0o022 != 0:
		return fail("writable by others than root (mode %o)", st.Mode&0o777)
	case st.Mode&0o100 == 0:
		return fail("not executable")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return fail("runsc --version: %v", err)
	}
	first, _, _ := bytes.Cut(out, []byte("\n"))
	r.Version = strings.TrimPrefix(string(first), "runsc version ")
	if r.Version != Pinned {
		return fail("it is version %q", r.Version)
	}
	return r
}

// Describe is one line for airlock doctor.
func (r Runsc) Describe() string {
	if r.Err != nil {
		return r.Err.Error()
	}
	return fmt.Sprintf("runsc %s at %s", r.Version, r.Path)
}
