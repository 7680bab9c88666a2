package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// UserNS's namespace maps as asked (an idmapped tree made with it shows
// its owners shifted by the maps), and the process that made it is reaped
// by the time it returns.
func TestUserNSMapsAsAskedAndLeavesNoProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("idmapped mounts need root")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "f"), 1000, 2000); err != nil {
		t.Fatal(err)
	}
	ns, err := UserNS(
		[]syscall.SysProcIDMap{{ContainerID: 1000, HostID: 301000, Size: 1}},
		[]syscall.SysProcIDMap{{ContainerID: 2000, HostID: 402000, Size: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", ns.Fd())); err != nil || !strings.HasPrefix(link, "user:[") {
		t.Fatalf("not a user namespace: %q %v", link, err)
	}
	if _, err := unix.Wait4(-1, nil, unix.WNOHANG, nil); err != unix.ECHILD {
		t.Fatalf("a child is left: wait4 %v", err)
	}
	fd, err := IdmappedTree(dir, int(ns.Fd()), true)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "f", &st, 0); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 301000 || st.Gid != 402000 {
		t.Fatalf("owner %d:%d through the idmapped tree, want 301000:402000", st.Uid, st.Gid)
	}
}
