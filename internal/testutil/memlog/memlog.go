// Package memlog is an audit log in memory, for the tests of what writes
// records through a record.Recorder (the sandbox service, the tenants'):
// every record is kept, in order (Records; Recs once the writers are
// done). It imports internal/audit only.
package memlog

import (
	"context"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/audit"
)

// Log keeps every record it is given. The zero value is ready.
type Log struct {
	mu   sync.Mutex
	Recs []audit.Record // read once the writers are done
}

// Commit keeps r (record.Log).
func (m *Log) Commit(_ context.Context, r audit.Record) error { return m.Append(r) }

// Queue keeps r, at once durable (record.Log).
func (m *Log) Queue(r audit.Record) (func() error, error) {
	if err := m.Append(r); err != nil {
		return nil, err
	}
	return func() error { return nil }, nil
}

// Append keeps r (record.Log).
func (m *Log) Append(r audit.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Recs = append(m.Recs, r)
	return nil
}

// Records is a copy of what was kept so far, safe while records are
// still being written.
func (m *Log) Records() []audit.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]audit.Record(nil), m.Recs...)
}

// Failed is nil: this log never fails (record.Log).
func (m *Log) Failed() error { return nil }
