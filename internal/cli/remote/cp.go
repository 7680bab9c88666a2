package remote

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

func cpCmd(g *cmdutil.Globals) *cobra.Command {
	var progress bool
	c := &cobra.Command{
		Use:   "cp SRC DEST",
		Short: "Copy files into or out of a sandbox (SANDBOX:PATH on one side)",
		Long: `cp copies a file or directory between this host and a sandbox, either
way, as docker cp does:

  SRC a file:       DEST a directory: copied into it under SRC's name
                    DEST a file, or missing: written as DEST (its parent
                    must exist; a DEST ending in / must be a directory)
  SRC a directory:  DEST a directory: copied into it as DEST/SRC's name
                    DEST missing: made, holding SRC's contents
                    DEST a file: refused
  SRC ending /.:    the directory's contents, into DEST

  airlock cp ./src ID:/workspace            # -> /workspace/src
  airlock cp ./src/. ID:/workspace/app      # src's contents -> /workspace/app
  airlock cp ID:/workspace/out ./results    # -> ./results/out (or ./results
                                            #    itself, if it did not exist)
  airlock cp ID:/workspace/out/r.txt .      # -> ./r.txt
  airlock cp ID:/etc/hostname ./h           # a file anywhere in the sandbox

Sizes are not capped (the sandbox's disk bounds what goes in). Into a
sandbox, the copy is all or nothing: files are staged in a hidden
directory beside the destination and moved into place at the end; a copy
that fails midway (a full disk, a broken connection) changes nothing.
Only regular files and directories go in; anything else is skipped and
named.

Out of a sandbox, a directory is read from /workspace (or a path under
it) on the host side, on the frozen sandbox, with no symlink followed; a
file anywhere is read through the sandbox's agent. Directories elsewhere
in the sandbox are refused: copy them into /workspace first. Everything
is written here without following any symlink, so a hostile sandbox
cannot make cp write outside DEST; a file read through the agent is
written under a temporary name and renamed into place. A symlink is written only if it cannot
resolve outside DEST's directory (a relative target whose ".."
components all come first and stay below it); others are skipped and
named. Files and directories keep their permission bits without group or
other write (as umask 022), never setuid or setgid. Names are shown
quoted when they hold control characters.

Bytes copied are shown on stderr as the copy goes when it is a terminal,
or with --progress.`,
		Args: cobra.ExactArgs(2),
	}
	c.Flags().BoolVar(&progress, "progress", false, "show bytes copied on stderr (the default when stderr is a terminal)")
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, _ *cmdutil.Conn, args []string) error {
		src, dst := args[0], args[1]
		sid, spath, sremote := strings.Cut(src, ":")
		did, dpath, dremote := strings.Cut(dst, ":")
		if strings.HasPrefix(src, "/") || strings.HasPrefix(src, ".") {
			sremote = false
		}
		if strings.HasPrefix(dst, "/") || strings.HasPrefix(dst, ".") {
			dremote = false
		}
		m := newMeter(g.Stderr, progress)
		defer m.done()
		switch {
		case sremote == dremote:
			return errdefs.Invalid("cp needs SANDBOX:PATH on exactly one side")
		case dremote:
			return cpIn(ctx, g, cl, src, did, dpath, m)
		default:
			return cpOut(ctx, g, cl, sid, spath, dst, m)
		}
	})
}

// contentsOf is SRC ending in "/." (docker cp: the directory's contents,
// not the directory), and SRC without it.
func contentsOf(p string) (string, bool) {
	switch p {
	case ".":
		return ".", true
	case "/.":
		return "/", true
	}
	if d, ok := strings.CutSuffix(p, "/."); ok {
		return d, true
	}
	return p, false
}

