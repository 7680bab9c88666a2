package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/wall/gvisor"
)

// The daemon's tests run on every wall (forEachWall) through one switch:
// the daemon is started with the wall as the default of every create that
// names none (`airlock serve --default-isolation`), so a test's creates,
// through the API, the CLI or /mcp, are made on the wall without a word of
// the test changed; and at its end every sandbox the daemon made must have
// been on that wall, or the test fails.

// startDaemon is startDaemon with w the wall of the daemon's creates.
func (w wallCase) startDaemon(t *testing.T, data string, extra ...string) *daemonProc {
	t.Helper()
	return w.startDaemonWith(t, airlockBin, data, extra...)
}

// startDaemonWith is startDaemonWith with w the wall of the daemon's
// creates.
func (w wallCase) startDaemonWith(t *testing.T, bin, data string, extra ...string) *daemonProc {
	t.Helper()
	return startDaemonOpts(t, daemonOpts{bin: bin, wall: w}, data, extra...)
}

// initPid is the host pid a daemon records for sandbox id on w, the one
// it adopts: init's on the container wall, runsc run's on gvisor.
func (w wallCase) initPid(t *testing.T, id string) int {
	t.Helper()
	if w.name == "gvisor" {
		return gvisorPid(t, id)
	}
	return initPid(t, id)
}

// cgroupProcs lists the processes of sandbox id's cgroup on w.
func (w wallCase) cgroupProcs(id string) []int {
	sc := scope
	if w.name == "gvisor" {
		sc = gvisor.Scope(stateDir)
	}
	return cgroupProcsOf(sc, id)
}

// madeOnlyOn fails the test unless every sandbox the daemon's log records
// as created (by this daemon or an earlier one on its data directory) was
// made on wall.
func (d *daemonProc) madeOnlyOn(t *testing.T, wall string) {
	t.Helper()
	recs, err := d.admin.Audit(context.Background(), "", "sandbox.created")
	if err != nil {
		t.Errorf("the daemon's sandbox.created records: %v", err)
		return
	}
	for _, r := range recs {
		var data struct {
			Controls struct {
				Wall string `json:"wall"`
			} `json:"controls"`
		}
		if err := json.Unmarshal(r.Data, &data); err != nil || data.Controls.Wall != wall {
			t.Errorf("sandbox %s was made on the %q wall, not %s (%v)", r.Sandbox, data.Controls.Wall, wall, err)
		}
	}
}

// airlock serve --default-isolation gvisor: a create naming no wall, by
// the API or the CLI, is made on gvisor; one naming container gets
// container (a default, not a hold). A default the daemon cannot make (no
// such wall, no usable runsc) stops it from starting, saying why.
func TestServeDefaultIsolation(t *testing.T) {
	rs := needRunsc(t)
	d := startDaemon(t, newDataDir(t), "--default-isolation", "gvisor")
	ctx := context.Background()
	key := newTenantKey(t, d, "alice")
	alice := d.client(t, key)
	walls := map[string]string{}
	def, err := alice.CreateSandbox(ctx, &api.CreateSandbox{TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	walls[def.ID] = "gvisor"
	asked, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Isolation: "container", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	walls[asked.ID] = "container"
	r := cliOf(d, key)(t, "create", "--ttl", "5m")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	walls[strings.TrimSpace(r.stdout)] = "gvisor"
	for id, want := range walls {
		if got, err := alice.Sandbox(ctx, id); err != nil || got.Isolation != want {
			t.Errorf("%s: want %s, got %+v %v", id, want, got, err)
		}
		recs, err := alice.Audit(ctx, id, "sandbox.created")
		wantRec := fmt.Sprintf(`"wall":%q`, want)
		if want == "gvisor" {
			wantRec = fmt.Sprintf(`"wall":"gvisor","runsc":%q`, rs.Version)
		}
		if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Data), wantRec) {
			t.Errorf("%s: sandbox.created lacks %s: %v %+v", id, wantRec, err, recs)
		}
		if err := alice.Destroy(ctx, id); err != nil {
			t.Error(err)
		}
	}
	noResidue(t)

	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"serve", "--default-isolation", "vm"}, `--default-isolation "vm": must be container or gvisor`},
		{[]string{"--runsc", filepath.Join(t.TempDir(), "absent"), "serve", "--default-isolation", "gvisor"}, "--default-isolation gvisor: --isolation gvisor needs runsc"},
	} {
		data := newDataDir(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		args := append([]string{"--state-dir", stateDir, "--data-dir", data}, c.args...)
		out, err := exec.CommandContext(ctx, airlockBin, append(args, "--socket", filepath.Join(data, "airlock.sock"))...).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), c.says) {
			t.Errorf("%v: want a refusal saying %q: %v\n%s", c.args, c.says, err, out)
		}
		if _, err := os.Stat(filepath.Join(data, "airlock.sock")); err == nil {
			t.Errorf("%v: the daemon listened", c.args)
		}
	}
}

// mcpStdio is mcpStdio with the session's sandbox on w.
func (w wallCase) mcpStdio(t *testing.T, args ...string) (*sdk.ClientSession, *exec.Cmd, *syncBuffer) {
	t.Helper()
	return w.mcpStdioEnv(t, nil, args...)
}

// mcpStdioEnv is mcpStdioEnv with the session's sandbox on w.
func (w wallCase) mcpStdioEnv(t *testing.T, env []string, args ...string) (*sdk.ClientSession, *exec.Cmd, *syncBuffer) {
	t.Helper()
	return mcpStdioEnv(t, env, append(slices.Clone(w.flags), args...)...)
}
