package e2e

import (
	"strings"
	"testing"
)

// A command's end ends what it left in its process group ("cmd &"), and
// init reaps it: init's main thread kills the group as it reaps the
// command, and collects the orphans re-parented to it, on SIGCHLD.
func TestServeExecEndsItsProcessGroup(t *testing.T) { forEachWall(t, execEndsItsGroup) }

func execEndsItsGroup(t *testing.T, w wallCase) {
	d := w.startDaemon(t, newDataDir(t))
	cli := cliOf(d, newTenantKey(t, d, "pgroup"))
	r := cli(t, "create", "--ttl", "10m")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	r = cli(t, "exec", id, "--", "sh", "-c", "sleep 1000 & echo $!")
	pid := strings.TrimSpace(r.stdout)
	if r.code != 0 || pid == "" {
		t.Fatalf("exec: %s", r)
	}
	// Killed before the end was reported, then reaped as init's orphan:
	// its /proc entry goes (the wait ends at the exec's timeout, 124, if
	// it never does).
	r = cli(t, "exec", "--timeout", "60s", id, "--", "sh", "-c", "while [ -e /proc/"+pid+" ]; do sleep 0.05; done")
	if r.code != 0 {
		t.Fatalf("the background child %s of an ended command lives on: %s", pid, r)
	}
	// Commands still start and end after init reaped an orphan.
	if r = cli(t, "exec", id, "--", "sh", "-c", "exit 3"); r.code != 3 {
		t.Fatalf("exec after: %s", r)
	}
}
