package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// e2bDir is the Node test of the E2B front, with the pinned SDK
// (scripts/test.sh installs it: npm ci).
func e2bDir(t *testing.T) string {
	t.Helper()
	dir, _ := filepath.Abs("../e2b")
	_, nerr := exec.LookPath("node")
	_, merr := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	if nerr != nil || merr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node or the E2B SDK missing (run npm ci in test/e2b): %v %v", nerr, merr)
		}
		t.Skipf("node or the E2B SDK missing (run npm ci in test/e2b; under CI=true this fails): %v %v", nerr, merr)
	}
	return dir
}

// freeLoopback is a loopback address nothing listens on now.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// The unmodified E2B JS SDK (test/e2b/test.mjs) drives the daemon's E2B
// front: create, getInfo, setTimeout, list with filters and pages, pause
// and connect, snapshots, metrics, network fields, kill, isRunning;
// envd's commands (streams, exit codes, background, stdin, connect,
// timeout), pty and files (watch, signed URLs, 80 MiB); getHost(8000)
// reaching python's http.server; another tenant's key, a wrong token, a
// forged signature answered as a missing sandbox. The SDK signs in with
// the tenant's E2B-shaped key. The sandbox it leaves is then checked
// through airlock's own API: the same sandbox, with the SDK's environment
// and metadata; and the records of its commands and files calls are
// those of the same calls through airlock's API.
func TestE2BSDK(t *testing.T) {
	dir := e2bDir(t)
	addr := freeLoopback(t)
	data := newDataDir(t)
	d := startDaemon(t, data, "--e2b-listen", addr)
	d.waitLog(t, `"e2b":"`+addr+`"`)
	ctx := context.Background()
	var keys []string
	for _, name := range []string{"e2ba", "e2bb"} {
		tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tn.Key)
	}
	// The SDK signs in with tenant a's E2B-shaped key (airlock tenant
	// e2b-key), b with its airlock key.
	mint := exec.Command(airlockBin, "--state-dir", stateDir, "--data-dir", data, "tenant", "e2b-key", "e2ba")
	mint.Env = append(os.Environ(), "AIRLOCK_ADDRESS="+d.sock)
	e2bKey, err := mint.Output()
	if err != nil || !regexp.MustCompile(`^e2b_[0-9a-f]{40}\n$`).Match(e2bKey) {
		t.Fatalf("airlock tenant e2b-key: %q %v", e2bKey, err)
	}
	runID := fmt.Sprintf("run-%d", os.Getpid())
	cmd := exec.Command("node", "test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr,
		"E2B_API_KEY="+strings.TrimSpace(string(e2bKey)), "E2B_OTHER_KEY="+keys[1], "RUN="+runID)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("node test.mjs: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	t.Logf("node test.mjs:\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var res struct {
		Kept    string `json:"kept"`
		Audited string `json:"audited"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.Kept == "" || res.Audited == "" {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	a := d.client(t, keys[0])
	sb, err := a.Sandbox(ctx, res.Kept)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.Metadata["suite"] != runID || sb.Metadata["e2b.template"] != "base" || sb.Image != "host" {
		t.Errorf("the SDK's sandbox through airlock's API: %+v", sb)
	}
	if stdout, _, end := run(t, a, res.Kept, &api.Exec{Cmd: []string{"sh", "-c", "echo $FOO"}}); stdout != "bar\n" || end.ExitCode != 0 {
		t.Errorf("the SDK's envs: %q %+v", stdout, end)
	}
	// Only the kept sandbox is left of the run's.
	if live, err := a.Sandboxes(ctx); err != nil || len(live) != 1 || live[0].ID != res.Kept {
		t.Errorf("live sandboxes after the run: %v %v", live, err)
	}
	if err := a.Destroy(ctx, res.Kept); err != nil {
		t.Error(err)
	}
	// Its records are those of the same calls through airlock's API: the
	// front adds and skips none.
	recs, err := a.Audit(ctx, res.Kept, "")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	want := []string{"sandbox.created", "sandbox.extended", // setTimeout
		"sandbox.paused", "sandbox.extended", // pause, kept a day
		"sandbox.resumed", "sandbox.extended", // connect
		"exec.start", "exec.end", // echo back (none for the command refused while paused)
		"sandbox.snapshot", "exec.start", "exec.end", "sandbox.destroyed"}
	if !slices.Equal(kinds, want) {
		t.Errorf("records of the SDK's sandbox: %v, want %v", kinds, want)
	}

	// The SDK's commands and files calls (test.mjs audited()) against
	// the same calls through airlock's API: the same records, with the
	// same data but for the sandbox's id and times.
	sdk := auditOf(t, a, res.Audited)
	// As the front makes it: no network, its E2B metadata; commands as
	// the SDK runs them (bash -l -c, its 60 s default timeout).
	ref, err := a.CreateSandbox(ctx, &api.CreateSandbox{TTL: "300s", Network: api.Network{Mode: "none"},
		Metadata: map[string]string{"e2b.template": "base", "e2b.timeout": "300", "suite": runID + "-audit"}})
	if err != nil {
		t.Fatal(err)
	}
	if stdout, _, end := run(t, a, ref.ID, &api.Exec{Cmd: []string{"/bin/bash", "-l", "-c", "echo audit"}, Timeout: "1m0s"}); stdout != "audit\n" || end.ExitCode != 0 {
		t.Errorf("echo audit: %q %+v", stdout, end)
	}
	steps := []func() error{
		func() error { return a.WriteFile(ctx, ref.ID, "/workspace/audit.txt", []byte("x"), 0o644) },
		func() error { _, err := a.ReadFile(ctx, ref.ID, "/workspace/audit.txt"); return err },
		func() error { _, err := a.ListDir(ctx, ref.ID, "/workspace", 1); return err },
		func() error { _, err := a.Stat(ctx, ref.ID, "/workspace/audit.txt"); return err },
		func() error { _, err := a.MakeDir(ctx, ref.ID, "/workspace/ad"); return err },
		func() error {
			_, err := a.Move(ctx, ref.ID, "/workspace/audit.txt", "/workspace/ad/moved.txt")
			return err
		},
		func() error { return a.Remove(ctx, ref.ID, "/workspace/ad/moved.txt") },
		func() error { return a.Destroy(ctx, ref.ID) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	api := auditOf(t, a, ref.ID)
	if !slices.Equal(sdk, api) {
		t.Errorf("records of the SDK's calls:\n%s\nof the same through airlock's API:\n%s", strings.Join(sdk, "\n"), strings.Join(api, "\n"))
	}
}

// auditOf is sandbox id's records, each its kind and its data with the
// sandbox's id, exec and process ids, times and usage blanked.
func auditOf(t *testing.T, c *client.Client, id string) []string {
	t.Helper()
	recs, err := c.Audit(context.Background(), id, "")
	if err != nil {
		t.Fatal(err)
	}
	vary := regexp.MustCompile(`"(exec_id|pid|init_pid|duration_ms|expires|cpu_seconds|memory_peak_bytes)":("[^"]*"|[0-9.]+)`)
	var out []string
	for _, r := range recs {
		d := strings.ReplaceAll(string(r.Data), id, "ID")
		out = append(out, r.Kind+" "+vary.ReplaceAllString(d, `"$1":_`))
	}
	return out
}

// Off the SDKs' plain-HTTP local set-up: the E2B front over TLS (HTTP/2),
// sandboxes told apart by host (<port>-<id>.<domain>) as the SDKs address
// them with E2B_DOMAIN. A create answers the domain; envd's host with the
// access token reaches envd's routing (not the refusal), and with a wrong
// one, or for a missing sandbox, gets the one refusal.
func TestE2BFrontTLSHostRouting(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	addr := freeLoopback(t)
	_, port, _ := net.SplitHostPort(addr)
	domain := "e2b.test:" + port
	d := startDaemon(t, newDataDir(t), "--e2b-listen", addr, "--e2b-domain", domain, "--e2b-tls-cert", certFile, "--e2b-tls-key", keyFile)
	d.waitLog(t, `"e2b":"`+addr+`"`)
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "e2btls"})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{
		// Every name of the domain is this daemon, as wildcard DNS would have it.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
		ForceAttemptHTTP2: true,
	}}
	do := func(method, url string, hdr map[string]string, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.ProtoMajor != 2 {
			t.Errorf("%s %s: %s, want HTTP/2", method, url, res.Proto)
		}
		return res.StatusCode, string(b)
	}
	code, out := do("POST", "https://api."+domain+"/v2/sandboxes", map[string]string{"X-API-Key": tn.Key}, `{"timeout":300}`)
	var sb struct {
		SandboxID, Domain, EnvdAccessToken string
	}
	if err := json.Unmarshal([]byte(out), &sb); code != 201 || err != nil || sb.Domain != domain || !strings.HasPrefix(sb.EnvdAccessToken, "airlock_envd_") {
		t.Fatalf("create: %d %s", code, out)
	}
	defer func() { _ = d.client(t, tn.Key).Destroy(ctx, sb.SandboxID) }()
	refused := `{"code":502,"message":"sandbox not running"}` + "\n"
	envd := "https://49983-" + sb.SandboxID + "." + domain + "/health"
	if code, out := do("GET", envd, map[string]string{"X-Access-Token": sb.EnvdAccessToken}, ""); code == 502 || code == 404 {
		t.Errorf("envd with its token: %d %s", code, out)
	}
	for name, c := range map[string]struct{ url, token string }{
		"a wrong token":     {envd, sb.EnvdAccessToken + "x"},
		"a missing sandbox": {"https://49983-ffffffffffff." + domain + "/health", sb.EnvdAccessToken},
	} {
		if code, out := do("GET", c.url, map[string]string{"X-Access-Token": c.token}, ""); code != 502 || out != refused {
			t.Errorf("%s: %d %s", name, code, out)
		}
	}
}

