package mount

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// nsHolder is what runs in a user namespace UserNS makes: the host's own
// true(1), which exits at once. Nothing a sandbox writes reaches it.
const nsHolder = "/bin/true"

// UserNS returns a new user namespace with the uid map uids and the gid
// map gids (uids when gids is nil), for the ownership of an idmapped mount
// (IdmappedTree). A user namespace needs a process to make it (a
// multi-threaded process cannot unshare one): os/exec clones nsHolder
// into it, writes the maps before it runs, and this opens the namespace
// through the child's pid while the child is not yet reaped (running or a
// zombie, its pid names it and no other), then reaps it. The namespace
// lives as long as the returned file.
func UserNS(uids, gids []syscall.SysProcIDMap) (*os.File, error) {
	if gids == nil {
		gids = uids
	}
	c := exec.Command(nsHolder)
	c.Env, c.Dir = []string{}, "/"
	c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: uids, GidMappings: gids}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("make a user namespace: %w", err)
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", c.Process.Pid))
	werr := c.Wait()
	if err == nil && werr != nil {
		ns.Close()
		err = werr
	}
	if err != nil {
		return nil, fmt.Errorf("make a user namespace: %s: %w", nsHolder, err)
	}
	return ns, nil
}
