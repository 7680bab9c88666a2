// Package store keeps the daemon's durable state in SQLite
// (modernc.org/sqlite, no cgo): tenants with their hashed keys, quotas and
// sealed secrets, and every sandbox the daemon made, so that a restarted daemon can adopt
// the live ones and a rebooted host can clean up the rest. It imports the
// standard library and the driver only.
//
// Everything a tenant owns (sandboxes, snapshots, secrets) is keyed by the
// tenant's id, made when the tenant is created and never issued again; the
// name is for people and may be reused after a delete.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite" // also registers the "sqlite" driver
)

// ErrNotFound: no such row.
var ErrNotFound = errors.New("not found")

// ErrExists: a row with that key already exists.
var ErrExists = errors.New("already exists")

// Store is the daemon's database.
type Store struct {
	db   *sql.DB
	puts puts
}

// puts are the sandbox records being written: PutSandbox calls that come
// while one is written wait and go in together, one transaction (a kill
// switch ending 1,000 sandboxes wrote 1,000 transactions, one after the
// other, through the one connection).
type puts struct {
	mu      sync.Mutex
	pending []*put
	writing bool
}

type put struct {
	rec  Sandbox
	done chan error
}

const schema = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenants (
	name TEXT PRIMARY KEY,
	key_hash TEXT NOT NULL UNIQUE,
	quotas TEXT NOT NULL,
	created INTEGER NOT NULL,
	cpu_period_start INTEGER NOT NULL DEFAULT 0,
	cpu_used_ns INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sandboxes (
	id TEXT PRIMARY KEY,
	tenant TEXT NOT NULL,
	state TEXT NOT NULL,
	spec TEXT NOT NULL,
	metadata TEXT NOT NULL,
	trigger_record TEXT NOT NULL,
	created INTEGER NOT NULL,
	expires INTEGER NOT NULL,
	idle_timeout_ms INTEGER NOT NULL,
	last_active INTEGER NOT NULL,
	init_pid INTEGER NOT NULL DEFAULT 0,
	ended INTEGER NOT NULL DEFAULT 0,
	end_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes (tenant, state);
CREATE TABLE IF NOT EXISTS snapshots (
	id TEXT NOT NULL,
	tenant TEXT NOT NULL,
	name TEXT NOT NULL,
	sandbox TEXT NOT NULL,
	base TEXT NOT NULL,
	has_root INTEGER NOT NULL,
	bytes INTEGER NOT NULL,
	created INTEGER NOT NULL,
	PRIMARY KEY (tenant, id)
);
CREATE TABLE IF NOT EXISTS tenant_ids (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	created INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pools (
	tenant TEXT NOT NULL,
	name TEXT NOT NULL,
	def TEXT NOT NULL,
	PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS secrets (
	tenant TEXT NOT NULL,
	name TEXT NOT NULL,
	version INTEGER NOT NULL,
	sealed BLOB NOT NULL,
	created INTEGER NOT NULL,
	updated INTEGER NOT NULL,
	PRIMARY KEY (tenant, name)
);
`

// migrations add what later versions need to a database an earlier one
// made (CREATE TABLE IF NOT EXISTS leaves an existing table as it was).
// fill, run in the same transaction as the new column, gives the rows an
// earlier version left their value.
var migrations = []struct{ table, column, def, fill string }{
	{"tenants", "scan_policy", "TEXT NOT NULL DEFAULT ''", ""},
	// A tenant made before ids existed keeps its name as its id: what it
	// owns was keyed by that name, and so were its audit records. Every id
	// ever issued is kept in tenant_ids, so none is issued twice.
	{"tenants", "id", "TEXT NOT NULL DEFAULT ''", `UPDATE tenants SET id = name;
		INSERT OR IGNORE INTO tenant_ids (id, name, created) SELECT id, name, created FROM tenants`},
	// A snapshot's id was its content's digest; it names its files.
	{"snapshots", "content", "TEXT NOT NULL DEFAULT ''", `UPDATE snapshots SET content = id`},
	// The sandbox's tenant column holds the tenant's id; its name is kept
	// for display.
	{"sandboxes", "tenant_name", "TEXT NOT NULL DEFAULT ''", `UPDATE sandboxes SET tenant_name = tenant`},
	{"tenants", "roots", "TEXT NOT NULL DEFAULT ''", ""},
	// The wall a tenant is held to ("": any).
	{"tenants", "isolation", "TEXT NOT NULL DEFAULT ''", ""},
	// The create's external id ("": none).
	{"sandboxes", "external_id", "TEXT NOT NULL DEFAULT ''", ""},
}

// indexes need the migrated columns.
const indexes = `CREATE UNIQUE INDEX IF NOT EXISTS tenants_id ON tenants (id);
CREATE INDEX IF NOT EXISTS snapshots_content ON snapshots (content);
CREATE INDEX IF NOT EXISTS sandboxes_external ON sandboxes (external_id);`

func migrate(db *sql.DB) error {
	for _, m := range migrations {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`, m.table, m.column).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		tx, err := db.Begin()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(`ALTER TABLE ` + m.table + ` ADD COLUMN ` + m.column + ` ` + m.def); err != nil {
			tx.Rollback()
			return err
		}
		if m.fill != "" {
			if _, err := tx.Exec(m.fill); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	_, err := db.Exec(indexes)
	return err
}

// Open opens (creating) the database at path, root-only.
func Open(path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serialises anyway
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: migrate: %w", path, err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		_ = os.Chmod(p, 0o600)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// HashKey is how API keys are stored: SHA-256 of a 256-bit random key
// (a slow hash adds nothing for keys of that strength).
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// Meta reads a daemon-wide value ("" when unset).
func (s *Store) Meta(ctx context.Context, key string) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

// SetMeta writes a daemon-wide value.
func (s *Store) SetMeta(ctx context.Context, key, value string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value`, key, value)
	return err
}

// Tenant is one customer. ID is what everything it owns is keyed by; Name
// is unique among the live tenants only.
type Tenant struct {
	ID             string
	Name           string
	KeyHash        string
	Quotas         string // JSON, owned by internal/sandbox
	Created        time.Time
	CPUPeriodStart time.Time
	CPUUsed        time.Duration
	ScanPolicy     string
	// Roots are the host directories the tenant may name paths under
	// (JSON, owned by internal/sandbox; "" for none).
	Roots string
	// Isolation is the wall the tenant's sandboxes must be on at least
	// ("": any).
	Isolation string
}

// CreateTenant adds a tenant under a new id (t.ID is ignored) and returns
// the id; ErrExists if the name or the key is taken.
func (s *Store) CreateTenant(ctx context.Context, t Tenant) (string, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	// An id is never issued twice: tenant_ids keeps every one, also of
	// deleted tenants.
	for {
		t.ID = newTenantID()
		_, err := tx.ExecContext(ctx, `INSERT INTO tenant_ids (id, name, created) VALUES (?, ?, ?)`, t.ID, t.Name, t.Created.UnixMilli())
		if err == nil {
			break
		}
		if !isConstraint(err) {
			return "", err
		}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO tenants (id, name, key_hash, quotas, created, cpu_period_start, cpu_used_ns, scan_policy, roots, isolation) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?)`,
		t.ID, t.Name, t.KeyHash, t.Quotas, t.Created.UnixMilli(), t.CPUPeriodStart.UnixMilli(), t.ScanPolicy, t.Roots, t.Isolation)
	if err != nil && isConstraint(err) {
		return "", fmt.Errorf("tenant %s: %w", t.Name, ErrExists)
	}
	if err != nil {
		return "", err
	}
	return t.ID, tx.Commit()
}

// newTenantID is 96 random bits. It has an underscore after a letter, so
// it is never mistaken for a sandbox or snapshot id.
func newTenantID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "t_" + hex.EncodeToString(b[:])
}

func scanTenant(sc interface{ Scan(...any) error }) (Tenant, error) {
	var t Tenant
	var created, start, used int64
	err := sc.Scan(&t.ID, &t.Name, &t.KeyHash, &t.Quotas, &created, &start, &used, &t.ScanPolicy, &t.Roots, &t.Isolation)
	t.Created, t.CPUPeriodStart, t.CPUUsed = time.UnixMilli(created), time.UnixMilli(start), time.Duration(used)
	return t, err
}

const tenantCols = `id, name, key_hash, quotas, created, cpu_period_start, cpu_used_ns, scan_policy, roots, isolation`

// TenantByKey finds the tenant whose key hashes to keyHash.
func (s *Store) TenantByKey(ctx context.Context, keyHash string) (Tenant, error) {
	t, err := scanTenant(s.db.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE key_hash = ?`, keyHash))
	if errors.Is(err, sql.ErrNoRows) {
		return t, ErrNotFound
	}
	return t, err
}

// TenantByName finds the live tenant called name.
func (s *Store) TenantByName(ctx context.Context, name string) (Tenant, error) {
	t, err := scanTenant(s.db.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return t, ErrNotFound
	}
	return t, err
}

// Pool is a tenant's pool as it was set: its definition (api.SetPool,
// as JSON), kept so that a restarted daemon refills it.
type Pool struct{ Tenant, Name, Def string }

// PutPool records pool p (replacing the tenant's pool of that name).
func (s *Store) PutPool(ctx context.Context, p Pool) error {
	_, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO pools (tenant, name, def) VALUES (?, ?, ?)`, p.Tenant, p.Name, p.Def)
	return err
}

// DeletePools removes tenant's pool name, or all its pools when name is
// "", or every tenant's when tenant is "" too.
func (s *Store) DeletePools(ctx context.Context, tenant, name string) error {
	var err error
	switch {
	case tenant == "":
		_, err = s.db.ExecContext(ctx, `DELETE FROM pools`)
	case name == "":
		_, err = s.db.ExecContext(ctx, `DELETE FROM pools WHERE tenant = ?`, tenant)
	default:
		_, err = s.db.ExecContext(ctx, `DELETE FROM pools WHERE tenant = ? AND name = ?`, tenant, name)
	}
	return err
}

// Pools lists every tenant's pools.
func (s *Store) Pools(ctx context.Context) ([]Pool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tenant, name, def FROM pools ORDER BY tenant, name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Pool
	for rows.Next() {
		var p Pool
		if err := rows.Scan(&p.Tenant, &p.Name, &p.Def); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// TenantByID finds the live tenant of id.
func (s *Store) TenantByID(ctx context.Context, id string) (Tenant, error) {
	t, err := scanTenant(s.db.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return t, ErrNotFound
	}
	return t, err
}

// Tenants lists every tenant by name.
func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+tenantCols+` FROM tenants ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteTenant removes tenant id with its secrets and its snapshots'
// records (its sandboxes' records stay as history), and returns the
// snapshot contents no tenant records any more (their files can go).
func (s *Store) DeleteTenant(ctx context.Context, id string) (freed []string, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if err := affected(tx.ExecContext(ctx, `DELETE FROM tenants WHERE id = ?`, id)); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ?`, id); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM pools WHERE tenant = ?`, id); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT DISTINCT content FROM snapshots WHERE tenant = ?`, id)
	if err != nil {
		return nil, err
	}
	var contents []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return nil, err
		}
		contents = append(contents, c)
	}
	rows.Close()
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE tenant = ?`, id); err != nil {
		return nil, err
	}
	for _, c := range contents {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE content = ?`, c).Scan(&n); err != nil {
			return nil, err
		}
		if n == 0 {
			freed = append(freed, c)
		}
	}
	return freed, tx.Commit()
}

