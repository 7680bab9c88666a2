package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
)

// An exit code `airlock audit` returns is the one Main reads: audit's
// exitError unwraps to cmdutil.ExitError.
func TestAuditExitCodeReachesMain(t *testing.T) {
	var ee cmdutil.ExitError
	if err := fmt.Errorf("verify: %w", exitError{3}); !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("errors.As: %+v", ee)
	}
}
