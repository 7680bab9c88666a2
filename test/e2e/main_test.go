// Package e2e drives the real airlock binary, as root, against the real
// kernel: every control of the engine is attacked from inside a sandbox and
// must hold. It builds airlock and the attack helper (test/attack) once.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/wall/container"
	"golang.org/x/sys/unix"
)

var (
	scope      string // the test state directory's cgroup parent and nftables prefix
	suiteDir   string // holds every state, data and binary of this run of the suite
	airlockBin string
	attackBin  string
	stateDir   string
	dataDir    string
	// ownerLock is held (flock) for as long as this run lives: a variable
	// of the package, so that no finalizer closes it, and with it the
	// lock, while the run goes on (another run would take its directory
	// for stale, kill its processes and remove it).
	ownerLock *os.File
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipped: these tests create namespaces, cgroups and mounts and need root")
		os.Exit(0)
	}
	tmp, err := os.MkdirTemp("", "airlock-e2e-")
	if err != nil {
		panic(err)
	}
	// The run's claim on its directory, taken before anything else (the
	// build takes a while): another run of the suite starting meanwhile
	// reaps only directories whose owner is gone.
	if ownerLock, err = os.Create(filepath.Join(tmp, "owner.lock")); err != nil || syscall.Flock(int(ownerLock.Fd()), syscall.LOCK_EX) != nil {
		panic(fmt.Sprint("owner lock: ", err))
	}
	// Sandboxes' unprivileged roots traverse the state directory.
	_ = os.Chmod(tmp, 0o711)
	suiteDir = tmp
	airlockBin = filepath.Join(tmp, "airlock")
	attackBin = filepath.Join(tmp, "attack")
	stateDir = filepath.Join(tmp, "run")
	scope = container.Scope(stateDir)
	dataDir = filepath.Join(tmp, "lib")
	// `airlock run` keeps its audit logs under the user's state directory:
	// the suite's own, not root's.
	os.Setenv("XDG_STATE_HOME", filepath.Join(tmp, "state"))
	root, _ := filepath.Abs("../..")
	// airlock runs the airlock-init beside it in every sandbox.
	for bin, pkg := range map[string]string{airlockBin: "./cmd/airlock", filepath.Join(tmp, "airlock-init"): "./cmd/airlock-init", attackBin: "./test/attack"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Printf("build %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	reapStaleRuns(tmp)
	code := m.Run()
	if code == 0 {
		// The kernel tears a pid namespace down asynchronously: give the
		// last sandbox's processes a moment to be gone.
		err := residueCheck(true)
		for i := 0; err != nil && i < 100; i++ {
			time.Sleep(20 * time.Millisecond)
			err = residueCheck(true)
		}
		if err != nil {
			fmt.Println("e2e: residue after all tests:", err)
			code = 1
		}
	}
	_ = exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", dataDir, "gc").Run()
	unsealExes(filepath.Join(stateDir, "exe"))
	_ = os.RemoveAll(tmp)
	os.Exit(code)
}

// result of one airlock invocation.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// airlock runs the binary with the test's state and data directories.
func airlock(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := append([]string{"--state-dir", stateDir, "--data-dir", dataDir}, args...)
	cmd := exec.CommandContext(ctx, airlockBin, full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("airlock %v: %v", args, err)
	}
	return r
}

// workspace returns a fresh host directory holding the attack helper.
func workspace(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(attackBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "attack"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// attack runs the helper's case inside a sandbox and fails the test on any
// VULNERABLE line or unexpected exit.
func attack(t *testing.T, extra []string, args ...string) result {
	t.Helper()
	full := append([]string{"run", "--workspace", workspace(t)}, extra...)
	full = append(full, "--", "/workspace/attack")
	r := airlock(t, "", append(full, args...)...)
	if strings.Contains(r.stdout, "VULNERABLE") || r.code != 0 {
		t.Errorf("attack %v (%v):\n%s", args, extra, r)
	}
	return r
}

// reapStaleRuns ends what earlier runs of this suite left behind when they
// died before cleaning up (a test timeout kills the binary outright): their
// daemons, and the sandboxes those daemons left running by design. A run
// is stale when nobody holds its owner lock. Only processes of those runs'
// own state directories and cgroups are touched.
func reapStaleRuns(self string) {
	dirs, _ := filepath.Glob(filepath.Join(filepath.Dir(self), "airlock-e2e-*"))
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
			// A run that made its directory a moment ago and has not
			// taken its lock yet is alive.
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
		sc := container.Scope(filepath.Join(d, "run"))
		for _, ctl := range []string{"pids", ""} {
			ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctl, sc))
			for _, e := range ents {
				b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctl, sc, e.Name(), "cgroup.procs"))
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
		out, err := exec.Command(airlockBin, "--state-dir", filepath.Join(d, "run"), "--data-dir", filepath.Join(d, "lib"), "gc").CombinedOutput()
		fmt.Printf("e2e: reaped a stale run %s: %s %v\n", d, bytes.TrimSpace(out), err)
		unsealExes(filepath.Join(d, "run", "exe"))
		_ = os.RemoveAll(d)
	}
}

// unsealExes clears the immutable attribute of the copies of airlock that
// a test state directory holds (runtime's sealed binaries), so that the
// directory can be removed.
func unsealExes(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS); err == nil {
			_ = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags&^0x10) // FS_IMMUTABLE_FL
		}
		f.Close()
	}
}
