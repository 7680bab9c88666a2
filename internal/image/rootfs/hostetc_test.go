package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestHostEtcTemplate(t *testing.T) {
	dir := t.TempDir()
	first, err := hostEtcTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"etc/shadow", "etc/passwd", "etc/sudoers", "etc/ssh", "etc/hostname", "etc/environment"} {
		if _, err := os.Lstat(filepath.Join(first, p)); err == nil {
			t.Errorf("template holds %s", p)
		}
	}
	again, err := hostEtcTemplate(dir)
	if err != nil || again != first {
		t.Fatalf("unchanged host: template %s, then %s (%v)", first, again, err)
	}
	// Regression: a template built from another allowlist is stale even
	// though every entry it recorded is unchanged.
	saved := HostEtc
	t.Cleanup(func() { HostEtc = saved })
	HostEtc = append(append([]string{}, saved...), "/etc/hostname")
	third, err := hostEtcTemplate(dir)
	if err != nil || third == first {
		t.Fatalf("changed allowlist did not rebuild the template (%v)", err)
	}
	if _, err := os.Lstat(filepath.Join(third, "etc/hostname")); err != nil && fileExists("/etc/hostname") {
		t.Fatalf("rebuilt template lacks the new entry: %v", err)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Regression: concurrent creates (the daemon's) refreshing the template at
// once raced on one temporary link name, and some failed.
func TestHostEtcTemplateConcurrent(t *testing.T) {
	dir := t.TempDir()
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		go func() { _, err := hostEtcTemplate(dir); errs <- err }()
	}
	for i := 0; i < 16; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A link planted where the builders' lock goes is not followed: the build
// fails and the link's target is neither made nor written.
func TestHostEtcTemplateLockFollowsNoLink(t *testing.T) {
	dir, elsewhere := t.TempDir(), t.TempDir()
	target := filepath.Join(elsewhere, "victim")
	if err := os.Symlink(target, filepath.Join(dir, ".lock")); err != nil {
		t.Fatal(err)
	}
	if _, err := hostEtcTemplate(dir); err == nil {
		t.Fatal("a template was built through a planted lock link")
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("the link's target was made: %v", err)
	}
}
