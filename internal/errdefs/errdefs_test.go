package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestClassesSurviveWrapping(t *testing.T) {
	err := fmt.Errorf("create: %w", Invalid("--memory: bad size"))
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("%v is not ErrInvalidArgument", err)
	}
	if errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v must not be ErrUnavailable", err)
	}
	if got := err.Error(); got != "create: --memory: bad size" {
		t.Fatalf("message = %q", got)
	}
}
