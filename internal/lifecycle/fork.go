package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// RemoveCheckpoint deletes snapshot id's memory checkpoint (memory/) and
// keeps its files: a fork's checkpoint, once every copy is restored from
// it. A restored sandbox holds what it read of the image open; nothing
// reads it after.
func (l *Lifecycle) RemoveCheckpoint(id string) error {
	if !snapshotID().MatchString(id) {
		return errdefs.Invalid(fmt.Sprintf("snapshot id %q", id))
	}
	return os.RemoveAll(filepath.Join(snapshotDir(l.cfg.DataDir, id), snapshotMemory))
}