// DeleteMeta removes a daemon-wide value.
func (s *Store) DeleteMeta(ctx context.Context, key string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM meta WHERE key = ?`, key)
	return err
}

// Secret is one tenant secret, sealed by internal/broker: the store never
// sees its value. Tenant is the tenant's id.
type Secret struct {
	Tenant, Name     string
	Version          int
	Sealed           []byte
	Created, Updated time.Time
}

// AddSecret stores a new secret (version 1); ErrExists if the name is
// taken.
func (s *Store) AddSecret(ctx context.Context, sec Secret) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO secrets (tenant, name, version, sealed, created, updated) VALUES (?, ?, ?, ?, ?, ?)`,
		sec.Tenant, sec.Name, sec.Version, sec.Sealed, sec.Created.UnixMilli(), sec.Updated.UnixMilli())
	if err != nil && isConstraint(err) {
		return fmt.Errorf("secret %s: %w", sec.Name, ErrExists)
	}
	return err
}

// RotateSecret replaces a secret's value if it is still at version from
// (sec.Version is the new one); ErrNotFound when it is gone or moved on.
func (s *Store) RotateSecret(ctx context.Context, sec Secret, from int) error {
	return affected(s.db.ExecContext(ctx, `UPDATE secrets SET version = ?, sealed = ?, updated = ? WHERE tenant = ? AND name = ? AND version = ?`,
		sec.Version, sec.Sealed, sec.Updated.UnixMilli(), sec.Tenant, sec.Name, from))
}

