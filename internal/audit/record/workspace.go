package record

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/workspace"
)

// Caps on what one record says of a workspace's changes. Reading them
// never holds up a destroy or the kill switch for long: the sandbox is
// killed first, and the reading stops at ReadTime, saying so.
const (
	MaxChanges = 1000
	maxUnread  = 100
	// MaxListedBytes caps the JSON of the paths one record lists, and a
	// quarter of it the names of what was not read: a sandbox chooses
	// them, 4 KiB each and six times that escaped, so 1000 of them would
	// be a record of tens of MiB, one per destroy or download.
	MaxListedBytes = 1 << 20
	MaxPatchBytes  = 1 << 20 // the patch stored beside the log
	ReadTime       = 5 * time.Second
)

// Changer is a sandbox whose workspace changes can be read
// (lifecycle.Sandbox).
type Changer interface {
	Changes(ctx context.Context, w io.Writer, maxPatch int64) (*workspace.Report, error)
}

// ReadWorkspace reads what changed in sb's /workspace for a record,
// within ReadTime, and keeps the patch (at most MaxPatchBytes) in
// patchDir as ID-HASH.patch ("": kept nowhere).
func ReadWorkspace(sb Changer, id, patchDir string) *Workspace {
	ctx, cancel := context.WithTimeout(context.Background(), ReadTime)
	defer cancel()
	patch := &cappedBuffer{max: MaxPatchBytes}
	rep, err := sb.Changes(ctx, patch, MaxPatchBytes)
	if err != nil {
		return &Workspace{Error: err.Error(), Paths: []workspace.Reported{}}
	}
	out := &Workspace{Changed: len(rep.Changes), Paths: rep.Changes, TruncatedWhy: rep.Truncated, Truncated: rep.Truncated != ""}
	if kept, left := Cap(rep.Changes, MaxChanges, MaxListedBytes); left > 0 {
		out.Paths, out.Truncated = kept, true
	}
	if out.Paths == nil {
		out.Paths = []workspace.Reported{}
	}
	if len(rep.Unread) > 0 {
		out.Unread = Names(rep.Unread)
	}
	if patch.buf.Len() > 0 && patchDir != "" {
		sum := sha256.Sum256(patch.buf.Bytes())
		name := id + "-" + hex.EncodeToString(sum[:8]) + ".patch"
		if err := os.MkdirAll(patchDir, 0o700); err == nil {
			if err := os.WriteFile(filepath.Join(patchDir, name), patch.buf.Bytes(), 0o600); err == nil {
				out.Patch = &Patch{File: name, SHA256: hex.EncodeToString(sum[:]), Bytes: patch.buf.Len(), Truncated: patch.cut}
			}
		}
	}
	return out
}

// cappedBuffer keeps the first max bytes written to it. Its only method is
// Write, so no shortcut (io.WriteString, io.Copy's ReadFrom) passes the
// cap.
type cappedBuffer struct {
	buf bytes.Buffer
	max int
	cut bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		c.cut = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

// Cap keeps the first entries of list, at most maxItems of them and
// maxBytes of their JSON, and says how many it left out.
func Cap[T any](list []T, maxItems, maxBytes int) (kept []T, left int) {
	size := 0
	for i, e := range list {
		b, _ := json.Marshal(e)
		if size += len(b) + 1; i == maxItems || size > maxBytes {
			return list[:i:i], len(list) - i
		}
	}
	return list, 0
}

// Names is a list of names a sandbox chose (what a reading left out) as a
// record holds it: capped (Cap), the last entry counting the rest.
func Names(names []string) []string {
	kept, left := Cap(names, maxUnread, MaxListedBytes/4)
	if left > 0 {
		kept = append(kept, fmt.Sprintf("… %d more", left))
	}
	return kept
}
