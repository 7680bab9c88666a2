// Package landlock wraps go-landlock for airlock: the sandbox may read and
// execute everywhere in its own root, and write only under the paths it is
// given. Only x/sys and go-landlock are imported.
package landlock

import (
	"fmt"

	ll "github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// MinABI is the oldest Landlock ABI airlock enforces with: V3 handles file
// truncation, without which O_TRUNC would be a way around the write rules.
const MinABI = 3

// ABI returns the kernel's Landlock ABI version, 0 when it has none.
func ABI() int {
	v, err := llsys.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

// Restrict confines every thread of the calling process, and its future
// children: read and execute under "/", write only under rwDirs (where
// renames and links across directories are allowed) and to rwFiles. With
// ABI 6 and later it also scopes abstract unix sockets and signals to the
// sandbox's own Landlock domain.
func Restrict(rwDirs, rwFiles []string) error {
	abi := ABI()
	if abi < MinABI {
		return fmt.Errorf("landlock: kernel ABI %d, need at least %d", abi, MinABI)
	}
	base := configFor(abi)
	// One ruleset for the filesystem and, with ABI 6 and later, the IPC
	// scopes. Not two: REFER is denied by every ruleset that does not grant
	// it, so a second, scope-only ruleset would refuse every rename across
	// directories. Network rights are left unhandled (the sandbox's network
	// namespace is the control there).
	args := []any{base.HandledAccessFS}
	if abi >= 6 {
		args = append(args, base.Scoped)
	}
	cfg, err := ll.NewConfig(args...)
	if err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	rules := []ll.Rule{ll.RODirs("/")}
	if len(rwDirs) > 0 {
		// WithRefer: renames and links across directories (dpkg, git, pip).
		rules = append(rules, ll.RWDirs(rwDirs...).WithIoctlDev().WithRefer())
	}
	if len(rwFiles) > 0 {
		rules = append(rules, ll.RWFiles(rwFiles...).WithIoctlDev().IgnoreIfMissing())
	}
	if err := cfg.Restrict(rules...); err != nil {
		return fmt.Errorf("landlock: restrict: %w", err)
	}
	return nil
}

func configFor(abi int) ll.Config {
	switch {
	case abi >= 7:
		return ll.V7
	case abi == 6:
		return ll.V6
	case abi == 5:
		return ll.V5
	case abi == 4:
		return ll.V4
	default:
		return ll.V3
	}
}