// GetSecret reads one secret; ErrNotFound if there is none.
func (s *Store) GetSecret(ctx context.Context, tenant, name string) (Secret, error) {
	sec := Secret{Tenant: tenant, Name: name}
	var created, updated int64
	err := s.db.QueryRowContext(ctx, `SELECT version, sealed, created, updated FROM secrets WHERE tenant = ? AND name = ?`, tenant, name).
		Scan(&sec.Version, &sec.Sealed, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return sec, ErrNotFound
	}
	sec.Created, sec.Updated = time.UnixMilli(created), time.UnixMilli(updated)
	return sec, err
}

// Secrets lists a tenant's secrets by name, without their sealed values.
func (s *Store) Secrets(ctx context.Context, tenant string) ([]Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, version, created, updated FROM secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		sec := Secret{Tenant: tenant}
		var created, updated int64
		if err := rows.Scan(&sec.Name, &sec.Version, &created, &updated); err != nil {
			return nil, err
		}
		sec.Created, sec.Updated = time.UnixMilli(created), time.UnixMilli(updated)
		out = append(out, sec)
	}
	return out, rows.Err()
}

// DeleteSecret removes a secret; ErrNotFound if there is none.
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	return affected(s.db.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ? AND name = ?`, tenant, name))
}

// UpdateTenant replaces tenant id's quotas and scan policy.
func (s *Store) UpdateTenant(ctx context.Context, id, quotas, scanPolicy string) error {
	return affected(s.db.ExecContext(ctx, `UPDATE tenants SET quotas = ?, scan_policy = ? WHERE id = ?`, quotas, scanPolicy, id))
}

// SetTenantRoots replaces the host directories tenant id may name paths
// under.
func (s *Store) SetTenantRoots(ctx context.Context, id, roots string) error {
	return affected(s.db.ExecContext(ctx, `UPDATE tenants SET roots = ? WHERE id = ?`, roots, id))
}

// SetTenantIsolation replaces the wall tenant id is held to.
func (s *Store) SetTenantIsolation(ctx context.Context, id, isolation string) error {
	return affected(s.db.ExecContext(ctx, `UPDATE tenants SET isolation = ? WHERE id = ?`, isolation, id))
}

// SetTenantKey replaces tenant id's key (its hash); ErrExists if another
// tenant has that key.
func (s *Store) SetTenantKey(ctx context.Context, id, keyHash string) error {
	err := affected(s.db.ExecContext(ctx, `UPDATE tenants SET key_hash = ? WHERE id = ?`, keyHash, id))
	if err != nil && isConstraint(err) {
		return fmt.Errorf("tenant key: %w", ErrExists)
	}
	return err
}

// SetTenantCPU records tenant id's CPU budget period and use in it.
func (s *Store) SetTenantCPU(ctx context.Context, id string, start time.Time, used time.Duration) error {
	_, err := s.db.ExecContext(ctx, `UPDATE tenants SET cpu_period_start = ?, cpu_used_ns = ? WHERE id = ?`, start.UnixMilli(), int64(used), id)
	return err
}

// Sandbox is one sandbox's record. Tenant is its tenant's id, TenantName
// the tenant's name when it was made.
type Sandbox struct {
	ID          string
	Tenant      string
	TenantName  string
	State       string
	Spec        string // JSON spec.Spec
	Metadata    string // JSON object
	Trigger     string // JSON trigger record
	Created     time.Time
	Expires     time.Time
	IdleTimeout time.Duration
	LastActive  time.Time
	InitPid     int
	Ended       time.Time
	EndReason   string
	ExternalID  string // the create's external id ("": none)
}

const sandboxCols = `id, tenant, tenant_name, state, spec, metadata, trigger_record, created, expires, idle_timeout_ms, last_active, init_pid, ended, end_reason, external_id`

func scanSandbox(sc interface{ Scan(...any) error }) (Sandbox, error) {
	var b Sandbox
	var created, expires, idle, last, ended int64
	err := sc.Scan(&b.ID, &b.Tenant, &b.TenantName, &b.State, &b.Spec, &b.Metadata, &b.Trigger, &created, &expires, &idle, &last, &b.InitPid, &ended, &b.EndReason, &b.ExternalID)
	b.Created, b.Expires, b.IdleTimeout, b.LastActive = time.UnixMilli(created), time.UnixMilli(expires), time.Duration(idle)*time.Millisecond, time.UnixMilli(last)
	if ended != 0 {
		b.Ended = time.UnixMilli(ended)
	}
	return b, err
}

// PutSandbox inserts or replaces a sandbox's record. The records of
// concurrent calls are written together, in the order the calls came, in
// one transaction; where that fails, each is written alone, so that each
// call answers for its own record.
func (s *Store) PutSandbox(ctx context.Context, b Sandbox) error {
	p := &put{rec: b, done: make(chan error, 1)}
	s.puts.mu.Lock()
	s.puts.pending = append(s.puts.pending, p)
	if s.puts.writing {
		s.puts.mu.Unlock()
		return <-p.done
	}
	// This call writes, its own and whatever comes meanwhile.
	s.puts.writing = true
	ctx = context.WithoutCancel(ctx) // the others' records go with it
	for len(s.puts.pending) > 0 {
		batch := s.puts.pending
		s.puts.pending = nil
		s.puts.mu.Unlock()
		if err := s.putSandboxes(ctx, batch); err != nil {
			for _, q := range batch {
				q.done <- putSandbox(ctx, s.db, q.rec)
			}
		} else {
			for _, q := range batch {
				q.done <- nil
			}
		}
		s.puts.mu.Lock()
	}
	s.puts.writing = false
	s.puts.mu.Unlock()
	return <-p.done
}

// putSandboxes writes batch's records in one transaction.
func (s *Store) putSandboxes(ctx context.Context, batch []*put) error {
	if len(batch) == 1 {
		return putSandbox(ctx, s.db, batch[0].rec)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	for _, p := range batch {
		if err := putSandbox(ctx, tx, p.rec); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

func putSandbox(ctx context.Context, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, b Sandbox) error {
	var ended int64
	if !b.Ended.IsZero() {
		ended = b.Ended.UnixMilli()
	}
	_, err := db.ExecContext(ctx, `INSERT OR REPLACE INTO sandboxes (`+sandboxCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		b.ID, b.Tenant, b.TenantName, b.State, b.Spec, b.Metadata, b.Trigger, b.Created.UnixMilli(), b.Expires.UnixMilli(),
		b.IdleTimeout.Milliseconds(), b.LastActive.UnixMilli(), b.InitPid, ended, b.EndReason, b.ExternalID)
	return err
}

// Sandboxes lists the records in the given states (all when none given).
func (s *Store) Sandboxes(ctx context.Context, states ...string) ([]Sandbox, error) {
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	var args []any
	if len(states) > 0 {
		q += ` WHERE state IN (?` + strings.Repeat(",?", len(states)-1) + `)`
		for _, st := range states {
			args = append(args, st)
		}
	}
	return s.sandboxes(ctx, q, args...)
}

// sandboxes runs q (a SELECT of sandboxCols) with args, oldest first.
func (s *Store) sandboxes(ctx context.Context, q string, args ...any) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		b, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// SandboxByID is one sandbox's record (ErrNotFound when there is none).
func (s *Store) SandboxByID(ctx context.Context, id string) (Sandbox, error) {
	b, err := scanSandbox(s.db.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, ErrNotFound
	}
	return b, err
}

// SandboxesByExternalID lists the records of external id ext in the
// given state ("": any), of tenant id tenant ("": of every tenant),
// oldest first.
func (s *Store) SandboxesByExternalID(ctx context.Context, tenant, ext, state string) ([]Sandbox, error) {
	if ext == "" {
		return nil, nil
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes WHERE external_id = ?`
	args := []any{ext}
	if state != "" {
		q += ` AND state = ?`
		args = append(args, state)
	}
	if tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, tenant)
	}
	return s.sandboxes(ctx, q, args...)
}

