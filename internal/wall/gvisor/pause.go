package gvisor

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// A gVisor sandbox is frozen (pause, and the host's reads of its layers:
// download, diff, snapshot) by its own kernel, not by the cgroup freezer:
// `runsc pause` has the Sentry stop every task of the sandbox and waits
// until they and their I/O have stopped, so nothing in the sandbox runs or
// writes until `runsc resume`. The cgroup freezer would freeze the Sentry's
// systrap stubs too, and it interrupts the seccomp notification each stub's
// system-call thread waits in: the kernel issues a new one, the Sentry
// answers the old one, fails, and kills the stub, and the sandbox dies at
// its next page fault ("systrap corrupted memory: subprocess died"). gVisor
// of 2026-09 answers again after such a failure, but still takes the
// spurious ENOENT a later receive gets after an interruption for the stub's
// death: with it, a few freezes still killed sandboxes here.

// Freeze stops every task of the sandbox (runsc pause).
func (sb *Sandbox) Freeze() error { return sb.runscCall("pause") }

// Thaw resumes them (runsc resume).
func (sb *Sandbox) Thaw() error { return sb.runscCall("resume") }

// Frozen reports whether runsc says the sandbox is paused.
func (sb *Sandbox) Frozen() bool {
	out, err := exec.Command(sb.w.runsc, "--root", filepath.Join(sb.w.dir, runscRoot), "state", sb.id).Output()
	if err != nil {
		return false
	}
	var st struct {
		Status string `json:"status"`
	}
	return json.Unmarshal(out, &st) == nil && st.Status == "paused"
}

// runscCall runs `runsc CMD ID` on the sandbox.
func (sb *Sandbox) runscCall(cmd string) error {
	out, err := exec.Command(sb.w.runsc, "--root", filepath.Join(sb.w.dir, runscRoot), cmd, sb.id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc %s: %v: %s", cmd, err, strings.TrimSpace(string(out)))
	}
	return nil
}
