// Package tenant is who may call the daemon: tenants (their quotas, scan
// policy and host roots, checked when granted), their API keys and the
// admin's, the cache of signed-in principals, and the cap on records of
// failed sign-ins. Tenants are kept in internal/store. What a tenant's
// deletion ends (its sandboxes, snapshots, MCP spec, CPU budget) belongs
// to the sandbox service (internal/sandbox), which this package reaches
// only through the Sandboxes interface and never imports. The API
// (internal/httpapi, /mcp included) signs every caller in here.
package tenant

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Defaults of a tenant's settings.
const (
	// DefaultScanPolicy is a tenant's unless it chose another.
	DefaultScanPolicy = "block"
	// DefaultCPUPeriod is the period of a CPU-seconds quota unless the
	// tenant's quotas name another.
	DefaultCPUPeriod = time.Hour
)

// Principal is who a request comes from: the admin, or one tenant. What
// the tenant owns is bound to its ID; Tenant, its name, is for messages.
type Principal struct {
	Admin      bool
	ID         string
	Tenant     string
	Quotas     api.Quotas
	ScanPolicy string // block, redact or record
	// Roots are the host directories the tenant may name paths under.
	Roots []string
	// Isolation is the wall its sandboxes are held to at least ("": any).
	Isolation string
	// deleted is shared by every principal the service made for the
	// tenant, and set when the tenant is deleted.
	deleted *atomic.Bool
}

// Err is non-nil (ErrUnauthenticated) once p's tenant has been deleted: a
// request under way then, with its principal already in hand, is refused
// from there on. A principal made by hand (the admin's, the embedded
// service's) never is.
func (p *Principal) Err() error {
	if p.deleted != nil && p.deleted.Load() {
		return errTenantGone()
	}
	return nil
}

// UndoIfDeleted undoes a write that raced the deletion of p's tenant, so
// that nothing is left bound to a dead id, and refuses the call.
// Deletion marks the tenant before it removes what the tenant owns, so a
// write the removal missed is seen here.
func (p *Principal) UndoIfDeleted(undo func()) error {
	if err := p.Err(); err != nil {
		undo()
		return err
	}
	return nil
}

func errTenantGone() error {
	return errdefs.New(errdefs.ErrUnauthenticated, "this key's tenant has been deleted")
}

// Sandboxes is what the tenants' service asks of the sandbox service
// (sandbox.Service): a deleted tenant's sandboxes end, and what the
// service keeps of it goes.
type Sandboxes interface {
	// EndTenant destroys every sandbox of tenant id for reason, those
	// being made included, and returns their ids once all are gone; by is
	// who asked.
	EndTenant(by *Principal, id, reason string) ([]string, error)
	// ForgetTenant removes what the service keeps of deleted tenant id
	// beyond its records: its MCP spec, its CPU budget, and the files of
	// the snapshots no record names any more (freed).
	ForgetTenant(ctx context.Context, id string, freed []string) error
	// TenantUsage is what tenant id holds now and the CPU seconds it
	// used in its current period.
	TenantUsage(id string) Usage
}

// Usage is what a tenant holds now, as its quotas count it.
type Usage struct {
	// Sandboxes counts what max_sandboxes counts: its live sandboxes,
	// its pools' ready ones and those being made; Pooled, its pools'
	// ready ones among them.
	Sandboxes, Pooled int
	CPUSeconds        float64 // used in its current period
}

// Config configures the service.
type Config struct {
	Store *store.Store
	// Sandboxes ends a deleted tenant's sandboxes and counts a tenant's
	// (required by List and Delete).
	Sandboxes Sandboxes
	// Audit records what changes and failed sign-ins; nil records
	// nothing (unit tests).
	Audit *record.Recorder
	Log   *slog.Logger
	// Now is the clock (tests move it).
	Now func() time.Time
	// Reserved are the daemon's own directories (state, data, keys, audit
	// log): no tenant root may hold or lie in one.
	Reserved []string
}

