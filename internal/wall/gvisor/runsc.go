package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
	return CheckCached(path, "")
}

// CheckCached is Check remembering, in the file cache (root's alone; ""
// for none), the identity of the last runsc found at the pinned version:
// the device, inode, size, modification and change times of the file. A
// runsc with that identity is not run again (runsc --version, a 32 MB Go
// binary, costs tens of milliseconds of every create); one replaced or
// written since (another inode, or a later change time, which no one can
// set back) is checked again. (The stat that names it asks for the change
// time, so that since Linux 6.13 the next write gets a later one even
// within the same clock tick; before that, two writes by root within one
// tick around the check keep the times.)
func CheckCached(path, cache string) Runsc {
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
	id := identity(&st)
	if cache != "" && checked(cache, id) {
		r.Version = Pinned
		return r
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
	if cache != "" {
		remember(cache, id)
	}
	return r
}

// identity is what names one content of a runsc file: its device and
// inode, size, and modification and change times, with the pinned version
// it was checked for.
func identity(st *unix.Stat_t) string {
	return fmt.Sprintf("runsc %s dev=%d ino=%d size=%d mtime=%d.%09d ctime=%d.%09d\n",
		Pinned, st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
}

// checked reports whether cache, a regular file of root's that no one
// else may read or write, says id.
func checked(cache, id string) bool {
	fd, err := unix.Open(cache, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), cache)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Mode&0o077 != 0 {
		return false
	}
	b := make([]byte, len(id)+1)
	n, _ := io.ReadFull(f, b)
	return string(b[:n]) == id
}

// remember writes id to cache (whole, by a rename: a reader sees the old
// content or the new). A cache that cannot be written only costs the
// next check its run of runsc.
func remember(cache, id string) {
	tmp, err := os.CreateTemp(filepath.Dir(cache), ".runsc-checked-")
	if err != nil {
		return
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(id)
	if cerr := tmp.Close(); werr == nil && cerr == nil {
		_ = os.Rename(tmp.Name(), cache)
	}
}

// Describe is one line for airlock doctor.
func (r Runsc) Describe() string {
	if r.Err != nil {
		return r.Err.Error()
	}
	return fmt.Sprintf("runsc %s at %s", r.Version, r.Path)
}
