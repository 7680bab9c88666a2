package bench

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDensityBwrap is BenchmarkDensity's peer (matched by `-bench
// Density` too, so both run in one go): as many idle bubblewrap sandboxes
// (bwrapArgs' namespaces and mounts, a shell that says it is up and then
// sleeps), started 8 at a time; what each costs the host once idle
// (MemAvailable), and how long killing them all takes (each sandbox's
// first process, and so its pid namespace) until every bwrap has seen it.
func BenchmarkDensityBwrap(b *testing.B) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed")
	}
	n := densityCount("container")
	// --info-fd 3 tells the sandbox's first process, which the kill
	// ends: its pid namespace, every process in it, goes with it, before
	// bwrap's wait for it returns.
	args := append([]string{"--info-fd", "3"}, bwrapArgs[:len(bwrapArgs)-1]...)
	args = append(args, "sh", "-c", "echo up; exec sleep 3600")
	type box struct {
		cmd   *exec.Cmd
		child int
	}
	var mu sync.Mutex
	var boxes []box
	defer func() {
		for _, x := range boxes {
			_ = x.cmd.Process.Kill()
			_ = x.cmd.Wait()
		}
	}()
	memBefore := memAvailable(b)
	start := time.Now()
	parallel(n, 8, func(i int) {
		c := exec.Command(bwrap, args...)
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := c.StdoutPipe()
		if err != nil {
			b.Error(err)
			return
		}
		ir, iw, err := os.Pipe()
		if err != nil {
			b.Error(err)
			return
		}
		defer ir.Close()
		c.ExtraFiles = []*os.File{iw}
		err = c.Start()
		iw.Close()
		if err != nil {
			b.Errorf("bwrap %d of %d: %v", i+1, n, err)
			return
		}
		var info struct {
			Child int `json:"child-pid"`
		}
		derr := json.NewDecoder(ir).Decode(&info)
		mu.Lock()
		boxes = append(boxes, box{c, info.Child})
		mu.Unlock()
		if derr != nil || info.Child <= 0 {
			b.Errorf("bwrap %d of %d: its info: %+v %v", i+1, n, info, derr)
			return
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "up\n" {
			b.Errorf("bwrap %d of %d did not come up: %q %v", i+1, n, line, err)
		}
	})
	made := time.Since(start)
	if b.Failed() {
		return
	}
	time.Sleep(10 * time.Second) // idle, as BenchmarkDensity's sandboxes
	memAfter := memAvailable(b)
	start = time.Now()
	for _, x := range boxes {
		_ = syscall.Kill(x.child, syscall.SIGKILL)
	}
	for _, x := range boxes {
		_ = x.cmd.Wait()
	}
	killed := time.Since(start)
	boxes = nil
	b.ReportMetric(float64(n)/made.Seconds(), "creates/s")
	b.ReportMetric(float64(memBefore-memAfter)/float64(n)/(1<<20), "host-MiB/sandbox")
	b.ReportMetric(killed.Seconds(), "kill-all-s")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d bwrap sandboxes: made at %.0f/s; idle, each costs the host %.2f MiB (MemAvailable); all killed and reaped in %.2f s",
		n, float64(n)/made.Seconds(), float64(memBefore-memAfter)/float64(n)/(1<<20), killed.Seconds())
}
