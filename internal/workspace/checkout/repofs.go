package checkout

import (
	"errors"
	"os"
	"path"
	"strings"

	"github.com/go-git/go-billy/v5"
	"golang.org/x/sys/unix"
)

// beneathFS is a read-only billy filesystem over a directory descriptor: a
// repository a tenant chose is read through it, so no link in it (a
// symlinked .git/objects) reaches past the directory, and an alternates
// file is never opened (FromRepoBeneath). Every open is openat2 with
// RESOLVE_BENEATH and RESOLVE_NO_MAGICLINKS from the root descriptor.
type beneathFS struct {
	root *os.File
	base string // a directory below root ("" for root itself)
}

var errReadOnly = errors.New("read-only: a repository is only read")

// alternatesFile is where a repository names other object stores; it is
// never opened for reading (FromRepoBeneath).
const alternatesFile = "objects/info/alternates"

var errAlternates = errors.New("a tenant repository's alternates are not read")

func (fs *beneathFS) rel(name string) string {
	p := path.Join(fs.base, strings.TrimPrefix(path.Clean("/"+name), "/"))
	if p == "" {
		return "."
	}
	return p
}

func (fs *beneathFS) open(name string, flags int) (*os.File, error) {
	rel := fs.rel(name)
	if flags&unix.O_PATH == 0 {
		if strings.HasSuffix("/"+rel, "/"+alternatesFile) {
			return nil, &os.PathError{Op: "open", Path: name, Err: errAlternates}
		}
		flags |= unix.O_NONBLOCK // a fifo cannot block us
	}
	fd, err := unix.Openat2(int(fs.root.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), path.Base(rel)), nil
}

// roFile is a billy.File on an open file, read-only.
type roFile struct {
	*os.File
	name string
}

func (f roFile) Name() string              { return f.name }
func (f roFile) Lock() error               { return nil }
func (f roFile) Unlock() error             { return nil }
func (f roFile) Write([]byte) (int, error) { return 0, errReadOnly }
func (f roFile) Truncate(int64) error      { return errReadOnly }

func (fs *beneathFS) Open(name string) (billy.File, error) {
	return fs.OpenFile(name, os.O_RDONLY, 0)
}

func (fs *beneathFS) OpenFile(name string, flag int, _ os.FileMode) (billy.File, error) {
	if flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND) != 0 {
		return nil, &os.PathError{Op: "open", Path: name, Err: errReadOnly}
	}
	f, err := fs.open(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	return roFile{f, name}, nil
}

func (fs *beneathFS) stat(name string, flags int) (os.FileInfo, error) {
	f, err := fs.open(name, unix.O_PATH|flags)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Stat()
}

func (fs *beneathFS) Stat(name string) (os.FileInfo, error)  { return fs.stat(name, 0) }
func (fs *beneathFS) Lstat(name string) (os.FileInfo, error) { return fs.stat(name, unix.O_NOFOLLOW) }

func (fs *beneathFS) ReadDir(name string) ([]os.FileInfo, error) {
	d, err := fs.open(name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make([]os.FileInfo, 0, len(names))
	for _, n := range names {
		if fi, err := fs.Lstat(path.Join(name, n)); err == nil {
			out = append(out, fi)
		}
	}
	return out, nil
}

func (fs *beneathFS) Readlink(name string) (string, error) {
	d, err := fs.open(path.Dir(path.Clean("/"+name)), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return "", err
	}
	defer d.Close()
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(int(d.Fd()), path.Base(name), buf)
	if err != nil {
		return "", &os.PathError{Op: "readlink", Path: name, Err: err}
	}
	return string(buf[:n]), nil
}

func (fs *beneathFS) Join(elem ...string) string { return path.Join(elem...) }
func (fs *beneathFS) Root() string               { return "/" + fs.base }

func (fs *beneathFS) Chroot(p string) (billy.Filesystem, error) {
	base := fs.rel(p)
	if base == "." {
		base = ""
	}
	return &beneathFS{root: fs.root, base: base}, nil
}

func (fs *beneathFS) Capabilities() billy.Capability {
	return billy.ReadCapability | billy.SeekCapability
}

func (fs *beneathFS) Create(name string) (billy.File, error) {
	return nil, &os.PathError{Op: "create", Path: name, Err: errReadOnly}
}
func (fs *beneathFS) Rename(from, _ string) error {
	return &os.PathError{Op: "rename", Path: from, Err: errReadOnly}
}
func (fs *beneathFS) Remove(name string) error {
	return &os.PathError{Op: "remove", Path: name, Err: errReadOnly}
}
func (fs *beneathFS) TempFile(dir, _ string) (billy.File, error) {
	return nil, &os.PathError{Op: "tempfile", Path: dir, Err: errReadOnly}
}
func (fs *beneathFS) MkdirAll(name string, _ os.FileMode) error {
	return &os.PathError{Op: "mkdir", Path: name, Err: errReadOnly}
}
func (fs *beneathFS) Symlink(_, link string) error {
	return &os.PathError{Op: "symlink", Path: link, Err: errReadOnly}
}