// Service keeps the tenants and signs callers in. Tenants are keyed by
// their id (Principal.ID), never by their name.
type Service struct {
	cfg  Config
	mu   sync.Mutex
	keys map[string]*Principal // key hash → who (cache; forget drops a changed tenant's)
	// ids caches ByID's principals (an E2B front asks it for every
	// request of a sandbox's own traffic); an update or deletion of a
	// tenant drops its entry, as it drops its keys'.
	ids map[string]*Principal
	// deleted holds, per tenant id, the mark its principals share (set:
	// the tenant has been deleted since the daemon started).
	deleted map[string]*atomic.Bool
	// gen counts the changes to tenants that drop cached principals
	// (forget): a sign-in that saw it move caches nothing it read.
	gen       uint64
	authFails authFailures
}

// New makes the service.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, keys: map[string]*Principal{}, ids: map[string]*Principal{}, deleted: map[string]*atomic.Bool{}}
}

// mark is tenant id's deletion mark (under s.mu).
func (s *Service) mark(id string) *atomic.Bool {
	m := s.deleted[id]
	if m == nil {
		m = new(atomic.Bool)
		s.deleted[id] = m
	}
	return m
}

// CPUPeriod is the period of quota q's CPU-seconds budget (an invalid
// one, which validQuotas never lets in, counts as the default).
func CPUPeriod(q api.Quotas) time.Duration {
	d, err := time.ParseDuration(q.CPUPeriod)
	if q.CPUPeriod == "" || err != nil || d < 0 {
		return DefaultCPUPeriod
	}
	return d
}

func quoteName(name string) string {
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	return fmt.Sprintf("%q", name)
}

const adminKeyMeta = "admin_key_hash"

// newKey returns a fresh API key: 256 random bits, with a prefix that says
// what it is (so secret scanners can find leaked ones).
func newKey(kind string) string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "airlock_" + kind + "_" + base64.RawURLEncoding.EncodeToString(b[:])
}

// EnsureAdminKey writes a new admin key to path (root only) when the
// database has none, and says whether it did.
func (s *Service) EnsureAdminKey(ctx context.Context, path string) (bool, error) {
	h, err := s.cfg.Store.Meta(ctx, adminKeyMeta)
	if err != nil {
		return false, err
	}
	if h != "" {
		if _, err := os.Stat(path); err == nil {
			return false, nil
		}
	}
	key := newKey("admin")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(key+"\n"), 0o600); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, err
	}
	return true, s.cfg.Store.SetMeta(ctx, adminKeyMeta, store.HashKey(key))
}

// Authenticate maps an API key to its principal; remote is the request's
// remote address, for the record of a failure.
func (s *Service) Authenticate(ctx context.Context, key, remote string) (*Principal, error) {
	if key == "" {
		s.authFailed(remote, record.AuthFailed{Reason: "no key"})
		return nil, errdefs.New(errdefs.ErrUnauthenticated, "no API key: send Authorization: Bearer <key>")
	}
	h := store.HashKey(key)
	for {
		s.mu.Lock()
		p, ok := s.keys[h]
		gen := s.gen
		s.mu.Unlock()
		if !ok {
			var err error
			p, err = s.authenticate(ctx, h)
			if errors.Is(err, store.ErrNotFound) {
				// Who tried is unknown; the key's digest prefix ties attempts
				// together without keeping anything usable.
				s.authFailed(remote, record.AuthFailed{KeySHA256Prefix: h[:12]})
				return nil, errdefs.New(errdefs.ErrUnauthenticated, "unknown API key")
			}
			if err != nil {
				return nil, err
			}
		}
		// A tenant deleted while its key was being looked up must not stay
		// cached; one changed meanwhile (its key replaced) is looked up
		// again: what was read may be its old key.
		s.mu.Lock()
		if s.gen != gen {
			s.mu.Unlock()
			continue
		}
		err := p.Err()
		if err != nil {
			delete(s.keys, h)
		} else {
			s.keys[h] = p
		}
		s.mu.Unlock()
		return p, err
	}
}

// forget drops tenant id's signed-in principals from the caches, and
// makes every sign-in under way, which may have read the tenant as it
// was (its old key), look again.
func (s *Service) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, kp := range s.keys {
		if !kp.Admin && kp.ID == id {
			delete(s.keys, h)
		}
	}
	delete(s.ids, id)
	s.gen++
}

