package system

import (
	"context"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/run"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// Run runs one command in a one-shot sandbox (OneShot mode), its records
// in the run's audit log.
func (s *System) Run(ctx context.Context, sp *spec.Spec, stdio run.Stdio, ro run.Options) (*run.Result, error) {
	if s.opts.Mode != OneShot {
		return nil, fmt.Errorf("system: Run needs the OneShot mode")
	}
	ro.Audit = s.Recorder
	res, err := s.Runner.Run(ctx, sp, stdio, ro)
	if res != nil {
		res.Audit = s.AuditFile
	}
	return res, err
}
