package tenant

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// A tenant names host paths only under the roots the operator granted it
// (the sandbox service holds its specs to them). Roots are checked here,
// when granted: absolute, existing directories, kept by their real path,
// never holding or lying in the daemon's own directories
// (Config.Reserved).

// MaxRoots caps a tenant's roots.
const MaxRoots = 64

// validRoots checks roots an admin grants a tenant and returns their real
// paths, sorted and without repeats.
func (s *Service) validRoots(in []string) ([]string, error) {
	if len(in) > MaxRoots {
		return nil, errdefs.Invalid(fmt.Sprintf("roots: at most %d", MaxRoots))
	}
	var out []string
	for _, r := range in {
		if !filepath.IsAbs(r) || strings.ContainsRune(r, 0) {
			return nil, errdefs.Invalid(fmt.Sprintf("root %q: must be an absolute path", r))
		}
		real, err := filepath.EvalSymlinks(r)
		if err != nil {
			return nil, errdefs.Invalid(fmt.Sprintf("root %q: %v", r, err))
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			return nil, errdefs.Invalid(fmt.Sprintf("root %q: not a directory", r))
		}
		if real == "/" {
			return nil, errdefs.Invalid("root \"/\": the whole host cannot be a tenant's root")
		}
		for _, d := range s.cfg.Reserved {
			if rd, err := filepath.EvalSymlinks(d); err == nil {
				d = rd
			}
			if spec.Within(real, d) || spec.Within(d, real) {
				return nil, errdefs.Invalid(fmt.Sprintf("root %q overlaps the daemon's own directory %s (its state, keys, database, images or audit log): grant a directory apart from it", r, d))
			}
		}
		if !slices.Contains(out, real) {
			out = append(out, real)
		}
	}
	slices.Sort(out)
	return out, nil
}

func rootsJSON(roots []string) string {
	if len(roots) == 0 {
		return ""
	}
	b, _ := json.Marshal(roots)
	return string(b)
}

func rootsOf(t store.Tenant) []string {
	var roots []string
	_ = json.Unmarshal([]byte(t.Roots), &roots)
	return roots
}
