// Package e2e runs airlock's cluster side against a real cluster on this
// machine, as root: kube-apiserver and etcd (scripts/kube.sh builds them;
// AIRLOCK_KUBE_BIN names their directory), agent-sandbox's CRDs from its
// module and airlock's own, three `airlock serve` daemons registered as
// the nodes n1..n3, and airlock-controller and airlock-gateway as processes
// of their own, so that kill -9 and restarts are real. TestMain starts all
// of it once; each test makes its own objects, in its own namespaces where
// it can, and removes them, checking the nodes for what it made.
//
// Without root or the binaries the tests skip; under CI=true they fail.
package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// suitePrefix names this suite's run directories (under os.TempDir()), so
// that a run reaps only what an earlier run of this suite left.
const suitePrefix = "airlock-k8s-e2e-"

// env is the cluster every test runs against.
var env *cluster

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	kubeBin := os.Getenv("AIRLOCK_KUBE_BIN")
	if kubeBin == "" {
		kubeBin = "/usr/local/lib/airlock/kube"
	}
	why := ""
	if os.Geteuid() != 0 {
		why = "these tests start airlock daemons and need root"
	} else {
		for _, b := range []string{"kube-apiserver", "etcd"} {
			if _, err := os.Stat(filepath.Join(kubeBin, b)); err != nil {
				why = fmt.Sprintf("no %s in %s (scripts/kube.sh builds it; AIRLOCK_KUBE_BIN names another directory)", b, kubeBin)
			}
		}
	}
	if why != "" {
		if os.Getenv("CI") == "true" {
			fmt.Println("k8s e2e: cannot run under CI=true:", why)
			return 1
		}
		fmt.Println("k8s e2e: skipped:", why)
		return 0
	}
	// The suite's clients log nothing (controller-runtime's complain
	// without a logger).
	ctrllog.SetLogger(logr.Discard())
	c, err := startCluster(kubeBin)
	if c != nil {
		defer c.stop()
	}
	if err != nil {
		fmt.Println("k8s e2e: the cluster did not start:", err)
		if c != nil {
			c.dumpLogs()
		}
		return 1
	}
	code := m.Run()
	if code != 0 {
		c.dumpLogs()
		if keep := os.Getenv("AIRLOCK_K8S_E2E_LOGS"); keep != "" {
			if out, err := exec.Command("cp", "-r", filepath.Join(c.dir, "logs"), keep).CombinedOutput(); err != nil {
				fmt.Printf("k8s e2e: keep the logs: %v %s\n", err, out)
			}
		}
	}
	return code
}

// scopeOf is the cgroup parent airlock gives a daemon's sandboxes for its
// state directory (internal/wall/container.Scope).
func scopeOf(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "airlock-" + hex.EncodeToString(sum[:4])
}

// reapStaleRuns ends what earlier runs of this suite left when they died
// before cleaning up (a test binary's timeout kills it outright; its
// processes die with it, the daemons' sandboxes do not): every process
// whose command line names a stale run's directory, every process in its
// daemons' cgroups, then the daemons' state through `airlock gc`. A run is
// stale when nobody holds its owner lock.
func reapStaleRuns(self, airlockBin string) {
	dirs, _ := filepath.Glob(filepath.Join(filepath.Dir(self), suitePrefix+"*"))
	for _, d := range dirs {
		if d == self {
			continue
		}
		if f, err := os.Open(filepath.Join(d, "owner.lock")); err == nil {
			held := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
			f.Close()
			if held {
				continue
			}
		} else if fi, err := os.Stat(d); err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue
		}
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			if b, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline"); bytes.Contains(b, []byte(d+"/")) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		states, _ := filepath.Glob(filepath.Join(d, "n*", "state"))
		for _, st := range states {
			killScope(scopeOf(st))
		}
		time.Sleep(100 * time.Millisecond)
		for _, st := range states {
			gcState(airlockBin, st, filepath.Join(filepath.Dir(st), "data"))
		}
		fmt.Printf("k8s e2e: reaped a stale run %s\n", d)
		_ = os.RemoveAll(d)
	}
}

// killScope kills every process in a daemon's sandbox cgroups.
func killScope(scope string) {
	for _, ctl := range []string{"pids", ""} {
		ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctl, scope))
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctl, scope, e.Name(), "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	}
}

// gcState removes what a daemon's dead sandboxes left (`airlock gc`) and
// unseals the copies of airlock its state holds, so that it can be removed.
func gcState(airlockBin, state, data string) {
	if out, err := exec.Command(airlockBin, "--state-dir", state, "--data-dir", data, "gc").CombinedOutput(); err != nil {
		fmt.Printf("k8s e2e: gc %s: %v\n%s", state, err, out)
	}
	ents, _ := os.ReadDir(filepath.Join(state, "exe"))
	for _, e := range ents {
		f, err := os.Open(filepath.Join(state, "exe", e.Name()))
		if err != nil {
			continue
		}
		if flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS); err == nil {
			_ = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags&^0x10) // FS_IMMUTABLE_FL
		}
		f.Close()
	}
}
