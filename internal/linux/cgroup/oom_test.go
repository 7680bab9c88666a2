package cgroup

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// The OOM watch must fire when the kernel kills a process of the cgroup,
// whichever process that is (airlock then destroys the whole sandbox).
func TestWatchOOM(t *testing.T) {
	h := testHost(t)
	cg, err := h.Create("oom-test-"+strconv.Itoa(os.Getpid()), Limits{MemoryBytes: 32 << 20, CPUs: 1, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Remove()
	fired := make(chan struct{})
	stop, err := cg.WatchOOM(func() { close(fired) })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// A memory hog, placed in the cgroup before it allocates.
	hog := exec.Command("sh", "-c", "read x; tail /dev/zero")
	in, _ := hog.StdinPipe()
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	for _, ctl := range []string{"memory", "pids"} {
		if err := os.WriteFile(cg.Dir(ctl)+"/cgroup.procs", []byte(strconv.Itoa(hog.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	in.Write([]byte("go\n"))
	_ = hog.Wait()
	select {
	case <-fired:
	case <-time.After(3 * time.Second):
		t.Fatalf("no OOM notification; stats %+v", cg.Stats())
	}
}
