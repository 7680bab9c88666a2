package bench

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// wsTree is a workspace the benchmark copies.
type wsTree struct {
	name  string
	files int
	size  int // bytes each
}

var wsTrees = []wsTree{
	{"empty", 0, 0},
	{"1000x1MiB", 1000, 1 << 20},
	{"20000x4KiB", 20000, 4 << 10},
}

// makeTree writes t under dir: files of random-looking data, 100 to a
// directory.
func makeTree(b *testing.B, dir string, t wsTree) {
	b.Helper()
	buf := make([]byte, t.size)
	for i := range buf {
		buf[i] = byte(i*7 + i/251)
	}
	for i := 0; i < t.files; i++ {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		buf[0], buf[1] = byte(i), byte(i>>8) // no two files alike
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// allocated is the bytes dir's files take on disk.
func allocated(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			if fi, err := d.Info(); err == nil {
				n += fi.Sys().(*syscall.Stat_t).Blocks * 512
			}
		}
		return nil
	})
	return n
}

// BenchmarkWorkspaceCreate measures what freezing --workspace at create
// costs: `airlock run --workspace DIR -- true` for an empty directory, a
// 1 GiB tree of 1,000 files and a tree of 20,000 small files, side by side
// with `cp -a --reflink=auto` of the same tree (the floor of a copy) and
// the disk the copy takes while the sandbox lives.
func BenchmarkWorkspaceCreate(b *testing.B) {
	tmp, err := os.MkdirTemp("", "airlock-bench-ws-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	// The sandbox's init, in its own user namespace, passes through it.
	if err := os.Chmod(tmp, 0o711); err != nil {
		b.Fatal(err)
	}
	data, state := filepath.Join(tmp, "data"), filepath.Join(tmp, "state")
	al := func(args ...string) *exec.Cmd {
		return exec.Command(airlockBin, append([]string{"--data-dir", data, "--state-dir", state}, args...)...)
	}
	defer al("gc").Run()
	runs := max(b.N, 5)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var emptyMS float64
	for _, t := range wsTrees {
		dir := filepath.Join(tmp, t.name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		makeTree(b, dir, t)
		// Warm: the host image's /etc, the page cache of the tree.
		if out, err := al("run", "--workspace", dir, "--", "true").CombinedOutput(); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		var create, cp []sample
		for i := 0; i < runs; i++ {
			start := time.Now()
			if out, err := al("run", "--workspace", dir, "--", "true").CombinedOutput(); err != nil {
				b.Fatalf("%v\n%s", err, out)
			}
			create = append(create, sample{wall: time.Since(start)})
			dst := filepath.Join(tmp, "cp")
			start = time.Now()
			if out, err := exec.Command("cp", "-a", "--reflink=auto", dir, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v\n%s", err, out)
			}
			cp = append(cp, sample{wall: time.Since(start)})
			if err := os.RemoveAll(dst); err != nil {
				b.Fatal(err)
			}
		}
		disk := copyDisk(b, al, dir, data)
		c := median(create, func(s sample) float64 { return ms(s.wall) })
		p := median(cp, func(s sample) float64 { return ms(s.wall) })
		if t.name == "empty" {
			emptyMS = c
		}
		b.ReportMetric(c, t.name+"-create-ms")
		b.ReportMetric(p, t.name+"-cp-ms")
		b.ReportMetric(float64(disk)/(1<<20), t.name+"-copy-MiB")
		b.Logf("%s (%d runs): airlock run --workspace -- true median %.0f ms (+%.0f ms over an empty workspace); cp -a --reflink=auto %.0f ms; the copy takes %.1f MiB on disk (the tree %.1f MiB)",
			t.name, runs, c, c-emptyMS, p, float64(disk)/(1<<20), float64(allocated(dir))/(1<<20))
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(0, "ns/op")
}

// copyDisk is the disk that a live sandbox's copy of dir takes under
// data/tmp.
func copyDisk(b *testing.B, al func(...string) *exec.Cmd, dir, data string) int64 {
	b.Helper()
	cmd := al("run", "--workspace", dir, "--", "sh", "-c", "echo ready; read x")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("sandbox said %q: %v", line, err)
	}
	n := allocated(filepath.Join(data, "tmp"))
	_, _ = io.WriteString(stdin, "\n")
	return n
}
