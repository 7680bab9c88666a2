package system

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// AuditDir is where the daemon's audit log lives under a data directory.
func AuditDir(dataDir string) string { return filepath.Join(dataDir, "audit") }

// AuditKeyFile holds the audit log's ed25519 signing key.
func AuditKeyFile(dataDir string) string { return filepath.Join(dataDir, "audit.key") }

// AuditHeadMeta is the store key of the audit log's head, kept apart from
// the log.
const AuditHeadMeta = "audit_head"

// openAudit opens the daemon's audit log, keeping its head in the store.
func openAudit(ctx context.Context, dataDir string, db *store.Store, log *slog.Logger, exp *audit.Exporter) (*audit.Log, error) {
	key, err := audit.LoadOrCreateKey(AuditKeyFile(dataDir))
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	l, err := audit.Open(AuditDir(dataDir), key, audit.Options{Export: exp, OnHead: func(h audit.Head) {
		b, _ := json.Marshal(h)
		if err := db.SetMeta(context.WithoutCancel(ctx), AuditHeadMeta, string(b)); err != nil {
			log.Error("audit head", "err", err)
		}
	}})
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return l, nil
}

// RunStateDir is the user's state directory for airlock run and airlock
// mcp: their audit logs and key.
func RunStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "airlock")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".local", "state", "airlock")
}

// keyResult is a signing key, or why there is none.
type keyResult struct {
	key ed25519.PrivateKey
	err error
}

// loadRunKey reads the user's audit key for runs (made on first use), on
// a goroutine of its own.
func loadRunKey() <-chan keyResult {
	ch := make(chan keyResult, 1)
	go func() {
		k, err := audit.LoadOrCreateKey(filepath.Join(RunStateDir(), "audit.key"))
		ch <- keyResult{k, err}
	}()
	return ch
}

// openRunAudit starts a run's own audit log: path, or a new file under the
// user's state directory, signed with the user's key (loadRunKey's).
func openRunAudit(path string, key keyResult) (*audit.Log, string, error) {
	if path == "" {
		path = filepath.Join(RunStateDir(), "runs", time.Now().UTC().Format("20060102T150405.000000000Z")+".audit")
	}
	if key.err != nil {
		return nil, "", fmt.Errorf("audit key: %w", key.err)
	}
	l, err := audit.OpenFile(path, key.key, audit.Options{})
	if err != nil {
		return nil, "", errdefs.Invalid("--audit: " + err.Error())
	}
	return l, path, nil
}
