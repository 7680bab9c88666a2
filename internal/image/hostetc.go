package image

import (
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
// symlinks only), built once under dir/<digest> and rebuilt when the host's
// files change. Sandboxes mount it read-only (idmapped); nothing is copied
// per run.
func hostEtcTemplate(dir string) (string, error) {
	h := sha256.New()
	var entries []string
	for _, root := range HostEtc {
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
			fmt.Fprintf(h, "%s\x00%o\x00%d\x00%d\n", p, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
			entries = append(entries, p)
			return nil
		})
	}
	digest := hex.EncodeToString(h.Sum(nil))[:16]
	final := filepath.Join(dir, digest)
	if _, err := os.Stat(filepath.Join(final, ".complete")); err == nil {
		return final, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
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
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, ".complete")); serr == nil {
			return final, nil // a concurrent run built the same template
		}
		return "", err
	}
	// Older templates: remove, unless a running sandbox still... mounts keep
	// their own reference, so removal only drops the directory entries.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != digest && !strings.HasPrefix(e.Name(), ".build-") {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return final, nil
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