// authenticate looks a key's hash up in the store (store.ErrNotFound:
// no such key).
func (s *Service) authenticate(ctx context.Context, h string) (*Principal, error) {
	admin, err := s.cfg.Store.Meta(ctx, adminKeyMeta)
	if err != nil {
		return nil, err
	}
	if admin != "" && h == admin {
		return &Principal{Admin: true}, nil
	}
	t, err := s.cfg.Store.TenantByKey(ctx, h)
	if errors.Is(err, store.ErrNotFound) {
		// A tenant's E2B-shaped alias (E2BKey).
		var id string
		if id, err = s.cfg.Store.Meta(ctx, e2bKeyMeta+h); err == nil && id == "" {
			err = store.ErrNotFound
		}
		if err == nil {
			t, err = s.cfg.Store.TenantByID(ctx, id)
		}
	}
	if err != nil {
		return nil, err
	}
	return s.principal(t), nil
}

// Where a tenant's E2B-shaped key is kept: its hash → the tenant's id, and
// the tenant's id → its hash (to replace it).
const (
	e2bKeyMeta   = "e2b_key:"
	e2bKeyOfMeta = "e2b_key_of:"
)

// E2BKey gives tenant name a new E2B-shaped key, e2b_ and 40 hex digits
// (E2B's Python SDK refuses any other shape): an alias of its key for the
// E2B front (internal/e2bapi), stored hashed, shown this once. The one it
// had before stops working.
func (s *Service) E2BKey(ctx context.Context, p *Principal, name string) (*api.E2BKey, error) {
	if err := admin(p); err != nil {
		return nil, err
	}
	tn, err := s.cfg.Store.TenantByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteName(name))
	}
	if err != nil {
		return nil, err
	}
	var b [20]byte
	_, _ = rand.Read(b[:])
	key := "e2b_" + hex.EncodeToString(b[:])
	h := store.HashKey(key)
	old, err := s.cfg.Store.Meta(ctx, e2bKeyOfMeta+tn.ID)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Store.SetMeta(ctx, e2bKeyMeta+h, tn.ID); err != nil {
		return nil, err
	}
	if err := s.cfg.Store.SetMeta(ctx, e2bKeyOfMeta+tn.ID, h); err != nil {
		return nil, err
	}
	if old != "" {
		if err := s.cfg.Store.DeleteMeta(ctx, e2bKeyMeta+old); err != nil {
			return nil, err
		}
		s.mu.Lock()
		delete(s.keys, old)
		s.gen++
		s.mu.Unlock()
	}
	if err := s.cfg.Audit.Commit(ctx, record.Who{Tenant: tn.ID}, record.TenantE2BKey{Name: name, Replaced: old != ""}); err != nil {
		return nil, err
	}
	return &api.E2BKey{Tenant: name, Key: key}, nil
}

// ByID is tenant id as its key signs it in, with its settings as they
// are now: for work the daemon does for a tenant between its calls (a
// pool's refill). A deleted tenant is ErrUnauthenticated.
func (s *Service) ByID(ctx context.Context, id string) (*Principal, error) {
	s.mu.Lock()
	p, ok := s.ids[id]
	s.mu.Unlock()
	if ok {
		return p, p.Err()
	}
	t, err := s.cfg.Store.TenantByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errTenantGone()
	}
	if err != nil {
		return nil, err
	}
	p = s.principal(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := p.Err(); err != nil {
		return nil, err
	}
	s.ids[id] = p
	return p, nil
}

// principal is the principal of stored tenant t.
func (s *Service) principal(t store.Tenant) *Principal {
	p := &Principal{ID: t.ID, Tenant: t.Name, ScanPolicy: t.ScanPolicy, Isolation: t.Isolation}
	if p.ScanPolicy == "" {
		p.ScanPolicy = DefaultScanPolicy
	}
	_ = json.Unmarshal([]byte(t.Quotas), &p.Quotas)
	p.Roots = rootsOf(t)
	s.mu.Lock()
	p.deleted = s.mark(t.ID)
	s.mu.Unlock()
	return p
}

