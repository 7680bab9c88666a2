package e2bapi

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

// fakeService keeps sandboxes in memory with the service's rules that
// the front relies on: another tenant's sandbox is not found, exactly as
// a missing one; pausing a paused one is a failed precondition.
type fakeService struct {
	mu       sync.Mutex
	now      time.Time
	n        int
	boxes    map[string]*api.Sandbox
	creates  []*api.CreateSandbox
	snaps    []*api.Snapshot
	extended map[string]string // id → last ttl asked
}

func newFakeService(now time.Time) *fakeService {
	return &fakeService{now: now, boxes: map[string]*api.Sandbox{}, extended: map[string]string{}}
}

func (s *fakeService) find(t *tenant.Principal, id string) (*api.Sandbox, error) {
	b, ok := s.boxes[id]
	if !ok || (!t.Admin && b.TenantID != t.ID) {
		return nil, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("no sandbox %q", id))
	}
	return b, nil
}

func (s *fakeService) Create(_ context.Context, t *tenant.Principal, req *api.CreateSandbox) (*api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil {
		return nil, err
	}
	s.n++
	s.creates = append(s.creates, req)
	b := &api.Sandbox{ID: fmt.Sprintf("sb%03d", s.n), TenantID: t.ID, Tenant: t.Tenant, State: api.StateRunning, Image: req.Image,
		Created: s.now.Add(time.Duration(s.n) * time.Second), Metadata: req.Metadata, Network: req.Network,
		Limits: api.Limits{MemoryBytes: 512 << 20, DiskBytes: 1 << 30, CPUs: 1.5}, OnTTL: req.OnTTL}
	b.Expires = b.Created.Add(ttl)
	s.boxes[b.ID] = b
	c := *b
	return &c, nil
}

func (s *fakeService) Get(_ context.Context, t *tenant.Principal, id string) (*api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.find(t, id)
	if err != nil {
		return nil, err
	}
	c := *b
	c.Usage = &api.Usage{CPUSeconds: 3, MemoryBytes: 64 << 20}
	return &c, nil
}

func (s *fakeService) Peek(t *tenant.Principal, id string) (*api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.find(t, id)
	if err != nil || b.State == api.StateEnded { // the service's live sandboxes only
		return nil, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("no sandbox %q", id))
	}
	c := *b
	return &c, nil
}

func (s *fakeService) List(_ context.Context, t *tenant.Principal) []*api.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*api.Sandbox
	for _, b := range s.boxes {
		if b.TenantID == t.ID && b.State != api.StateEnded {
			c := *b
			out = append(out, &c)
		}
	}
	slices.SortFunc(out, func(a, b *api.Sandbox) int { return a.Created.Compare(b.Created) })
	return out
}

func (s *fakeService) setPaused(t *tenant.Principal, id string, pause bool) (*api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.find(t, id)
	if err != nil {
		return nil, err
	}
	if pause == (b.State == api.StatePaused) {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "sandbox "+id+" is already "+b.State)
	}
	b.State = api.StateRunning
	if pause {
		b.State = api.StatePaused
	}
	c := *b
	return &c, nil
}

func (s *fakeService) Pause(_ context.Context, t *tenant.Principal, id string) (*api.Sandbox, error) {
	return s.setPaused(t, id, true)
}

func (s *fakeService) Resume(_ context.Context, t *tenant.Principal, id string) (*api.Sandbox, error) {
	return s.setPaused(t, id, false)
}

func (s *fakeService) Extend(_ context.Context, t *tenant.Principal, id string, req *api.Extend) (*api.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.find(t, id)
	if err != nil {
		return nil, err
	}
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil {
		return nil, err
	}
	b.Expires = s.now.Add(ttl)
	s.extended[id] = req.TTL
	c := *b
	return &c, nil
}

func (s *fakeService) Destroy(_ context.Context, t *tenant.Principal, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.find(t, id)
	if err != nil || b.State == api.StateEnded {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("no sandbox %q", id))
	}
	b.State = api.StateEnded
	return nil
}

func (s *fakeService) Fork(_ context.Context, t *tenant.Principal, id string, req *api.CreateFork) (*api.Fork, error) {
	return nil, errdefs.New(errdefs.ErrUnavailable, "no forks in the fake")
}

func (s *fakeService) Snapshot(_ context.Context, t *tenant.Principal, id string, req *api.CreateSnapshot) (*api.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.find(t, id); err != nil {
		return nil, err
	}
	sn := &api.Snapshot{ID: fmt.Sprintf("snap%d", len(s.snaps)), Name: req.Name, Sandbox: id, Created: s.now.Add(time.Duration(len(s.snaps)) * time.Second)}
	s.snaps = append(s.snaps, sn)
	return sn, nil
}

func (s *fakeService) Snapshots(context.Context, *tenant.Principal) ([]*api.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.snaps), nil
}

func (s *fakeService) DeleteSnapshot(_ context.Context, _ *tenant.Principal, sid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sn := range s.snaps {
		if sn.ID == sid {
			s.snaps = slices.Delete(s.snaps, i, i+1)
			return nil
		}
	}
	return errdefs.New(errdefs.ErrNotFound, "no snapshot")
}

// fakeTenants signs in two tenants by key.
type fakeTenants map[string]*tenant.Principal

func (f fakeTenants) Authenticate(_ context.Context, key, _ string) (*tenant.Principal, error) {
	if p, ok := f[key]; ok {
		return p, nil
	}
	return nil, errdefs.New(errdefs.ErrUnauthenticated, "unknown API key")
}

func (f fakeTenants) ByID(_ context.Context, id string) (*tenant.Principal, error) {
	for _, p := range f {
		if p.ID == id {
			return p, nil
		}
	}
	return nil, errdefs.New(errdefs.ErrUnauthenticated, "tenant gone")
}