// A server inside a sandbox, through the E2B front at <port>-<id>.<domain>
// (and the E2b-Sandbox-Id header): the owner's key (X-API-Key or
// Authorization), the sandbox's access token or an airlock port token
// (query, header, cookie) let a request in, and none of them reaches the
// server, which echoes every header it is sent; the server's own headers
// and query do. Another tenant's key, a forged token, a token for another
// port or another sandbox answer as a missing sandbox does and reach
// nothing. Every request let in is one port.connect record of the door
// e2b with the proof it came with.
func TestE2BPortsCarryNoCredentials(t *testing.T) {
	addr := freeLoopback(t)
	d := startDaemon(t, newDataDir(t), "--e2b-listen", addr)
	d.waitLog(t, `"e2b":"`+addr+`"`)
	ctx := context.Background()
	aliceKey, bobKey := tenantKey(t, d, "e2bpa"), tenantKey(t, d, "e2bpb")
	alice := d.client(t, aliceKey)
	create := func() (id, token string) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v2/sandboxes", strings.NewReader(`{"timeout":600}`))
		req.Header.Set("X-API-Key", aliceKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var sb struct{ SandboxID, EnvdAccessToken string }
		if err := json.NewDecoder(res.Body).Decode(&sb); err != nil || res.StatusCode != 201 {
			t.Fatalf("create: %d %v", res.StatusCode, err)
		}
		t.Cleanup(func() { _ = alice.Destroy(context.Background(), sb.SandboxID) })
		return sb.SandboxID, sb.EnvdAccessToken
	}
	id, access := create()
	other, otherAccess := create()
	startPortServer(t, alice, id)
	tok, err := alice.MintPortToken(ctx, id, 8000, "10m")
	if err != nil {
		t.Fatal(err)
	}
	tok8001, err := alice.MintPortToken(ctx, id, 8001, "10m")
	if err != nil {
		t.Fatal(err)
	}
	tokOther, err := alice.MintPortToken(ctx, other, 8000, "10m")
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{aliceKey, bobKey, access, tok.Token}
	host := "8000-" + id + "." + addr
	get := func(host, path string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, c := range []struct {
		name, host, path string
		hdr              []string
		wantAuth         string // the Authorization the server sees
	}{
		{"X-API-Key", host, "/headers?a=1", []string{"X-API-Key", aliceKey, "Authorization", "Basic app"}, "Basic app"},
		{"Authorization", host, "/headers?a=1", []string{"Authorization", "Bearer " + aliceKey}, ""},
		{"access token", host, "/headers?a=1", []string{"X-Access-Token", access, "X-API-Key", bobKey}, ""},
		{"routed by header", addr, "/headers?a=1", []string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "8000", "X-API-Key", aliceKey}, ""},
		{"token in the query", host, "/headers?airlock_token=" + tok.Token + "&a=1", nil, ""},
		{"token in the header", host, "/headers?a=1", []string{"X-Airlock-Port-Token", tok.Token, "X-Access-Token", "wrong"}, ""},
		{"token in a cookie", host, "/headers?a=1", []string{"Cookie", "app=1; airlock_port_token=" + tok.Token}, ""},
	} {
		code, body := get(c.host, c.path, c.hdr...)
		var seen struct {
			Path    string
			Headers map[string]string
		}
		if err := json.Unmarshal([]byte(body), &seen); code != 200 || err != nil || seen.Path != "/headers?a=1" {
			t.Errorf("%s: %d %s", c.name, code, body)
			continue
		}
		for k, v := range seen.Headers {
			for _, s := range secrets {
				if strings.Contains(v, s) {
					t.Errorf("%s: a credential reached the server: %s: %s", c.name, k, v)
				}
			}
			if strings.HasPrefix(strings.ToLower(k), "e2b-") {
				t.Errorf("%s: the front's routing reached the server: %s: %s", c.name, k, v)
			}
		}
		if got := seen.Headers["Authorization"]; got != c.wantAuth {
			t.Errorf("%s: the server saw Authorization %q, want %q", c.name, got, c.wantAuth)
		}
	}
	// Refusals: one answer, that of a missing sandbox's port.
	forged := tok.Token[:len(tok.Token)-2] + "AA"
	if forged == tok.Token {
		forged = tok.Token[:len(tok.Token)-2] + "BA"
	}
	wantCode, want := get("8000-ffffffffffff."+addr, "/headers", "X-API-Key", aliceKey)
	if wantCode != 502 {
		t.Fatalf("a missing sandbox's port: %d %s", wantCode, want)
	}
	for name, hdr := range map[string][]string{
		"another tenant's key":     {"X-API-Key", bobKey},
		"no key":                   nil,
		"a forged token":           {"X-Airlock-Port-Token", forged},
		"a token for another port": {"X-Airlock-Port-Token", tok8001.Token},
		"another sandbox's token":  {"X-Airlock-Port-Token", tokOther.Token},
		"a forged token, a key":    {"X-Airlock-Port-Token", forged, "X-API-Key", aliceKey},
		"a wrong access token":     {"X-Access-Token", access + "x"},
		"another sandbox's access": {"X-Access-Token", otherAccess},
	} {
		if code, body := get(host, "/headers", hdr...); code != wantCode || body != want {
			t.Errorf("%s: %d %s, want %d %s", name, code, body, wantCode, want)
		}
	}
	recs, err := alice.Audit(ctx, id, "port.connect")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range recs {
		var pc struct {
			Port       int
			Door, Auth string
		}
		_ = json.Unmarshal(rec.Data, &pc)
		got = append(got, fmt.Sprintf("%d %s %s", pc.Port, pc.Door, pc.Auth))
	}
	wantRecs := []string{"8000 e2b key", "8000 e2b key", "8000 e2b access-token", "8000 e2b key", "8000 e2b token", "8000 e2b token", "8000 e2b token"}
	if !slices.Equal(got, wantRecs) {
		t.Errorf("port.connect records: %v, want %v", got, wantRecs)
	}
}