// placeFor is where a copy goes, by docker cp's rules: the directory it
// goes into and the name it takes there ("" for a directory's contents
// into dir itself). destKind is "dir", "file" or "" (DEST is missing).
func placeFor(srcBase string, srcDir, contents bool, dest, destKind string) (dir, name string, err error) {
	switch {
	case destKind == "dir" && contents:
		return dest, "", nil
	case destKind == "dir":
		return dest, srcBase, nil
	case destKind != "" && srcDir:
		return "", "", errdefs.Invalid("cp: cannot copy a directory to " + untrusted.Quote(dest) + ", which is not a directory")
	case destKind == "" && !srcDir && strings.HasSuffix(dest, "/"):
		return "", "", errdefs.New(errdefs.ErrNotFound, "cp: no directory "+untrusted.Quote(dest))
	}
	d := path.Clean(dest) // on Linux, a local path's rules too
	return path.Dir(d), path.Base(d), nil
}

// cpIn copies a local file or directory into a sandbox.
func cpIn(ctx context.Context, g *cmdutil.Globals, cl *client.Client, src, id, dest string, m *meter) error {
	src, contents := contentsOf(src)
	fi, err := os.Stat(src)
	if err != nil {
		return localErr(err)
	}
	if contents && !fi.IsDir() {
		return errdefs.Invalid("cp: " + src + "/. : not a directory")
	}
	kind := ""
	st, err := cl.Stat(ctx, id, dest)
	switch {
	case err == nil:
		kind = "file"
		if st.Type == "dir" {
			kind = "dir"
		}
	case code(err) != api.CodeNotFound:
		return cmdutil.APIErr(err)
	default:
		// As docker cp: a missing DEST is made, its parent is not.
		// (The daemon's answer says whether the sandbox or the parent is
		// missing.)
		parent := path.Dir(path.Clean(dest))
		pst, err := cl.Stat(ctx, id, parent)
		if err != nil {
			return cmdutil.APIErr(err)
		}
		if pst.Type != "dir" {
			return errdefs.Invalid("cp: " + untrusted.Quote(parent) + " in the sandbox is not a directory")
		}
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return localErr(err)
	}
	dir, name, err := placeFor(filepath.Base(abs), fi.IsDir(), contents, dest, kind)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	type tarred struct {
		skipped []string
		err     error
	}
	done := make(chan tarred, 1)
	go func() {
		skipped, terr := tarLocal(src, name, pw)
		pw.CloseWithError(terr)
		done <- tarred{skipped, terr}
	}()
	remoteSkipped, uerr := cl.Upload(ctx, id, dir, m.reader(pr))
	pr.Close() // a writer still blocked on it returns
	local := <-done
	for _, s := range append(local.skipped, remoteSkipped...) {
		g.Warn("cp: skipped " + untrusted.Quote(s) + " (not a regular file or directory)")
	}
	if local.err != nil && !errors.Is(local.err, io.ErrClosedPipe) {
		return localErr(local.err) // the cause of whatever the upload then said
	}
	return cmdutil.APIErr(uerr)
}

