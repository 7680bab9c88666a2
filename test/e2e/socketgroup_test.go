package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

// Regression (issue 14): `airlock mcp --daemon` (any client) "without
// root" could not connect: the socket is root's alone. With
// --socket-group the group's members open it (and still need a key for
// every call); anyone else is told the socket is not theirs.
func TestServeSocketGroup(t *testing.T) {
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skipf("no group to give the socket to here: %v", err)
	}
	gid, _ := strconv.Atoi(g.Gid)
	d := startDaemon(t, newDataDir(t), "--socket-group", "nogroup")
	var st syscall.Stat_t
	if err := syscall.Stat(d.sock, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o777 != 0o660 || int(st.Gid) != gid || st.Uid != 0 {
		t.Errorf("the socket is %o, %d:%d; want 660, 0:%d", st.Mode&0o777, st.Uid, st.Gid, gid)
	}
	tn, err := d.admin.CreateTenant(context.Background(), &api.CreateTenant{Name: "grouped"})
	if err != nil {
		t.Fatal(err)
	}
	// ps as uid 65534 with primary group pgid and groups.
	as := func(pgid uint32, groups []uint32) result {
		t.Helper()
		cmd := exec.Command(airlockBin, "--address", d.sock, "ps")
		cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY="+tn.Key, "HOME=/nonexistent")
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: pgid, Groups: groups}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		r := result{stdout: out.String(), stderr: errb.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := as(65533, []uint32{uint32(gid)}); r.code != 0 || !strings.Contains(r.stdout, "ID") {
		t.Errorf("a member of the socket's group: %s", r)
	}
	if r := as(65533, []uint32{}); r.code == 0 || !strings.Contains(r.stderr, "not yours to open") {
		t.Errorf("a user outside the group: %s", r)
	}
}
