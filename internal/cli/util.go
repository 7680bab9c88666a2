package cli

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errdefs.Invalid(fmt.Sprintf("--timeout %q: want a duration such as 30s, 5m or 1h", s))
	}
	return d, nil
}

func absPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return a, nil
}