// code is an API error's code ("" for another error).
func code(err error) api.Code {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// cpOut copies a sandbox's file or directory here.
func cpOut(ctx context.Context, g *cmdutil.Globals, cl *client.Client, id, spath, dst string, m *meter) error {
	spath, contents := contentsOf(spath)
	st, err := cl.Stat(ctx, id, spath)
	if err != nil {
		return cmdutil.APIErr(err)
	}
	srcDir := st.Type == "dir"
	if contents && !srcDir {
		return errdefs.Invalid("cp: " + untrusted.Quote(spath) + "/. : not a directory")
	}
	kind := ""
	switch fi, err := os.Stat(dst); {
	case err == nil && fi.IsDir():
		kind = "dir"
	case err == nil:
		kind = "file"
	case !errors.Is(err, fs.ErrNotExist):
		return localErr(err)
	default:
		parent := filepath.Dir(filepath.Clean(dst))
		if fi, err := os.Stat(parent); err != nil || !fi.IsDir() {
			return errdefs.New(errdefs.ErrNotFound, "cp: no directory "+untrusted.Quote(parent)+" on this host")
		}
	}
	dir, name, err := placeFor(path.Base(path.Clean("/"+st.Path)), srcDir, contents, dst, kind)
	if err != nil {
		return err
	}
	rel, inWorkspace := workspaceRel(st.Path)
	switch {
	case inWorkspace:
		body, skipped, err := cl.Download(ctx, id, st.Path)
		if err != nil {
			return cmdutil.APIErr(err)
		}
		defer body.Close()
		for _, s := range skipped {
			g.Warn("cp: skipped " + untrusted.QuoteText(s)) // the daemon's names come quoted, with why
		}
		links, err := extractTarAs(dir, m.reader(body), rel, name, srcDir)
		for _, l := range links {
			g.Warn("cp: skipped " + l)
		}
		return err
	case srcDir:
		return errdefs.Invalid("cp: " + untrusted.Quote(st.Path) + " is a directory outside /workspace: cp copies directories out of /workspace only (read from the host side); copy it there first (airlock exec " + id + " -- cp -r " + untrusted.Quote(st.Path) + " /workspace/)")
	}
	body, err := cl.OpenFile(ctx, id, st.Path, 0)
	if err != nil {
		return cmdutil.APIErr(err)
	}
	defer body.Close()
	return writeLocalFile(dir, name, m.reader(body), modeOf(st.Mode))
}

// workspaceRel is p's path below /workspace ("" for /workspace itself),
// and whether p is there at all.
func workspaceRel(p string) (string, bool) {
	p = path.Clean("/" + p)
	if p == "/workspace" {
		return "", true
	}
	rel, ok := strings.CutPrefix(p, "/workspace/")
	return rel, ok
}

// modeOf is the permission bits cp gives a file copied out whose mode
// the sandbox reported as mode (as ls shows it: -rwxr-xr-x): executable
// or not, by the owner's x.
func modeOf(mode string) uint32 {
	if len(mode) == 10 && mode[3] == 'x' {
		return 0o755
	}
	return 0o644
}

// writeLocalFile writes what r reads as dir/name, under a temporary
// name beside it renamed over it at the end (removed on any failure),
// never following a symlink at name.
func writeLocalFile(dir, name string, r io.Reader, mode uint32) error {
	root, err := os.Open(dir)
	if err != nil {
		return localErr(err)
	}
	defer root.Close()
	if name == "" || strings.Contains(name, "/") {
		return errdefs.Invalid("cp: bad name " + untrusted.Quote(name))
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".airlock-cp-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(int(root.Fd()), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode&extractPerm)
	if err != nil {
		return localErr(err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var st unix.Stat_t
		if unix.Fstatat(int(root.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = fmt.Errorf("cp: %s is a directory", untrusted.Quote(name))
		} else {
			err = unix.Renameat(int(root.Fd()), tmp, int(root.Fd()), name)
		}
	}
	if err != nil {
		_ = unix.Unlinkat(int(root.Fd()), tmp, 0)
		return err
	}
	return nil
}

// localErr is an error of this host's side of cp, said as such.
func localErr(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.New(errdefs.ErrNotFound, "cp: on this host: "+err.Error())
	}
	return fmt.Errorf("cp: on this host: %w", err)
}

// tarLocal writes src (a file or directory) as tar, named as ("": a
// directory's contents, without an entry for itself). A symlink src is
// followed; symlinks under it are skipped.
func tarLocal(src, as string, w io.Writer) (skipped []string, err error) {
	src, err = filepath.EvalSymlinks(src)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		name := path.Join(as, filepath.ToSlash(rel))
		if name == "." {
			return nil // the directory whose contents go
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() {
			skipped = append(skipped, p)
			return nil
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = name
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, fi.Size())
			return err
		}
		return nil
	})
	if err != nil {
		return skipped, err
	}
	return skipped, tw.Close()
}

// extractPerm is what cp keeps of a mode a sandbox chose: the
// permission bits without group or other write (umask 022, whatever the
// user's umask), never setuid, setgid or sticky. A sandbox must not make
// the user's files writable by every user of the host.
const extractPerm = 0o755

// extractTarAs unpacks a download of the sandbox path /workspace/from
// (the daemon names its entries by their path below /workspace) into the
// existing directory dst, as dst/as: the entry from becomes as, from/x
// becomes as/x; entries elsewhere are skipped. as "" writes from's
// contents into dst itself. A directory's as is made first when missing
// (a download of /workspace has no entry for itself).
//
// Every path is resolved inside dst by the kernel (openat2
// RESOLVE_IN_ROOT) without following any symlink, so no entry, and no
// symlink an earlier entry made, can put a file outside dst; a symlink is
// made only if it cannot resolve outside dst (untrusted.LinkInside): the
// others are returned, described, in skipped; a hard link only to a
// regular file the archive itself wrote. Files and directories get the
// permission bits the archive records without group or other write
// (extractPerm).
func extractTarAs(dst string, r io.Reader, from, as string, dir bool) (skipped []string, err error) {
	root, err := os.Open(dst)
	if err != nil {
		return nil, localErr(err)
	}
	defer root.Close()
	if fi, err := root.Stat(); err != nil || !fi.IsDir() {
		return nil, errdefs.Invalid("cp: " + dst + " is not a directory")
	}
	rename := func(name string) (string, bool) {
		name = strings.TrimPrefix(path.Clean("/"+name), "/")
		rest := name
		if from != "" {
			if name == from {
				rest = ""
			} else if r, ok := strings.CutPrefix(name, from+"/"); ok {
				rest = r
			} else {
				return "", false
			}
		}
		return path.Join(as, rest), true
	}
	if dir && as != "" {
		err := unix.Mkdirat(int(root.Fd()), as, 0o755)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("cp: %s: %w", untrusted.Quote(as), err)
		}
	}
	how := func(flags uint64) *unix.OpenHow {
		return &unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW, Mode: 0, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	}
	openParent := func(rel string) (int, string, error) {
		dir, name := path.Split(rel)
		dir = strings.TrimSuffix(dir, "/")
		if dir == "" {
			dir = "."
		}
		fd, err := unix.Openat2(int(root.Fd()), dir, how(unix.O_RDONLY|unix.O_DIRECTORY))
		return fd, name, err
	}
	tr := tar.NewReader(r)
	regular := map[string]bool{} // the files this archive wrote: what its hard links may name
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return skipped, nil
		}
		if err != nil {
			return skipped, fmt.Errorf("cp: bad archive: %w", err)
		}
		rel, ok := rename(h.Name)
		if !ok {
			skipped = append(skipped, fmt.Sprintf("%s (not under %s)", untrusted.Quote(h.Name), untrusted.Quote(from)))
			continue
		}
		if rel == "" || rel == "." {
			continue
		}
		if h.Typeflag == tar.TypeSymlink && !untrusted.LinkInside(rel, h.Linkname) {
			skipped = append(skipped, fmt.Sprintf("%s (symlink to %s: it could resolve outside %s)", untrusted.Quote(rel), untrusted.Quote(h.Linkname), dst))
			continue
		}
		pfd, name, err := openParent(rel)
		if err != nil {
			return skipped, fmt.Errorf("cp: %s: %w", untrusted.Quote(rel), err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = unix.Mkdirat(pfd, name, uint32(h.Mode&extractPerm)|0o700)
			if errors.Is(err, unix.EEXIST) {
				var st unix.Stat_t
				if unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
					err = nil
				}
			}
		case tar.TypeReg:
			o := how(unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC)
			o.Mode = uint64(h.Mode&extractPerm) | 0o600
			var fd int
			if fd, err = unix.Openat2(pfd, name, o); err == nil {
				f := os.NewFile(uintptr(fd), rel)
				_, err = io.CopyN(f, tr, h.Size)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err == nil {
				regular[rel] = true
			}
		case tar.TypeSymlink:
			err = unix.Symlinkat(h.Linkname, pfd, name)
		case tar.TypeLink:
			// A further link of a file shipped once: only to a file this
			// archive wrote, never following a symlink.
			target, inBase := rename(h.Linkname)
			if !inBase || !regular[target] {
				err = fmt.Errorf("a hard link to %s, which is not a file of this archive", untrusted.Quote(h.Linkname))
				break
			}
			var tfd int
			var tname string
			if tfd, tname, err = openParent(target); err == nil {
				err = unix.Linkat(tfd, tname, pfd, name, 0)
				unix.Close(tfd)
			}
		}
		unix.Close(pfd)
		if err != nil {
			return skipped, fmt.Errorf("cp: %s: %w", untrusted.Quote(rel), err)
		}
	}
}