var tenantName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`) })

// Ceilings of a tenant's quotas.
const (
	maxQuotaSandboxes  = 100_000
	maxQuotaBytes      = 1 << 50 // 1 PiB
	maxQuotaCPUs       = 1 << 20
	maxQuotaCPUSeconds = 1 << 40
	maxCPUPeriod       = 31 * 24 * time.Hour
)

func validQuotas(q api.Quotas) error {
	if q.MaxSandboxes < 0 || q.MaxMemory < 0 || q.MaxCPUs < 0 || q.CPUSeconds < 0 || q.MaxSnapshotBytes < 0 {
		return errdefs.Invalid("quotas must not be negative")
	}
	// Ceilings keep sums and products of quotas far from overflow.
	switch {
	case q.MaxSandboxes > maxQuotaSandboxes:
		return errdefs.Invalid(fmt.Sprintf("max_sandboxes %d: at most %d", q.MaxSandboxes, maxQuotaSandboxes))
	case q.MaxMemory > maxQuotaBytes:
		return errdefs.Invalid(fmt.Sprintf("max_memory_bytes %d: at most %s", q.MaxMemory, spec.FormatSize(maxQuotaBytes)))
	case q.MaxSnapshotBytes > maxQuotaBytes:
		return errdefs.Invalid(fmt.Sprintf("max_snapshot_bytes %d: at most %s", q.MaxSnapshotBytes, spec.FormatSize(maxQuotaBytes)))
	case q.MaxCPUs > maxQuotaCPUs:
		return errdefs.Invalid(fmt.Sprintf("max_cpus %g: at most %d", q.MaxCPUs, maxQuotaCPUs))
	case q.CPUSeconds > maxQuotaCPUSeconds:
		return errdefs.Invalid(fmt.Sprintf("cpu_seconds %g: at most %g", q.CPUSeconds, float64(maxQuotaCPUSeconds)))
	}
	if q.CPUPeriod != "" {
		if d, err := time.ParseDuration(q.CPUPeriod); err != nil || d < 0 || d > maxCPUPeriod {
			return errdefs.Invalid(fmt.Sprintf("cpu_period %q: want a duration such as 30m, at most %v", q.CPUPeriod, maxCPUPeriod))
		}
	}
	return nil
}

func admin(p *Principal) error {
	if !p.Admin {
		return errdefs.New(errdefs.ErrPermissionDenied, "this needs the admin key")
	}
	return nil
}

// Create adds a tenant and returns its key, shown this once.
func (s *Service) Create(ctx context.Context, p *Principal, req *api.CreateTenant) (*api.Tenant, error) {
	if err := admin(p); err != nil {
		return nil, err
	}
	if !tenantName().MatchString(req.Name) {
		return nil, errdefs.Invalid(fmt.Sprintf("tenant name %q: 1–63 of a-z, 0-9, _ and -, starting with a letter or digit", req.Name))
	}
	if err := validQuotas(req.Quotas); err != nil {
		return nil, err
	}
	if req.ScanPolicy == "" {
		req.ScanPolicy = DefaultScanPolicy
	}
	if !slices.Contains(spec.ScanPolicies, req.ScanPolicy) {
		return nil, errdefs.Invalid(fmt.Sprintf("scan_policy %q: one of %s", req.ScanPolicy, strings.Join(spec.ScanPolicies, ", ")))
	}
	roots, err := s.validRoots(req.Roots)
	if err != nil {
		return nil, err
	}
	if err := spec.ValidHold(req.Isolation); err != nil {
		return nil, err
	}
	hold := holdOf(req.Isolation)
	// The caller's key (by its digest), or one made here and shown once.
	key, keyHash := "", req.KeySHA256
	if keyHash != "" {
		if err := validKeySHA256(keyHash); err != nil {
			return nil, err
		}
		// A name taken says so first: a repeated create (a controller's)
		// finds its tenant, and its key, taken.
		if _, err := s.cfg.Store.TenantByName(ctx, req.Name); err == nil {
			return nil, errdefs.New(errdefs.ErrAlreadyExists, "tenant "+req.Name+" exists")
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		if err := s.keyFree(ctx, keyHash, ""); err != nil {
			return nil, err
		}
	} else {
		key = newKey("tenant")
		keyHash = store.HashKey(key)
	}
	q, _ := json.Marshal(req.Quotas)
	now := s.cfg.Now()
	id, err := s.cfg.Store.CreateTenant(ctx, store.Tenant{Name: req.Name, KeyHash: keyHash, Quotas: string(q), Created: now, CPUPeriodStart: now, ScanPolicy: req.ScanPolicy, Roots: rootsJSON(roots), Isolation: hold})
	if errors.Is(err, store.ErrExists) {
		if _, nerr := s.cfg.Store.TenantByName(ctx, req.Name); nerr != nil && key == "" {
			return nil, errKeyInUse() // the name is free: the key is the one taken
		}
		return nil, errdefs.New(errdefs.ErrAlreadyExists, "tenant "+req.Name+" exists")
	}
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Audit.Commit(ctx, record.Who{Tenant: id}, record.TenantCreated{Name: req.Name, Quotas: req.Quotas, ScanPolicy: req.ScanPolicy, Roots: roots, Isolation: shownHold(hold), CallerKey: key == ""}); err != nil {
		return nil, err
	}
	s.cfg.Log.Info("tenant created", "tenant", req.Name, "id", id)
	return &api.Tenant{ID: id, Name: req.Name, Quotas: req.Quotas, ScanPolicy: req.ScanPolicy, Roots: roots, Isolation: shownHold(hold), Created: now, Key: key}, nil
}

// validKeySHA256 refuses a key digest that is not 64 lowercase hex
// digits.
func validKeySHA256(h string) error {
	ok := len(h) == 64
	for i := 0; ok && i < len(h); i++ {
		ok = '0' <= h[i] && h[i] <= '9' || 'a' <= h[i] && h[i] <= 'f'
	}
	if !ok {
		return errdefs.Invalid("key_sha256: want the lowercase hex SHA-256 of the key (64 digits of 0-9a-f)")
	}
	return nil
}

func errKeyInUse() error {
	return errdefs.New(errdefs.ErrAlreadyExists, "key_sha256: that key is already in use")
}

// keyFree refuses key digest h when a key of the daemon's signs in with
// it: the admin's, a tenant's but tenant id self's, or an E2B alias.
func (s *Service) keyFree(ctx context.Context, h, self string) error {
	admin, err := s.cfg.Store.Meta(ctx, adminKeyMeta)
	if err != nil {
		return err
	}
	alias, err := s.cfg.Store.Meta(ctx, e2bKeyMeta+h)
	if err != nil {
		return err
	}
	t, err := s.cfg.Store.TenantByKey(ctx, h)
	switch {
	case err == nil && t.ID != self, h == admin, alias != "":
		return errKeyInUse()
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return err
	}
	return nil
}

// Update changes a tenant's quotas, scan policy or roots; its key's next
// call sees them. Live sandboxes' proxies keep the policy they were made
// with.
func (s *Service) Update(ctx context.Context, p *Principal, name string, req *api.UpdateTenant) (*api.Tenant, error) {
	if err := admin(p); err != nil {
		return nil, err
	}
	cur, err := s.cfg.Store.TenantByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteName(name))
	}
	if err != nil {
		return nil, err
	}
	var q api.Quotas
	_ = json.Unmarshal([]byte(cur.Quotas), &q)
	if req.Quotas != nil {
		if err := validQuotas(*req.Quotas); err != nil {
			return nil, err
		}
		q = *req.Quotas
	}
	policy := cur.ScanPolicy
	if req.ScanPolicy != "" {
		if !slices.Contains(spec.ScanPolicies, req.ScanPolicy) {
			return nil, errdefs.Invalid(fmt.Sprintf("scan_policy %q: one of %s", req.ScanPolicy, strings.Join(spec.ScanPolicies, ", ")))
		}
		policy = req.ScanPolicy
	}
	if policy == "" {
		policy = DefaultScanPolicy
	}
	roots := rootsOf(cur)
	if req.Roots != nil {
		if roots, err = s.validRoots(*req.Roots); err != nil {
			return nil, err
		}
	}
	hold := cur.Isolation
	if req.Isolation != "" {
		if err := spec.ValidHold(req.Isolation); err != nil {
			return nil, err
		}
		hold = holdOf(req.Isolation)
	}
	if req.KeySHA256 != "" {
		if err := validKeySHA256(req.KeySHA256); err != nil {
			return nil, err
		}
		if err := s.keyFree(ctx, req.KeySHA256, cur.ID); err != nil {
			return nil, err
		}
	}
	qb, _ := json.Marshal(q)
	if err := s.cfg.Store.UpdateTenant(ctx, cur.ID, string(qb), policy); errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteName(name))
	} else if err != nil {
		return nil, err
	}
	if err := s.cfg.Store.SetTenantRoots(ctx, cur.ID, rootsJSON(roots)); err != nil {
		return nil, err
	}
	if err := s.cfg.Store.SetTenantIsolation(ctx, cur.ID, hold); err != nil {
		return nil, err
	}
	replaced := req.KeySHA256 != "" && req.KeySHA256 != cur.KeyHash
	if replaced {
		if err := s.cfg.Store.SetTenantKey(ctx, cur.ID, req.KeySHA256); errors.Is(err, store.ErrExists) {
			return nil, errKeyInUse()
		} else if err != nil {
			return nil, err
		}
	}
	s.forget(cur.ID) // the next call loads the new settings; an old key is unknown
	if err := s.cfg.Audit.Commit(ctx, record.Who{Tenant: cur.ID}, record.TenantUpdated{Quotas: q, ScanPolicy: policy, Roots: roots, Isolation: shownHold(hold), KeyReplaced: replaced}); err != nil {
		return nil, err
	}
	return &api.Tenant{ID: cur.ID, Name: name, Quotas: q, ScanPolicy: policy, Roots: roots, Isolation: shownHold(hold), Created: cur.Created}, nil
}

// holdOf is how a hold is stored: "" for none ("container", the
// weakest wall, holds nothing).
func holdOf(isolation string) string {
	if isolation == "container" {
		return ""
	}
	return isolation
}

// shownHold is a stored hold as the API shows it.
func shownHold(hold string) string {
	if hold == "" {
		return "container"
	}
	return hold
}

// List lists the tenants (admin), or the caller's own tenant.
func (s *Service) List(ctx context.Context, p *Principal) ([]*api.Tenant, error) {
	ts, err := s.cfg.Store.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	out := []*api.Tenant{}
	for _, t := range ts {
		if !p.Admin && t.ID != p.ID {
			continue
		}
		at := &api.Tenant{ID: t.ID, Name: t.Name, Created: t.Created, ScanPolicy: t.ScanPolicy, Roots: rootsOf(t), Isolation: shownHold(t.Isolation)}
		if at.ScanPolicy == "" {
			at.ScanPolicy = DefaultScanPolicy
		}
		_ = json.Unmarshal([]byte(t.Quotas), &at.Quotas)
		u := s.cfg.Sandboxes.TenantUsage(t.ID)
		at.Sandboxes, at.Pooled, at.CPUSeconds = u.Sandboxes, u.Pooled, u.CPUSeconds
		out = append(out, at)
	}
	return out, nil
}

// Delete destroys a tenant's sandboxes (those being made included) and
// removes it with its snapshots and secrets; its key, and every principal
// it signed in as, stop working at once. Its id is never issued again, so
// nothing of it passes to a tenant made later under the same name.
func (s *Service) Delete(ctx context.Context, p *Principal, name string) error {
	if err := admin(p); err != nil {
		return err
	}
	tn, err := s.cfg.Store.TenantByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteName(name))
	}
	if err != nil {
		return err
	}
	// From here no create of its is admitted and no cached key of its
	// answers; then what it has, live or being made, is destroyed.
	s.mu.Lock()
	s.mark(tn.ID).Store(true)
	s.mu.Unlock()
	s.forget(tn.ID)
	ids, err := s.cfg.Sandboxes.EndTenant(p, tn.ID, "kill switch (tenant "+name+" deleted)")
	if err != nil {
		return err
	}
	if h, err := s.cfg.Store.Meta(ctx, e2bKeyOfMeta+tn.ID); err != nil {
		return err
	} else if h != "" {
		if err := errors.Join(s.cfg.Store.DeleteMeta(ctx, e2bKeyMeta+h), s.cfg.Store.DeleteMeta(ctx, e2bKeyOfMeta+tn.ID)); err != nil {
			return err
		}
	}
	freed, err := s.cfg.Store.DeleteTenant(ctx, tn.ID)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no tenant "+quoteName(name))
	} else if err != nil {
		return err
	}
	if err := s.cfg.Sandboxes.ForgetTenant(ctx, tn.ID, freed); err != nil {
		return err
	}
	s.cfg.Log.Info("tenant deleted", "tenant", name, "id", tn.ID, "sandboxes", len(ids), "snapshot_files_removed", len(freed))
	return s.cfg.Audit.Commit(ctx, record.Who{Tenant: tn.ID}, record.TenantDeleted{Name: name, Destroyed: ids})
}
