package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// hostRepo makes a git repository with one commit at dir.
func hostRepo(t *testing.T, dir string) {
	t.Helper()
	for _, args := range [][]string{{"init", "-q", dir}, {"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "host"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}

// TestServeTenantHostPaths: a tenant's key names no host path outside the
// roots the admin granted it: not the daemon's data directory (admin.key,
// broker.key, airlock.db), not /root, not a host repository, not a root
// filesystem, layout or archive elsewhere, and not through a link inside
// its root, even one swapped in while the daemon looks. Refusals say
// nothing of the files. Inside its root, it works.
func TestServeTenantHostPaths(t *testing.T) {
	forEachWall(t, serveTenantHostPaths)
}

func serveTenantHostPaths(t *testing.T, w wallCase) {
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	root := testRoot(t)
	ws := filepath.Join(t.TempDir(), "ws") // under root
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "mine"), []byte("tenant file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Dir(ws)
	for link, target := range map[string]string{"leak": data, "shadow": "/etc/shadow", "up": "../../../../../../../" + strings.TrimPrefix(data, "/")} {
		if err := os.Symlink(target, filepath.Join(inside, link)); err != nil {
			t.Fatal(err)
		}
	}
	outsideRepo, err := os.MkdirTemp("", "airlock-host-repo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outsideRepo) })
	hostRepo(t, outsideRepo)
	adminKey, err := os.ReadFile(filepath.Join(data, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}

	// The admin grants only roots apart from the daemon's own directories.
	for _, bad := range [][]string{{data}, {filepath.Dir(data)}, {filepath.Join(data, "audit")}, {"/"}, {"relative"}, {filepath.Join(root, "missing")}} {
		_, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "bad", Roots: bad})
		wantCode(t, fmt.Sprintf("root %v", bad), err, api.CodeInvalidArgument)
	}
	an, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "alice", Roots: []string{root}})
	if err != nil {
		t.Fatal(err)
	}
	alice := d.client(t, an.Key)
	nobody, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "noroots"})
	if err != nil {
		t.Fatal(err)
	}
	bob := d.client(t, nobody.Key)

	hostPathsRefused(t, ctx, d, alice, bob, an.Key, data, inside, outsideRepo, adminKey)
	hostPathsGranted(t, ctx, alice, ws, inside)
	hostPathsSwapRace(t, ctx, alice, data, inside, adminKey)
}

