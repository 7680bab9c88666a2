package remote

import (
	"archive/tar"
	"context"
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

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

func cpCmd(g *cmdutil.Globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files into or out of a sandbox (SANDBOX:PATH on one side)",
		Long: `cp copies a local file or directory into a directory of a sandbox, or a
file or directory under a sandbox's /workspace out into a local directory;
either way it keeps its base name.

  airlock cp ./src ID:/workspace          # -> /workspace/src
  airlock cp ID:/workspace/out ./results  # -> ./results/out

Out of a sandbox the files are read from the host side on the frozen
sandbox (no symlink followed, regular files and directories only), and
written here without following any symlink, so a hostile sandbox cannot
make cp write outside the local directory. A symlink is written only if
it cannot resolve outside the local directory (a relative target whose
".." components all come first and stay below it); others are skipped
and named. Files and directories keep their permission bits without
group or other write (as umask 022), never setuid or setgid. Names are
shown quoted when they hold control characters.`,
		Args: cobra.ExactArgs(2),
	}
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
		switch {
		case sremote == dremote:
			return errdefs.Invalid("cp needs SANDBOX:PATH on exactly one side")
		case dremote:
			if _, err := os.Lstat(src); err != nil {
				return localErr(err)
			}
			pr, pw := io.Pipe()
			type tarred struct {
				skipped []string
				err     error
			}
			done := make(chan tarred, 1)
			go func() {
				skipped, terr := tarLocal(src, pw)
				pw.CloseWithError(terr)
				done <- tarred{skipped, terr}
			}()
			remoteSkipped, uerr := cl.Upload(ctx, did, dpath, pr)
			pr.Close() // a writer still blocked on it returns
			local := <-done
			for _, s := range append(local.skipped, remoteSkipped...) {
				g.Warn("cp: skipped " + untrusted.Quote(s) + " (not a regular file or directory)")
			}
			if local.err != nil && !errors.Is(local.err, io.ErrClosedPipe) {
				return localErr(local.err) // the cause of whatever the upload then said
			}
			return cmdutil.APIErr(uerr)
		default:
			body, skipped, err := cl.Download(ctx, sid, spath)
			if err != nil {
				return cmdutil.APIErr(err)
			}
			defer body.Close()
			for _, s := range skipped {
				g.Warn("cp: skipped " + untrusted.QuoteText(s)) // the daemon's names come quoted, with why
			}
			links, err := extractTarFrom(dst, body, archiveBase(spath))
			for _, l := range links {
				g.Warn("cp: skipped " + l)
			}
			return err
		}
	})
}

// localErr is an error of this host's side of cp, said as such.
func localErr(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.New(errdefs.ErrNotFound, "cp: on this host: "+err.Error())
	}
	return fmt.Errorf("cp: on this host: %w", err)
}

// tarLocal writes src (a file or directory, under its base name) as tar.
func tarLocal(src string, w io.Writer) (skipped []string, err error) {
	src = filepath.Clean(src)
	base := filepath.Dir(src)
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(base, p)
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
		h.Name = filepath.ToSlash(rel)
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

// extractTar unpacks r into the existing directory dst. Every path is
// resolved inside dst by the kernel (openat2 RESOLVE_IN_ROOT) without
// following any symlink, so no entry, and no symlink an earlier entry
// made, can put a file outside dst; a symlink is made only if it
// cannot resolve outside dst (untrusted.LinkInside): the others are
// returned, described, in skipped; a hard link only to a regular file the
// archive itself wrote. Files and directories get the permission bits the
// archive records without group or other write (extractPerm).
func extractTar(dst string, r io.Reader) (skipped []string, err error) {
	return extractTarFrom(dst, r, "")
}

// extractPerm is what cp keeps of a mode a sandbox chose: the
// permission bits without group or other write (umask 022, whatever the
// user's umask), never setuid, setgid or sticky. A sandbox must not make
// the user's files writable by every user of the host.
const extractPerm = 0o755

// archiveBase is the directory a download of the sandbox path p names its
// entries under ("" for /workspace itself or a path right below it): the
// daemon names them by their path below /workspace, and cp keeps only
// the base name.
func archiveBase(p string) string {
	rel := strings.Trim(path.Clean("/"+strings.TrimPrefix(path.Clean(p), "/workspace")), "/")
	if d := path.Dir(rel); d != "." {
		return d
	}
	return ""
}

// extractTarFrom is extractTar of an archive whose entries are all under
// base ("": none), written without it.
func extractTarFrom(dst string, r io.Reader, base string) (skipped []string, err error) {
	root, err := os.Open(dst)
	if err != nil {
		return nil, errdefs.Invalid("cp: " + err.Error())
	}
	defer root.Close()
	if fi, err := root.Stat(); err != nil || !fi.IsDir() {
		return nil, errdefs.Invalid("cp: " + dst + " is not a directory")
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
		rel := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if base != "" {
			var ok bool
			if rel, ok = strings.CutPrefix(rel, base+"/"); !ok {
				skipped = append(skipped, fmt.Sprintf("%s (not under %s)", untrusted.Quote(h.Name), untrusted.Quote(base)))
				continue
			}
		}
		if rel == "" {
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
			target := strings.TrimPrefix(path.Clean("/"+h.Linkname), "/")
			inBase := true
			if base != "" {
				target, inBase = strings.CutPrefix(target, base+"/")
			}
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
