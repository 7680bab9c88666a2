package rootfs

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// hostEtcTemplate returns a directory holding etc/ with the sanitized copy
// of the host's /etc (HostEtc: world-readable files, directories and
// symlinks only), built once under dir and rebuilt when the host's entries
// change. Sandboxes mount it read-only (idmapped); nothing is copied per
// run. Freshness is checked against a manifest of the top-level entries and
// every directory (package managers replace files by rename, which changes
// the directory), so a run costs a few dozen stat calls, not a walk.
func hostEtcTemplate(dir string) (string, error) {
	if tmpl, ok := freshTemplate(dir); ok {
		return tmpl, nil
	}
	// One builder at a time, across processes: the daemon's concurrent
	// creates (and airlock run) wait for its template rather than each
	// copying /etc (0.4 s of CPU a copy; 8 at a daemon's start).
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("flock %s: %w", lock.Name(), err)
	}
	if tmpl, ok := freshTemplate(dir); ok {
		return tmpl, nil // built while this one waited
	}
	cur := filepath.Join(dir, "current")
	var entries []string
	var manifest strings.Builder
	manifest.WriteString(allowlistLine())
	for _, root := range HostEtc {
		if fi, err := os.Lstat(root); err == nil {
			manifest.WriteString(stamp(root, fi))
		} else {
			manifest.WriteString(root + "\x00absent\n")
		}
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			fi, err := d.Info()
			if err != nil || !visible(fi) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() && p != root {
				manifest.WriteString(stamp(p, fi))
			}
			entries = append(entries, p)
			return nil
		})
	}
	sum := sha256.Sum256([]byte(manifest.String()))
	digest := hex.EncodeToString(sum[:8])
	final := filepath.Join(dir, digest)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(final, ".manifest")); err != nil {
		tmp, err := os.MkdirTemp(dir, ".build-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(tmp)
		if err := os.Chmod(tmp, 0o755); err != nil {
			return "", err
		}
		for _, p := range entries {
			if err := copyEntry(p, filepath.Join(tmp, p)); err != nil {
				return "", fmt.Errorf("host /etc template: %w", err)
			}
		}
		if err := os.WriteFile(filepath.Join(tmp, ".manifest"), []byte(manifest.String()), 0o600); err != nil {
			return "", err
		}
		if err := os.Rename(tmp, final); err != nil {
			if _, serr := os.Stat(filepath.Join(final, ".manifest")); serr != nil {
				return "", err
			}
		}
	}
	// Point "current" at it atomically. Older templates stay until gc: a
	// sandbox started a moment ago may still be about to mount one.
	// The temporary link's name is this builder's own: concurrent creates
	// (the daemon's) may all be refreshing the template at once.
	if target, err := os.Readlink(cur); err == nil && target == digest {
		return final, nil
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	link := filepath.Join(dir, ".current-"+digest+"-"+hex.EncodeToString(rnd[:]))
	if err := os.Symlink(digest, link); err != nil {
		return "", err
	}
	if err := os.Rename(link, cur); err != nil {
		_ = os.Remove(link)
		return "", err
	}
	return final, nil
}

// freshTemplate is the template "current" names under dir, when its
// manifest says the host's entries are as they were.
func freshTemplate(dir string) (string, bool) {
	target, err := os.Readlink(filepath.Join(dir, "current"))
	if err != nil {
		return "", false
	}
	tmpl := filepath.Join(dir, target)
	m, err := os.ReadFile(filepath.Join(tmpl, ".manifest"))
	return tmpl, err == nil && manifestFresh(string(m))
}

func stamp(p string, fi os.FileInfo) string {
	return fmt.Sprintf("%s\x00%o\x00%d\x00%d\n", p, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
}

// allowlistLine heads a manifest: a template built from another HostEtc
// list is stale whatever the stamps say.
func allowlistLine() string { return "allow\x00" + strings.Join(HostEtc, "\x00") + "\n" }

// manifestFresh re-stats every entry a template's manifest recorded.
func manifestFresh(m string) bool {
	head, m, _ := strings.Cut(m, "\n")
	if head+"\n" != allowlistLine() {
		return false
	}
	for _, line := range strings.Split(strings.TrimSuffix(m, "\n"), "\n") {
		p, _, _ := strings.Cut(line, "\x00")
		fi, err := os.Lstat(p)
		if err != nil {
			if line != p+"\x00absent" {
				return false
			}
			continue
		}
		if stamp(p, fi) != line+"\n" {
			return false
		}
	}
	return true
}

// visible reports whether the sandbox's unprivileged users could read the
// entry on the host: world-readable files, world-searchable directories.
func visible(fi os.FileInfo) bool {
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return true
	case fi.IsDir():
		return fi.Mode().Perm()&0o005 == 0o005
	case fi.Mode().IsRegular():
		return fi.Mode().Perm()&0o004 != 0
	}
	return false
}

func copyEntry(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		l, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(l, dst)
	case fi.IsDir():
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		return os.Chmod(dst, fi.Mode().Perm())
	case fi.Mode().IsRegular():
		in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return nil
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm()&0o755)
		if err != nil {
			return err
		}
		defer out.Close()
		_, err = io.Copy(out, io.LimitReader(in, 64<<20))
		return err
	}
	return nil
}
