// Package secret keeps tenants' secrets: sealed with the broker's keys
// (bound to tenant id, name and version) in internal/store, added,
// rotated, listed (never their values) and removed by their tenant, and
// opened only for the broker (Store.Value), when it puts one into a
// granted request. A value never leaves the daemon.
package secret

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// Config configures the store.
type Config struct {
	Store *store.Store
	// Keys seal and open the values (the broker's).
	Keys *keys.Keys
	// Audit records what changes; nil records nothing (unit tests).
	Audit *record.Recorder
	// Now is the clock (tests move it).
	Now func() time.Time
}

// Store keeps the tenants' secrets.
type Store struct{ cfg Config }

// New makes the store.
func New(cfg Config) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{cfg: cfg}
}

// MaxSecretBytes caps a secret's value, MaxSecrets a tenant's secrets.
const (
	MaxSecretBytes = 16 << 10
	MaxSecrets     = 1000
)

// sealContext binds a sealed value to its tenant (by id), name and version.
func sealContext(tenant, name string, version int) string {
	return fmt.Sprintf("airlock secret %s/%s/%d", tenant, name, version)
}

func ownerOnly(p *tenant.Principal) error {
	if p.Admin {
		return errdefs.New(errdefs.ErrPermissionDenied, "secrets belong to tenants: use a tenant's key")
	}
	return nil
}

// checkSecretValue refuses what cannot go in a header: a value is written
// into requests, so a line break in it would forge headers.
func checkSecretValue(v string) error {
	switch {
	case v == "":
		return errdefs.Invalid("the secret's value is empty")
	case len(v) > MaxSecretBytes:
		return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("a secret's value is at most %d bytes", MaxSecretBytes))
	case strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errdefs.Invalid("the secret's value holds a control character (a line break?); it goes into request headers, which cannot carry one")
	}
	return nil
}

// Add stores a new secret of the caller's tenant, sealed.
func (s *Store) Add(ctx context.Context, p *tenant.Principal, req *api.AddSecret) (*api.Secret, error) {
	if err := ownerOnly(p); err != nil {
		return nil, err
	}
	if !spec.SecretNameOK(req.Name) {
		return nil, errdefs.Invalid(fmt.Sprintf("secret name %q: 1-64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", req.Name))
	}
	if err := checkSecretValue(req.Value); err != nil {
		return nil, err
	}
	have, err := s.cfg.Store.Secrets(ctx, p.ID)
	if err != nil {
		return nil, err
	}
	if len(have) >= MaxSecrets {
		return nil, errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("tenant %s has %d secrets, the most it may keep: remove one first", p.Tenant, len(have)))
	}
	now := s.cfg.Now()
	sec := store.Secret{Tenant: p.ID, Name: req.Name, Version: 1, Created: now, Updated: now,
		Sealed: s.cfg.Keys.Seal(sealContext(p.ID, req.Name, 1), []byte(req.Value))}
	err = s.cfg.Store.AddSecret(ctx, sec)
	if errors.Is(err, store.ErrExists) {
		return nil, errdefs.New(errdefs.ErrAlreadyExists, fmt.Sprintf("secret %s exists: rotate it to change its value", req.Name))
	}
	if err != nil {
		return nil, err
	}
	if err := p.UndoIfDeleted(func() { _ = s.cfg.Store.DeleteSecret(context.WithoutCancel(ctx), p.ID, req.Name) }); err != nil {
		return nil, err
	}
	if err := s.cfg.Audit.Commit(ctx, record.Who{Tenant: p.ID}, record.SecretAdded{Name: req.Name, Version: 1}); err != nil {
		return nil, err
	}
	return describeSecret(sec), nil
}

// Rotate gives a secret a new value; live grants use it from their
// next request.
func (s *Store) Rotate(ctx context.Context, p *tenant.Principal, name string, req *api.RotateSecret) (*api.Secret, error) {
	if err := ownerOnly(p); err != nil {
		return nil, err
	}
	if err := checkSecretValue(req.Value); err != nil {
		return nil, err
	}
	cur, err := s.cfg.Store.GetSecret(ctx, p.ID, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, "no secret "+quoteName(name))
	}
	if err != nil {
		return nil, err
	}
	next := cur
	next.Version, next.Updated = cur.Version+1, s.cfg.Now()
	next.Sealed = s.cfg.Keys.Seal(sealContext(p.ID, name, next.Version), []byte(req.Value))
	if err := s.cfg.Store.RotateSecret(ctx, next, cur.Version); errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "secret "+name+" changed meanwhile; try again")
	} else if err != nil {
		return nil, err
	}
	if err := s.cfg.Audit.Commit(ctx, record.Who{Tenant: p.ID}, record.SecretRotated{Name: name, Version: next.Version}); err != nil {
		return nil, err
	}
	return describeSecret(next), nil
}

// List lists the caller's secrets (names and versions, never values).
func (s *Store) List(ctx context.Context, p *tenant.Principal) ([]*api.Secret, error) {
	if err := ownerOnly(p); err != nil {
		return nil, err
	}
	ss, err := s.cfg.Store.Secrets(ctx, p.ID)
	if err != nil {
		return nil, err
	}
	out := []*api.Secret{}
	for _, sec := range ss {
		out = append(out, describeSecret(sec))
	}
	return out, nil
}

// Remove deletes a secret; grants that name it fail closed from
// their next request.
func (s *Store) Remove(ctx context.Context, p *tenant.Principal, name string) error {
	if err := ownerOnly(p); err != nil {
		return err
	}
	if err := s.cfg.Store.DeleteSecret(ctx, p.ID, name); errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "no secret "+quoteName(name))
	} else if err != nil {
		return err
	}
	return s.cfg.Audit.Commit(ctx, record.Who{Tenant: p.ID}, record.SecretRemoved{Name: name})
}

// Value opens tenant's secret name: what the broker puts into a granted
// request (broker.Config.Secret). It never leaves the daemon.
func (s *Store) Value(tenant, name string) ([]byte, error) {
	sec, err := s.cfg.Store.GetSecret(context.Background(), tenant, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("secret %q not found (airlock secret add %s)", name, name))
	}
	if err != nil {
		return nil, err
	}
	return s.cfg.Keys.Open(sealContext(tenant, name, sec.Version), sec.Sealed)
}

func describeSecret(sec store.Secret) *api.Secret {
	return &api.Secret{Name: sec.Name, Version: sec.Version, Created: sec.Created, Updated: sec.Updated}
}

func quoteName(name string) string {
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	return fmt.Sprintf("%q", name)
}