// PruneEnded deletes records of sandboxes that ended before t.
func (s *Store) PruneEnded(ctx context.Context, t time.Time) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE ended != 0 AND ended < ?`, t.UnixMilli())
	return err
}

func affected(r sql.Result, err error) error {
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// isConstraint reports a UNIQUE or PRIMARY KEY violation (SQLITE_CONSTRAINT).
func isConstraint(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == 19
}

// Snapshot is one tenant's record of a saved snapshot. The same content
// saved by two tenants is one set of files (named by Content, its digest)
// and two records, each with an id of its own tenant's (derived from the
// tenant's id and the content): no tenant can name another's.
type Snapshot struct {
	ID      string
	Tenant  string // the tenant's id
	Content string // the digest its files are kept under
	Name    string
	Sandbox string // the sandbox it was taken of
	Base    string // that sandbox's image
	HasRoot bool
	Bytes   int64
	Created time.Time
}

const snapshotCols = `id, tenant, content, name, sandbox, base, has_root, bytes, created`

// PutSnapshot records a snapshot for a tenant (again: no change).
func (s *Store) PutSnapshot(ctx context.Context, sn Snapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT OR IGNORE INTO snapshots (`+snapshotCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.Tenant, sn.Content, sn.Name, sn.Sandbox, sn.Base, sn.HasRoot, sn.Bytes, sn.Created.UnixMilli())
	return err
}

