package untrusted

import (
	"errors"
	"os"
	"path"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestLinkInside(t *testing.T) {
	for _, c := range []struct {
		rel, target string
		want        bool
	}{
		{"l", "README.md", true},
		{"lib", "usr/lib", true},
		{"d", ".", true},
		{"a/b/l", "../../x/y", true},
		{"a/b/l", "./../c", true},
		{"node_modules/.bin/tool", "../tool/bin/cli.js", true},
		{"l", "", false},
		{"l", "/etc/shadow", false},
		{"l", "..", false},
		{"a/l", "../..", false},
		{"a/b/l", "../../../x", false},
		// The chain: d -> . makes d/d/d/.. climb past the root.
		{"e", "d/d/d/d/d/d/d/d/../../../../../../../..", false},
		{"a/e", "d/..", false},
		{"a/e", "x/../y", false},
		{"../l", "x", false},
		{".", "x", false},
	} {
		if got := LinkInside(c.rel, c.target); got != c.want {
			t.Errorf("LinkInside(%q, %q) = %v, want %v", c.rel, c.target, got, c.want)
		}
	}
}

// FuzzLinkInsideNeverEscapes builds a tree of directories and the links
// LinkInside accepts, then asks the kernel to resolve every link with
// RESOLVE_BENEATH: none may climb out of the tree. Each line of the input
// is "path target".
func FuzzLinkInsideNeverEscapes(f *testing.F) {
	f.Add("d .\ne d/d/d/d/d/d/d/d/../../../../../../../..")
	f.Add("a/d ..\na/b/e ../d/..\nx a/d/../..")
	f.Add("a/b/l ../..\na/c ../a/b/l/a/b/l\nm a/c/..")
	f.Fuzz(func(t *testing.T, script string) {
		root := t.TempDir()
		rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(rfd)
		beneath := func(rel string, flags uint64) (int, error) {
			return unix.Openat2(rfd, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		}
		var links []string
		for i, line := range strings.Split(script, "\n") {
			if i >= 12 {
				break
			}
			rel, target, ok := strings.Cut(line, " ")
			rel = path.Clean(rel)
			if !ok || len(rel) > 64 || len(target) > 256 || !LinkInside(rel, target) {
				continue
			}
			// The link's directories are real directories, made here.
			dir, name := path.Split(rel)
			pfd, err := beneath(".", unix.O_PATH|unix.O_DIRECTORY)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range strings.Split(strings.TrimSuffix(dir, "/"), "/") {
				if c == "" {
					continue
				}
				_ = unix.Mkdirat(pfd, c, 0o755)
				nfd, err := unix.Openat2(pfd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
				unix.Close(pfd)
				if pfd = nfd; err != nil {
					pfd = -1
					break
				}
			}
			if pfd < 0 {
				continue // a link or a file is in the way
			}
			if unix.Symlinkat(target, pfd, name) == nil {
				links = append(links, rel)
			}
			unix.Close(pfd)
		}
		for _, rel := range links {
			// Follow every link (the final one and those on the way).
			fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS})
			if err == nil {
				unix.Close(fd)
			}
			if errors.Is(err, unix.EXDEV) {
				t.Fatalf("link %s escapes the tree (script %q)", rel, script)
			}
		}
		_ = os.RemoveAll(root)
	})
}
