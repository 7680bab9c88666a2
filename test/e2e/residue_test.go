package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/wall/container"
)

// An unrelated airlock (its own state and data directories, its own
// daemon) running a sandbox on the host is none of the residue checks'
// business: they pass beside it. And they still catch a sandbox of the
// suite's own left running, by its processes too, so that scoping them
// cannot make them vacuous.
func TestSuiteIgnoresOtherAirlocks(t *testing.T) {
	ctx := context.Background()
	other := otherAirlockDir(t)
	otherState := filepath.Join(other, "run")
	od := startDaemonOpts(t, daemonOpts{bin: airlockBin, stateDir: otherState}, filepath.Join(other, "lib"))
	oc := od.tenant(t, "other", api.Quotas{})
	osb, err := oc.CreateSandbox(ctx, &api.CreateSandbox{Network: api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	bg, err := oc.ExecStream(ctx, osb.ID, &api.Exec{Cmd: []string{"sleep", "1000"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bg.Next(); err != nil {
		t.Fatal(err)
	}
	bg.Close()
	// What a host-wide check would take for residue: processes running as
	// a sandbox uid, cgroups, a veth on the host.
	theirs := sandboxProcs(container.Scope(otherState))
	if len(theirs) < 2 {
		t.Fatalf("the other airlock's sandbox runs %v as sandbox uids, want init (with its agent) and sleep", theirs)
	}
	if _, err := net.InterfaceByName("alk" + osb.ID[:10] + "h"); err != nil {
		t.Fatalf("the other airlock's sandbox has no veth on the host: %v", err)
	}
	noResidue(t)
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := residueCheck(true)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the final residue check beside another airlock: %v", err)
		}
	}

	// A sandbox of the suite's own, left running by its killed daemon.
	data := newDataDir(t)
	d := startDaemon(t, data)
	mine, err := d.tenant(t, "mine", api.Quotas{}).CreateSandbox(ctx, &api.CreateSandbox{})
	if err != nil {
		t.Fatal(err)
	}
	d.kill9()
	pid := initPid(t, mine.ID)
	err = residue()
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("process %d ", pid)) || !strings.Contains(err.Error(), filepath.Join(scope, mine.ID)) {
		t.Errorf("a sandbox of the suite's own (init %d) left running: residue %v", pid, err)
	}
	for _, p := range theirs {
		if err != nil && strings.Contains(err.Error(), fmt.Sprintf("process %d ", p)) {
			t.Errorf("the other airlock's process %d counts as residue: %v", p, err)
		}
	}
	// The next daemon adopts it; its kill switch ends it.
	d = startDaemon(t, data)
	if _, err := d.admin.KillAll(ctx, ""); err != nil {
		t.Fatal(err)
	}
	noResidue(t)
	if got, err := oc.Sandbox(ctx, osb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("the other airlock's sandbox after all this: %+v %v", got, err)
	}
}

// otherAirlockDir makes the directories of an unrelated airlock: outside
// the suite's, and held (owner.lock) while the test runs so that no
// concurrent run of the suite reaps it; a later run finds it unheld if
// this one dies, and reaps it as it reaps its own stale runs.
func otherAirlockDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "airlock-e2e-other-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o711)
	owner, err := os.Create(filepath.Join(dir, "owner.lock"))
	if err != nil || syscall.Flock(int(owner.Fd()), syscall.LOCK_EX) != nil {
		t.Fatal("owner lock: ", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "lib"), 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command(airlockBin, "--state-dir", filepath.Join(dir, "run"), "--data-dir", filepath.Join(dir, "lib"), "gc").Run()
		unsealExes(filepath.Join(dir, "run", "exe"))
		owner.Close()
		_ = os.RemoveAll(dir)
	})
	return dir
}

// sandboxProcs lists the processes running as a sandbox uid in the
// cgroups under parent sc.
func sandboxProcs(sc string) []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+p.Name(), &st) != nil || st.Uid < 1<<30 {
			continue
		}
		cg, _ := os.ReadFile("/proc/" + p.Name() + "/cgroup")
		if strings.Contains(string(cg), ":/"+sc+"/") {
			out = append(out, pid)
		}
	}
	return out
}