// Snapshots lists a tenant's snapshots ("" for every tenant's).
func (s *Store) Snapshots(ctx context.Context, tenant string) ([]Snapshot, error) {
	q, args := `SELECT `+snapshotCols+` FROM snapshots`, []any{}
	if tenant != "" {
		q, args = q+` WHERE tenant = ?`, append(args, tenant)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// SnapshotOf reads tenant's snapshot id; ErrNotFound when that tenant has
// none of that id.
func (s *Store) SnapshotOf(ctx context.Context, tenant, id string) (Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE tenant = ? AND id = ?`, tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return sn, ErrNotFound
	}
	return sn, err
}

func scanSnapshot(sc interface{ Scan(...any) error }) (Snapshot, error) {
	var sn Snapshot
	var created int64
	err := sc.Scan(&sn.ID, &sn.Tenant, &sn.Content, &sn.Name, &sn.Sandbox, &sn.Base, &sn.HasRoot, &sn.Bytes, &created)
	sn.Created = time.UnixMilli(created)
	return sn, err
}

// DeleteSnapshot removes a tenant's record and says whether any tenant
// still records its content.
func (s *Store) DeleteSnapshot(ctx context.Context, tenant, id string) (stillUsed bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var content string
	err = tx.QueryRowContext(ctx, `SELECT content FROM snapshots WHERE tenant = ? AND id = ?`, tenant, id).Scan(&content)
	if errors.Is(err, sql.ErrNoRows) {
		return false, ErrNotFound
	}
	if err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE tenant = ? AND id = ?`, tenant, id); err != nil {
		return false, err
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE content = ?`, content).Scan(&n); err != nil {
		return false, err
	}
	return n > 0, tx.Commit()
}
