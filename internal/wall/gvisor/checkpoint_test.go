package gvisor

import (
	"errors"
	"os"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"golang.org/x/sys/unix"
)

// longLived is a long-lived sandbox's options and layout, with its ids,
// network namespace, paths, env and hostname those of one sandbox.
func longLived(ids idRange, netns, dir string) (*wall.Options, layout) {
	o := hostImage()
	o.Argv = nil
	o.AgentSocket = dir + "/agents/x.sock"
	o.KeepCaps = []int{unix.CAP_SETUID, unix.CAP_SETGID}
	o.Env = []string{"PATH=/usr/bin", "HTTP_PROXY=http://" + dir}
	o.Hostname = "airlock-" + dir
	l := testLayout()
	l.Root, l.Workspace, l.Tmp, l.Home = dir+"/gen", dir+"/ws", dir+"/tmp", dir+"/home"
	l.Bin, l.Agent, l.IDs, l.NetNS = dir+"/bin", dir+"/agent", ids, netns
	return o, l
}

// A restore's spec may differ from the checkpointed one only in what is
// per sandbox (host ids, host paths, env, hostname, gvisor-init's
// configuration, tmpfs sizes); any other difference is refused.
func TestRestoreMismatchAllowsOnlyWhatIsPerSandbox(t *testing.T) {
	spec := func(ids idRange, netns, dir string, change func(*wall.Options, *layout)) *ociSpec {
		t.Helper()
		o, l := longLived(ids, netns, dir)
		if change != nil {
			change(o, &l)
		}
		if netns != "" {
			f, err := os.Open("/proc/self/ns/net")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			o.NetNS = f
		}
		s, err := bundleSpec(o, l)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	saved := spec(testIDs, "", "/a", nil)
	other := idRange{Base: testIDs.Base + 65536, Size: testIDs.Size}
	if err := restoreMismatch(saved, spec(other, "", "/b", func(o *wall.Options, _ *layout) { o.DiskBytes *= 2 })); err != nil {
		t.Errorf("another sandbox's ids, paths, env, hostname and disk: %v", err)
	}
	if err := restoreMismatch(saved, spec(other, "/proc/1/fd/7", "/b", nil)); err != nil {
		t.Errorf("restored into a network namespace: %v", err)
	}
	for name, change := range map[string]func(*wall.Options, *layout){
		"writable rootfs": func(o *wall.Options, l *layout) { o.Writable, l.TreesRW = true, true },
		"another tree": func(o *wall.Options, l *layout) {
			o.Trees, l.Trees = append(o.Trees, wall.Tree{HostPath: "/opt", Target: "/opt"}), append(l.Trees, "/opt")
		},
		"more capabilities": func(o *wall.Options, _ *layout) { o.KeepCaps = append(o.KeepCaps, unix.CAP_CHOWN) },
		"another cwd":       func(o *wall.Options, _ *layout) { o.Cwd = "/tmp" },
		"a smaller range":   func(_ *wall.Options, l *layout) { l.IDs.Size /= 2 },
		"more processes":    func(o *wall.Options, _ *layout) { o.NProc = 4096 },
	} {
		err := restoreMismatch(saved, spec(other, "", "/b", change))
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}
