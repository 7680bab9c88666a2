// Package tartest builds tar streams entry by entry, for the tests of
// what reads a hostile archive on the host (image layers in
// internal/image/unpack, `airlock cp`'s extraction in internal/cli/remote);
// for tests only. It imports the standard library only.
package tartest

import (
	"archive/tar"
	"bytes"
	"testing"
)

// Entry is one member of a tar stream.
type Entry struct {
	Name, Link string
	Type       byte   // tar.TypeReg, tar.TypeDir, tar.TypeSymlink, ...
	Body       string // a regular file's content
	UID        int    // owner and group
	Mode       int64  // 0: 0644
}

// Tar is the tar stream of es, in order.
func Tar(t testing.TB, es ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		mode := e.Mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.Name, Linkname: e.Link, Typeflag: e.Type, Mode: mode, Uid: e.UID, Gid: e.UID}
		if e.Type == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.Type == tar.TypeReg {
			if _, err := tw.Write([]byte(e.Body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
