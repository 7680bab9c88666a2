package cmdutil

import (
	"fmt"
	"github.com/spf13/pflag"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// AbsPath is p made absolute ("" stays "").
func AbsPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return a, nil
}

// HostPaths makes the host paths of a sandbox's description absolute, as
// the user meant them from the directory they typed them in: the daemon
// (or the engine) resolves nothing against a client's working directory.
// An image is a path when it starts with "/" or "." or follows oci: or
// docker-archive:; any other image is a name ("host", a registry
// reference, snapshot:ID) and is left alone.
func HostPaths(workspace, repo, image *string) error {
	var err error
	if *workspace, err = AbsPath(*workspace); err != nil {
		return err
	}
	if *repo, err = AbsPath(*repo); err != nil {
		return err
	}
	img := *image
	for _, scheme := range []string{"oci:", "docker-archive:", ""} {
		rest, ok := strings.CutPrefix(img, scheme)
		if !ok || scheme == "" && !strings.HasPrefix(rest, "/") && !strings.HasPrefix(rest, ".") {
			continue
		}
		if rest == "" {
			return nil // refused where images are resolved, with the reason
		}
		abs, err := AbsPath(rest)
		if err != nil {
			return err
		}
		*image = scheme + abs
		return nil
	}
	return nil
}

// MisplacedFlag names the flag of fs that word is ("--cwd", "-u",
// "--env=A=1"), or "": a command's first word that is one of its own
// command's flags was meant for airlock, not for the sandbox.
func MisplacedFlag(fs *pflag.FlagSet, word string) string {
	name, _, _ := strings.Cut(word, "=")
	switch {
	case strings.HasPrefix(name, "--") && len(name) > 2 && fs.Lookup(name[2:]) != nil:
		return name
	case len(name) == 2 && name[0] == '-' && name[1] != '-' && fs.ShorthandLookup(name[1:]) != nil:
		return name
	}
	return ""
}

// ForTerminal is w, through untrusted.TerminalWriter when it is a
// terminal: what goes there holds a sandbox's file contents (a diff),
// whose controls and escape sequences could hide or rewrite the lines a
// person reviews. Anything else (a file, a pipe) gets the bytes as they
// are, a patch that applies.
func ForTerminal(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return untrusted.TerminalWriter(w)
	}
	return w
}

// KVMap parses repeated KEY=VALUE flags (nil for none).
func KVMap(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, errdefs.Invalid(fmt.Sprintf("%s %q: want KEY=VALUE", flag, kv))
		}
		m[k] = v
	}
	return m, nil
}

// SizeFlag parses the size flag --name ("": 0).
func SizeFlag(name, v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := spec.ParseSize(v)
	if err != nil {
		return 0, errdefs.Invalid("--" + name + ": " + err.Error())
	}
	return n, nil
}
