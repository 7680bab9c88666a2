// Package initexe finds and checks airlock-init (cmd/airlock-init), the
// binary both walls run inside a sandbox (its init and agent) and as the
// host's short-lived holder of a user namespace. It is installed beside
// airlock; a process finds it once, beside its own executable unless told
// another path (`--init PATH`), and uses it only if it is a root-owned
// regular file nobody else may write, of airlock's own version. Anything
// else fails the create that needs it, naming the path and the fix: there
// is no other binary to fall back to. It imports internal/errdefs,
// internal/version and x/sys only.
package initexe

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/version"
)

// Name is the binary's name, beside airlock.
const Name = "airlock-init"

// Default is airlock-init beside the running airlock's executable (the
// file it was started from, symlinks resolved).
func Default() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(self); err == nil {
		self = r
	}
	return filepath.Join(filepath.Dir(self), Name), nil
}

// Init is the airlock-init one airlock process runs, opened and checked
// once, by its first use.
type Init struct {
	path  string // as configured ("": Default)
	want  string // the version it must be
	known string // where answers to `version` are remembered ("": nowhere)

	once sync.Once
	bin  *Binary
	err  error
}

// New is the airlock-init at path ("": beside this executable); nothing
// is opened before the first Open. known ("": none) is a root-only
// directory where a binary's answer to `version` is remembered by the
// file's identity (device, inode, size, modification and change times),
// so that only the first airlock process to use a binary runs it to ask:
// that costs a Go process start (~5 ms of CPU), on every `airlock run`.
func New(path, known string) *Init { return &Init{path: path, want: version.Version, known: known} }

// Binary is an airlock-init that passed the checks, open: what was
// checked is what runs (it is run and copied from File, never by its
// path again).
type Binary struct {
	Path    string
	Version string
	File    *os.File // read-only; shared: read it with ReadAt, never Close it
}

// Open opens and checks the binary, once per Init.
func (i *Init) Open() (*Binary, error) {
	i.once.Do(func() {
		p := i.path
		if p == "" {
			var err error
			if p, err = Default(); err != nil {
				i.err = errdefs.Unavailable(fmt.Sprintf("%s: cannot find the airlock executable to look beside: %v; name it with --init PATH", Name, err))
				return
			}
		}
		i.bin, i.err = open(p, i.want, i.known)
	})
	return i.bin, i.err
}

// Path is where the binary is looked for.
func (i *Init) Path() string {
	if i.path != "" {
		return i.path
	}
	p, _ := Default()
	return p
}

// open opens the airlock-init at p and checks it is what a sandbox may run:
// a regular, executable file, root's, writable by root alone, that says
// (or said, as remembered under known) it is version want.
func open(p, want, known string) (*Binary, error) {
	fail := func(format string, a ...any) (*Binary, error) {
		return nil, errdefs.Unavailable(fmt.Sprintf("%s at %s: ", Name, p) + fmt.Sprintf(format, a...) +
			"; install it beside airlock as root (scripts/install.sh builds and installs both), or name another with --init PATH")
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("%v", errorsCause(err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return fail("fstat: %v", err)
	}
	why := ""
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		why = "not a regular file"
	case st.Uid != 0:
		why = fmt.Sprintf("owned by uid %d, not root", st.Uid)
	case st.Mode&0o022 != 0:
		why = fmt.Sprintf("writable by others than root (mode %o)", st.Mode&0o777)
	case st.Mode&0o100 == 0:
		why = fmt.Sprintf("not executable (mode %o)", st.Mode&0o777)
	}
	if why != "" {
		f.Close()
		return fail("%s", why)
	}
	mark := ""
	if known != "" {
		mark = filepath.Join(known, markName(&st, want))
		if rootsOnly(known) && rootsOnly(mark) {
			return &Binary{Path: p, Version: want, File: f}, nil
		}
	}
	got, err := versionOf(f)
	if err != nil {
		f.Close()
		return fail("%s version: %v", Name, err)
	}
	if got != want {
		f.Close()
		return fail("it is version %q, airlock is %q (the two must be one build)", got, want)
	}
	if mark != "" {
		remember(known, mark)
	}
	return &Binary{Path: p, Version: got, File: f}, nil
}

// rootsOnly reports whether p (not followed) is root's and neither group
// nor others may write it: a remembered answer is believed only then, or
// whoever could write there could make an old airlock-init pass.
func rootsOnly(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Uid == 0 && st.Mode&0o022 == 0
}

// markName names the answer want of the binary st is of: a change to the
// file (its content, owner or mode) or another file changes the name.
func markName(st *unix.Stat_t, want string) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%d:%d:%d:%d.%d:%d.%d:%s", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, want))
	return "ok-" + hex.EncodeToString(h[:12])
}

// remember records mark (in a root-only directory) and forgets every
// other answer: those of binaries no longer used. A failure only means
// the next process asks again.
func remember(dir, mark string) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "ok-") && e.Name() != filepath.Base(mark) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	if f, err := os.OpenFile(mark, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o400); err == nil {
		f.Close()
	}
}

// errorsCause drops the path an *os.PathError repeats.
func errorsCause(err error) error {
	if pe := (*os.PathError)(nil); errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// versionOf runs the opened binary f (not its path: what answers is what
// will run) with `version` and returns what it printed.
func versionOf(f *os.File) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/fd/3", "version")
	cmd.Args[0] = Name
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = []string{}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if s := strings.TrimSpace(stderr.String()); s != "" {
			return "", fmt.Errorf("%w: %s", err, s)
		}
		return "", err
	}
	v, _, _ := strings.Cut(string(out), "\n")
	return v, nil
}