// hostPathsRefused: every host path outside the tenant's root, by every
// door, is permission_denied, and says nothing of what is behind it.
func hostPathsRefused(t *testing.T, ctx context.Context, d *daemonProc, alice, bob *client.Client, aliceKey, data, inside, outsideRepo string, adminKey []byte) {
	if err := os.MkdirAll(filepath.Join(data, "snapshots"), 0o700); err != nil { // there to be reached, if it could be
		t.Fatal(err)
	}
	for _, req := range []api.CreateSandbox{
		{Workspace: data},
		{Workspace: "/root"},
		{Workspace: "/"},
		{Repo: outsideRepo},
		{Image: "/"},
		{Image: "oci:" + filepath.Join(data, "images")},
		{Image: "docker-archive:/etc/shadow"},
		{Image: "docker-archive:" + filepath.Join(data, "airlock.db")},
		{Workspace: filepath.Join(inside, "leak")},
		{Workspace: filepath.Join(inside, "leak", "audit")},
		{Workspace: filepath.Join(inside, "up")},
		{Image: "docker-archive:" + filepath.Join(inside, "shadow")},
		{Image: filepath.Join(inside, "leak")},
		{Repo: filepath.Join(inside, "leak")},
		// The daemon's snapshots, whose files a workspace is used from
		// without a copy (hostfiles.InSnapshots): named, or through a link.
		{Workspace: filepath.Join(data, "snapshots")},
		{Workspace: filepath.Join(inside, "leak", "snapshots")},
		{Image: filepath.Join(data, "snapshots")},
	} {
		sb, err := alice.CreateSandbox(ctx, &req)
		if err == nil {
			out, _, _ := run(t, alice, sb.ID, sh("cat /workspace/admin.key 2>&1; ls /workspace"))
			t.Errorf("create %+v: made %s (%q), want permission_denied", req, sb.ID, out)
			continue
		}
		wantCode(t, fmt.Sprintf("create %+v", req), err, api.CodePermissionDenied)
		if err != nil && strings.Contains(err.Error(), strings.TrimSpace(string(adminKey))) {
			t.Fatalf("the refusal holds the admin key: %v", err)
		}
		// The same door for the MCP spec, and for a tenant with no roots.
		wantCode(t, fmt.Sprintf("mcp spec %+v", req), alice.SetMCPSpec(ctx, &req), api.CodePermissionDenied)
		_, err = bob.CreateSandbox(ctx, &req)
		wantCode(t, fmt.Sprintf("no roots: %+v", req), err, api.CodePermissionDenied)
	}

	// A host file oracle? Missing, unreadable, a directory and a link out
	// answer alike.
	msgs := map[string]bool{}
	for _, p := range []string{filepath.Join(inside, "shadow"), filepath.Join(inside, "missing"), filepath.Join(inside, "ws"), filepath.Join(inside, "up")} {
		_, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Image: "docker-archive:" + p})
		wantCode(t, "docker-archive "+p, err, api.CodePermissionDenied)
		if err != nil {
			msgs[strings.ReplaceAll(err.Error(), p, "PATH")] = true
		}
	}
	if len(msgs) != 1 {
		t.Errorf("docker-archive refusals differ by the file behind them: %v", msgs)
	}

	// The MCP door: a session whose initialization names the data
	// directory gets no sandbox of it.
	hc := unixHTTP(d.sock, aliceKey)
	post := func(sid, body string) (string, string) { return mcpPost(t, hc, sid, body) }
	sid, _ := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"},"_meta":{"airlock/sandbox":{"workspace":"`+data+`"}}}}`)
	if sid != "" {
		post(sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		if _, out := post(sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"admin.key"}}}`); strings.Contains(out, strings.TrimSpace(string(adminKey))) || !strings.Contains(out, "roots the operator granted") {
			t.Errorf("an MCP session named the data directory: %s", out)
		}
	}
	for _, sb := range mustList(t, alice) {
		t.Errorf("a sandbox exists after the refusals: %+v", sb)
	}
}

// hostPathsGranted: inside the root, a workspace and a rootfs work.
func hostPathsGranted(t *testing.T, ctx context.Context, alice *client.Client, ws, inside string) {
	sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Workspace: ws})
	if err != nil {
		t.Fatalf("a workspace under the root: %v", err)
	}
	if out, _, _ := run(t, alice, sb.ID, sh("cat /workspace/mine")); out != "tenant file\n" {
		t.Errorf("the granted workspace: %q", out)
	}
	if err := alice.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// A rootfs directory of the root works too, but is not linked into a
	// snapshot: its files stay the tenant's, read only through the mount.
	rootfs := filepath.Join(inside, "rootfs")
	helper, _ := os.ReadFile(attackBin)
	for _, dir := range []string{"bin", "etc"} {
		_ = os.MkdirAll(filepath.Join(rootfs, dir), 0o755)
	}
	_ = os.WriteFile(filepath.Join(rootfs, "bin/attack"), helper, 0o755)
	sb, err = alice.CreateSandbox(ctx, &api.CreateSandbox{Image: rootfs})
	if err != nil {
		t.Fatalf("a rootfs under the root: %v", err)
	}
	if out, _, _ := run(t, alice, sb.ID, &api.Exec{Cmd: []string{"/bin/attack", "stat", "/bin/attack"}}); !strings.Contains(out, "/bin/attack") {
		t.Errorf("the granted rootfs: %q", out)
	}
	_, err = alice.Snapshot(ctx, sb.ID, "")
	wantCode(t, "a whole snapshot of a tenant's rootfs directory", err, api.CodeFailedPrecondition)
	if err := alice.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// hostPathsSwapRace: the workspace directory and a link to the data
// directory change places while creates run. What a sandbox sees is the
// directory or nothing, never the data directory.
func hostPathsSwapRace(t *testing.T, ctx context.Context, alice *client.Client, data, inside string, adminKey []byte) {
	race := filepath.Join(inside, "race")
	if err := os.Mkdir(race, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(race, "mine"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var flips atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		aside, link := filepath.Join(inside, "race.dir"), filepath.Join(inside, "race.link")
		for {
			select {
			case <-stop:
				_ = os.Remove(race)
				_ = os.Rename(aside, race)
				return
			default:
			}
			_ = os.Symlink(data, link)
			_ = os.Rename(race, aside)
			_ = os.Rename(link, race) // race is now a link to the data directory
			time.Sleep(time.Millisecond)
			_ = os.Remove(race)
			_ = os.Rename(aside, race)
			flips.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	made := 0
	for i := 0; i < 12; i++ {
		sb, err := alice.CreateSandbox(ctx, &api.CreateSandbox{Workspace: race})
		if err != nil {
			if code(err) != api.CodePermissionDenied {
				t.Errorf("race create: %v", err)
			}
			continue
		}
		made++
		out, _, _ := run(t, alice, sb.ID, sh("ls /workspace; cat /workspace/admin.key 2>/dev/null"))
		if strings.Contains(out, "admin.key") || strings.Contains(out, "airlock.db") || strings.Contains(out, strings.TrimSpace(string(adminKey))) {
			t.Errorf("the swap race showed the data directory: %q", out)
		}
		_ = alice.Destroy(ctx, sb.ID)
	}
	close(stop)
	wg.Wait()
	t.Logf("swap race: %d flips, %d of 12 creates made a sandbox", flips.Load(), made)
}

func mustList(t *testing.T, c interface {
	Sandboxes(context.Context) ([]*api.Sandbox, error)
}) []*api.Sandbox {
	t.Helper()
	l, err := c.Sandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestServeImageRegistries: a tenant's image reference makes the daemon
// call no registry the operator did not list, and a listed one only at an
// address the egress guard allows: a "registry" on loopback is never
// called, whatever the list says, and no registry's answer reaches the
// tenant.
func TestServeImageRegistries(t *testing.T) {
	forEachWall(t, func(t *testing.T, w wallCase) {
		const body = "LOOPBACK-SERVICE-BODY-5f1e"
		var calls atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, body)
		}))
		defer srv.Close()
		listed := strings.TrimPrefix(srv.URL, "http://")
		port := listed[strings.LastIndex(listed, ":")+1:]
		d := w.startDaemon(t, newDataDir(t), "--registry", listed, "--registry", "localhost:"+port)
		c := d.tenant(t, "img", api.Quotas{})
		ctx := context.Background()
		for _, ref := range []string{
			listed + "/x:latest",               // listed, but loopback
			"localhost:" + port + "/x:latest",  // listed by a name that resolves to loopback
			"127.0.0.1:1/x:latest",             // not listed
			"169.254.169.254/latest/meta:data", // not listed: metadata
			"docker.io/library/alpine:3.20",    // not listed
		} {
			_, err := c.CreateSandbox(ctx, &api.CreateSandbox{Image: ref})
			wantCode(t, ref, err, api.CodePermissionDenied)
			if err != nil && strings.Contains(err.Error(), body) {
				t.Errorf("%s: the answer holds the service's body: %v", ref, err)
			}
			var ae *api.Error
			if errors.As(err, &ae) && !strings.Contains(ae.Message, "--registry") && !strings.Contains(ae.Message, "never dials") {
				t.Errorf("%s: the refusal does not say what to do: %s", ref, ae.Message)
			}
		}
		if n := calls.Load(); n != 0 {
			t.Errorf("the loopback service was called %d times", n)
		}
	})
}
