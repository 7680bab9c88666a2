package tenant

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/audit/record"
)

// Caps on auth.failed records: anyone who can reach the API can fail to
// authenticate, as fast as the network allows, and each record is a write
// to the log every tenant's records share.
const (
	// MaxAuthFailedRecords is how many auth.failed records the daemon
	// makes a second in all, and MaxAuthFailedPerSource from one remote
	// address.
	MaxAuthFailedRecords   = 100
	MaxAuthFailedPerSource = 10
	// maxDroppedSources is how many sources a summary names; the rest
	// are counted together.
	maxDroppedSources = 64
)

// authFailures decides which failed authentications are recorded, and
// counts the rest for an audit.dropped summary: never dropped silently.
// Time comes from the service's clock (tests move it).
type authFailures struct {
	mu        sync.Mutex
	window    time.Time      // the current second
	total     int            // records made in it
	bySource  map[string]int // and per source
	dropped   map[string]int64
	droppedN  int64 // in all
	otherDrop int64 // from sources past maxDroppedSources
}

// admit says whether a failure from source at now is recorded; it also
// returns the summary of what earlier seconds dropped, when there is one
// to record.
func (a *authFailures) admit(now time.Time, source string) (bool, *record.AuditDropped) {
	a.mu.Lock()
	defer a.mu.Unlock()
	summary := a.roll(now)
	if a.total >= MaxAuthFailedRecords || a.bySource[source] >= MaxAuthFailedPerSource {
		a.droppedN++
		switch {
		case a.dropped[source] > 0 || len(a.dropped) < maxDroppedSources:
			if a.dropped == nil {
				a.dropped = map[string]int64{}
			}
			a.dropped[source]++
		default:
			a.otherDrop++
		}
		return false, summary
	}
	a.total++
	if a.bySource == nil {
		a.bySource = map[string]int{}
	}
	a.bySource[source]++
	return true, summary
}

// flush returns the summary of what was dropped before now's second, if
// anything was (the service's tick calls it once a second); a zero now
// takes everything dropped so far (the service stops).
func (a *authFailures) flush(now time.Time) *record.AuditDropped {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.IsZero() {
		return a.summary()
	}
	return a.roll(now)
}

// roll starts a new window once now has left the current one, and
// returns the summary of what the windows gone by dropped.
func (a *authFailures) roll(now time.Time) *record.AuditDropped {
	if now.Before(a.window.Add(time.Second)) && !now.Before(a.window) {
		return nil
	}
	a.window, a.total, a.bySource = now, 0, nil
	return a.summary()
}

// summary takes the count of what was dropped, if anything was.
func (a *authFailures) summary() *record.AuditDropped {
	if a.droppedN == 0 {
		return nil
	}
	sum := &record.AuditDropped{Of: "auth.failed", Records: a.droppedN, CapPerSecond: MaxAuthFailedRecords,
		CapPerSourcePerSecond: MaxAuthFailedPerSource, Sources: a.dropped, OtherSources: a.otherDrop}
	a.dropped, a.droppedN, a.otherDrop = nil, 0, 0
	return sum
}

// authSource names where a request came from for the caps: its remote
// address without the port ("local" for the unix socket).
func authSource(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		remote = host
	}
	if remote == "" || remote == "@" {
		return "local"
	}
	if len(remote) > 64 {
		remote = remote[:64]
	}
	return remote
}

// authFailed records a failed authentication from remote, within the caps.
func (s *Service) authFailed(remote string, d record.AuthFailed) {
	src := authSource(remote)
	ok, summary := s.authFails.admit(s.cfg.Now(), src)
	if summary != nil {
		s.cfg.Audit.Note(record.Who{}, *summary)
	}
	if ok {
		d.Remote = src
		s.cfg.Audit.Note(record.Who{}, d)
	}
}

// noteAuthDropped records, once a second (and when the service stops:
// a zero now), what the auth.failed caps dropped.
func (s *Service) noteAuthDropped(now time.Time) {
	if summary := s.authFails.flush(now); summary != nil {
		s.cfg.Audit.Note(record.Who{}, *summary)
	}
}

// Run records, once a second until ctx ends and then once more, what the
// auth.failed caps dropped.
func (s *Service) Run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.noteAuthDropped(time.Time{})
			return
		case <-tick.C:
			s.noteAuthDropped(s.cfg.Now())
		}
	}
}
