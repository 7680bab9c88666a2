package image

import (
	"context"
	"fmt"
)

func (s *Store) resolveOCI(ctx context.Context, name string, progress func(string)) (*Layout, error) {
	return nil, fmt.Errorf("OCI images: not yet")
}
