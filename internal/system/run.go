package system

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/run"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// Run runs one command in a one-shot sandbox (OneShot mode), its records
// in the run's audit log.
func (s *System) Run(ctx context.Context, sp *spec.Spec, stdio run.Stdio, ro run.Options) (*run.Result, error) {
	if s.opts.Mode != OneShot {
		return nil, fmt.Errorf("system: Run needs the OneShot mode")
	}
	alog := s.Audit
	ro.Audit = func(sandbox, kind, source string, data any, wait bool) error {
		r := audit.Record{Kind: kind, Sandbox: sandbox, Source: source}
		b, err := json.Marshal(data)
		if err != nil {
			return err
		}
		r.Data = b
		if wait {
			return alog.Commit(context.Background(), r)
		}
		if err := alog.Append(r); err != nil {
			s.opts.Warn("audit: " + err.Error())
		}
		return nil
	}
	res, err := s.Runner.Run(ctx, sp, stdio, ro)
	if res != nil {
		res.Audit = s.AuditFile
	}
	return res, err
}
