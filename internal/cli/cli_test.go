package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/run"
)

// An exit code `airlock audit` returns is the one Main reads: audit's
// exitError unwraps to cmdutil.ExitError.
func TestAuditExitCodeReachesMain(t *testing.T) {
	var ee cmdutil.ExitError
	if err := fmt.Errorf("verify: %w", exitError{3}); !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("errors.As: %+v", ee)
	}
}

// The one exit-code table (cmdutil) and run's codes are the same numbers.
func TestRunsExitCodesAreTheTables(t *testing.T) {
	for _, c := range [][2]int{{run.ExitTimeout, cmdutil.ExitTimeout}, {run.ExitCreate, cmdutil.ExitAirlock},
		{run.ExitNoExec, cmdutil.ExitNoExec}, {run.ExitNotFound, cmdutil.ExitNotFound}, {run.ExitOOM, cmdutil.ExitKilled}} {
		if c[0] != c[1] {
			t.Errorf("run's %d is the table's %d", c[0], c[1])
		}
	}
}
