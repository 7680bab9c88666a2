package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/test/fakenet"
)

// reqScript makes one HTTP request from inside a sandbox (through the
// proxy variables): METHOD URL [H:Name=value] [body=...] [ca=FILE]; {VAR}
// in a value is the variable's value. It prints the status and the body.
const reqScript = `import os, re, ssl, sys, urllib.request, urllib.error
sub = lambda v: re.sub(r"\{(\w+)\}", lambda m: os.environ.get(m.group(1), ""), v)
method, url = sys.argv[1], sub(sys.argv[2])
headers, body, ctx = {}, None, None
for a in sys.argv[3:]:
    k, v = a.split("=", 1)
    if k.startswith("H:"):
        headers[k[2:]] = sub(v)
    elif k == "body":
        body = sub(v).encode()
    elif k == "ca":
        ctx = ssl.create_default_context(cafile=v)
try:
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method, headers=headers), context=ctx, timeout=15) as r:
        print(r.status, r.read().decode().strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
except Exception as e:
    print("ERR", e)
`

// TestServeCredentialBroker is the coding-run example end to end, against
// a fake API host and a git smart-HTTP server in the fake internet: the
// real credentials arrive only on requests their grants cover, the
// placeholders are worthless everywhere else and after destroy, and the
// secret scanner stops pasted keys.
// brokerRig is what TestServeCredentialBroker's parts share: the daemon,
// the tenant's client and its sandbox with three grants, their
// placeholders, and helpers that run commands in a sandbox and read what
// the fake API host saw last.
type brokerRig struct {
	ctx       context.Context
	fi        *fakeInternet
	d         *daemonProc
	c         *client.Client
	apiSecret string
	apiGrant  api.Grant
	sb        *api.Sandbox
	created   time.Time
	tokens    map[string]string
	sh        func(c *client.Client, id, script string, env map[string]string) string
	req       func(c *client.Client, id string, env map[string]string, args ...string) string
	lastSeen  func() string
}

func TestServeCredentialBroker(t *testing.T) {
	forEachWall(t, serveCredentialBroker)
}

func serveCredentialBroker(t *testing.T, w wallCase) {
	fi := &fakeInternet{Internet: fakenet.New(t)}
	data := newDataDir(t)
	opts := daemonOpts{bin: airlockBin, fi: fi, env: []string{"SSL_CERT_FILE=" + fi.CAFile}, wall: w}
	d := startDaemonOpts(t, opts, data, "--dns-upstream", "192.0.2.53:53", "--egress-allow-net", "192.0.2.0/24")
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: "acme", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t, tn.Key)
	apiSecret := "sk_live_" + strings.Repeat("Q7xR", 6)

	// The secrets API: sealed, listed by name, never returned.
	if _, err := c.AddSecret(ctx, "api-key", apiSecret); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddSecret(ctx, "git-ro", "wrong-value-first"); err != nil {
		t.Fatal(err)
	}
	if sec, err := c.RotateSecret(ctx, "git-ro", fi.GitPassword); err != nil || sec.Version != 2 {
		t.Fatalf("rotate: %+v %v", sec, err)
	}
	_, err = c.AddSecret(ctx, "api-key", "again")
	wantCode(t, "a second secret of one name", err, api.CodeAlreadyExists)
	_, err = c.AddSecret(ctx, "bad", "line\r\nX-Injected: 1")
	wantCode(t, "a value with a line break", err, api.CodeInvalidArgument)
	_, err = c.AddSecret(ctx, "../etc", "x")
	wantCode(t, "a bad name", err, api.CodeInvalidArgument)
	_, err = c.RotateSecret(ctx, "nope", "x")
	wantCode(t, "rotating a missing secret", err, api.CodeNotFound)
	_, err = d.admin.AddSecret(ctx, "admin-secret", "x")
	wantCode(t, "the admin key adding a secret", err, api.CodePermissionDenied)
	ss, err := c.Secrets(ctx)
	if err != nil || len(ss) != 2 {
		t.Fatalf("secrets: %v %v", ss, err)
	}
	other := d.tenant(t, "other", api.Quotas{})
	if oss, _ := other.Secrets(ctx); len(oss) != 0 {
		t.Errorf("another tenant sees %d secrets", len(oss))
	}
	_, err = other.CreateSandbox(ctx, &api.CreateSandbox{Grants: []api.Grant{{Secret: "api-key", Host: "api.test", Allow: []string{"GET /"}}}})
	wantCode(t, "a grant on another tenant's secret", err, api.CodeNotFound)

	shop := filepath.Join(fi.GitRoot, "src-shop")
	gitGrant := api.Grant{Secret: "git-ro", Host: "git.test", Scheme: "basic", Username: fi.GitUser, Env: "GIT_TOKEN",
		Allow: []string{"GET /acme/shop.git/info/refs?service=git-upload-pack", "POST /acme/shop.git/git-upload-pack"}}
	apiGrant := api.Grant{Secret: "api-key", Host: "api.test", Env: "API_TOKEN", Allow: []string{"GET,HEAD /repos/acme/shop/**"}}
	shortGrant := api.Grant{Secret: "api-key", Host: "api.test", Env: "SHORT_TOKEN", Header: "X-Api-Key", Scheme: "raw", TTL: "5s", Allow: []string{"GET /short"}}
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Repo: shop, Commit: "HEAD", Network: api.Network{Allow: []string{"allowed.test"}},
		Grants: []api.Grant{gitGrant, apiGrant, shortGrant}})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if len(sb.Grants) != 3 || sb.Network.Mode != "proxy" {
		t.Fatalf("the sandbox's grants: %+v", sb)
	}
	if err := c.WriteFile(ctx, sb.ID, "/tmp/req.py", []byte(reqScript), 0o644); err != nil {
		t.Fatal(err)
	}
	sh := func(c *client.Client, id, script string, env map[string]string) string {
		t.Helper()
		out, errOut, end := run(t, c, id, &api.Exec{Cmd: []string{"sh", "-c", script}, Env: env, Timeout: "60s"})
		return out + errOut + " exit=" + strconv.Itoa(end.ExitCode)
	}
	req := func(c *client.Client, id string, env map[string]string, args ...string) string {
		t.Helper()
		out, errOut, _ := run(t, c, id, &api.Exec{Cmd: append([]string{"python3", "/tmp/req.py"}, args...), Env: env, Timeout: "30s"})
		return strings.TrimSpace(out + errOut)
	}
	lastSeen := func() string {
		s := fi.Seen()
		if len(s) == 0 {
			return ""
		}
		return s[len(s)-1]
	}
	envOut := sh(c, sb.ID, "env", nil)
	tokens := map[string]string{}
	for _, name := range []string{"GIT_TOKEN", "API_TOKEN", "SHORT_TOKEN"} {
		m := regexp.MustCompile(name + `=(alk_\S+)`).FindStringSubmatch(envOut)
		if m == nil {
			t.Fatalf("no placeholder in %s:\n%s", name, envOut)
		}
		tokens[name] = m[1]
	}
	if out := req(c, sb.ID, nil, "GET", "https://api.test/short", "H:X-Api-Key={SHORT_TOKEN}"); !strings.Contains(lastSeen(), `x-api-key="`+apiSecret+`"`) {
		t.Errorf("the short grant before its TTL: %s; api.test saw %s", out, lastSeen())
	}
	for _, v := range []string{"SSL_CERT_FILE=/etc/airlock/ca-bundle.pem", "GIT_SSL_CAINFO=/etc/airlock/ca-bundle.pem", "REQUESTS_CA_BUNDLE=", "NODE_EXTRA_CA_CERTS=/etc/airlock/ca.pem"} {
		if !strings.Contains(envOut, v) {
			t.Errorf("the sandbox's environment lacks %s", v)
		}
	}

	r := &brokerRig{ctx: ctx, fi: fi, d: d, c: c, apiSecret: apiSecret, apiGrant: apiGrant, sb: sb, created: created, tokens: tokens, sh: sh, req: req, lastSeen: lastSeen}
	t.Run("the coding run: fetch, test, no push, no other repository", func(t *testing.T) { brokerTheCodingRunFetchTestNoPushNoOtherRepository(t, r) })

	t.Run("the API: the credential only where the grant says", func(t *testing.T) { brokerTheCredentialOnlyWhereTheGrantSays(t, r) })

	// A restarted daemon (kill -9) adopts the sandbox with its grants.
	d.kill9()
	d = startDaemonOpts(t, opts, data, "--dns-upstream", "192.0.2.53:53", "--egress-allow-net", "192.0.2.0/24")
	c = d.client(t, tn.Key)
	t.Run("a restarted daemon keeps the grants, tokens are no API keys", func(t *testing.T) { brokerARestartedDaemonKeepsTheGrants(t, r) })

	t.Run("secret scanning blocks pasted keys", func(t *testing.T) { brokerSecretScanningBlocksPastedKeys(t, r) })

	t.Run("tokens are bound to their sandbox and die with it", func(t *testing.T) { brokerTokensAreBoundToTheirSandboxAndDieWithIt(t, r) })

	// No secret value anywhere: API answers, audit records, the daemon's
	// log, any file of the daemon's (its database holds them sealed).
	recs, _ := c.Audit(ctx, "", "")
	all, _ := json.Marshal(recs)
	sbs, _ := c.Sandboxes(ctx)
	sj, _ := json.Marshal(sbs)
	sec, _ := c.Secrets(ctx)
	secj, _ := json.Marshal(sec)
	for _, what := range []struct{ name, text string }{{"audit records", string(all)}, {"sandbox listings", string(sj)}, {"secret listings", string(secj)}, {"the daemon's log", d.log.String()}} {
		for _, v := range []string{apiSecret, fi.GitPassword, tokens["API_TOKEN"], tokens["GIT_TOKEN"]} {
			if strings.Contains(what.text, v) {
				t.Errorf("%s hold %q", what.name, v[:12])
			}
		}
	}
	_ = filepath.Walk(data, func(p string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, v := range []string{apiSecret, fi.GitPassword} {
			if strings.Contains(string(b), v) {
				t.Errorf("%s holds a secret in the clear", p)
			}
		}
		return nil
	})
	if !strings.Contains(string(all), `"kind":"secret.finding"`) || !strings.Contains(string(all), `"grant":"api-key"`) {
		t.Errorf("the audit log lacks findings or grant uses")
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "broker")); len(ents) != 0 {
		t.Errorf("CAs left after their sandboxes: %d", len(ents))
	}
}

func brokerTheCodingRunFetchTestNoPushNoOtherRepository(t *testing.T, r *brokerRig) {
	fi, c, sb, sh := r.fi, r.c, r.sb, r.sh
	url := "https://" + fi.GitUser + ":$GIT_TOKEN@git.test/acme/shop.git"
	out := sh(c, sb.ID, "cd /workspace && sh test.sh && git -c init.defaultBranch=main init -q /tmp/shop && cd /tmp/shop && git fetch -q "+url+" main && git checkout -q FETCH_HEAD && sh test.sh && git log --oneline | head -1", nil)
	if !strings.Contains(out, "tests of shop pass\ntests of shop pass") || !strings.Contains(out, "first commit of shop") || !strings.HasSuffix(out, "exit=0") {
		t.Fatalf("fetch through the grant:\n%s", out)
	}
	creds := "Basic " + base64.StdEncoding.EncodeToString([]byte(fi.GitUser+":"+fi.GitPassword))
	fetched := false
	for _, line := range fi.Seen() {
		fetched = fetched || strings.Contains(line, "POST /acme/shop.git/git-upload-pack auth="+strconv.Quote(creds))
	}
	if !fetched {
		t.Errorf("git.test never got the credential on the upload-pack request:\n%s", strings.Join(fi.Seen(), "\n"))
	}
	before, _ := exec.Command("git", "-C", filepath.Join(fi.GitRoot, "acme", "shop.git"), "rev-parse", "main").Output()
	out = sh(c, sb.ID, "cd /tmp/shop && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m pushed && git push -q "+url+" HEAD:main", nil)
	after, _ := exec.Command("git", "-C", filepath.Join(fi.GitRoot, "acme", "shop.git"), "rev-parse", "main").Output()
	if strings.HasSuffix(out, "exit=0") || string(before) != string(after) {
		t.Errorf("a push through a read-only grant: %s (main %s -> %s)", out, before, after)
	}
	out = sh(c, sb.ID, "git ls-remote https://"+fi.GitUser+":$GIT_TOKEN@git.test/acme/other.git", nil)
	if strings.HasSuffix(out, "exit=0") {
		t.Errorf("another repository with the same token: %s", out)
	}
	for _, line := range fi.Seen() {
		if strings.Contains(line, "git-receive-pack") || strings.Contains(line, "/acme/other.git") {
			if strings.Contains(line, "auth=\"Basic") && !strings.Contains(line, `auth=""`) {
				t.Errorf("git.test got credentials outside the grant: %s", line)
			}
		}
	}
}

func brokerTheCredentialOnlyWhereTheGrantSays(t *testing.T, r *brokerRig) {
	ctx, fi, c, apiSecret, sb, created, req, lastSeen := r.ctx, r.fi, r.c, r.apiSecret, r.sb, r.created, r.req, r.lastSeen
	api := "https://api.test"
	if out := req(c, sb.ID, nil, "GET", api+"/repos/acme/shop/pulls", "H:Authorization=Bearer {API_TOKEN}"); !strings.HasPrefix(out, "200") || !strings.Contains(lastSeen(), `auth="Bearer `+apiSecret+`"`) {
		t.Fatalf("a covered request: %s; api.test saw %s", out, lastSeen())
	}
	for _, c2 := range []struct{ name, method, url string }{
		{"another path", "GET", api + "/repos/acme/other"},
		{"another method", "POST", api + "/repos/acme/shop/pulls"},
		{"plain HTTP", "GET", "http://api.test/repos/acme/shop/pulls"},
	} {
		out := req(c, sb.ID, nil, c2.method, c2.url, "H:Authorization=Bearer {API_TOKEN}", "body=x")
		if strings.Contains(lastSeen(), apiSecret) || strings.Contains(lastSeen(), "alk_") {
			t.Errorf("%s: %s; api.test saw %s", c2.name, out, lastSeen())
		}
	}
	req(c, sb.ID, nil, "GET", api+"/repos/acme/shop/x?token={API_TOKEN}")
	req(c, sb.ID, nil, "PUT", "http://api.test/upload", "body=token={API_TOKEN}")
	for _, line := range fi.Seen() {
		if strings.Contains(line, "alk_") {
			t.Errorf("a placeholder reached api.test: %s", line)
		}
	}
	// Interception only where a grant is: api.test's certificate is the
	// sandbox's CA's, allowed.test's is the world's.
	if out := req(c, sb.ID, nil, "GET", api+"/repos/acme/shop", "ca=/etc/airlock/ca.pem"); !strings.HasPrefix(out, "200") {
		t.Errorf("api.test under the sandbox's CA: %s", out)
	}
	if out := req(c, sb.ID, nil, "GET", "https://allowed.test/", "ca=/etc/airlock/ca.pem"); !strings.Contains(out, "CERTIFICATE_VERIFY_FAILED") {
		t.Errorf("allowed.test (no grant) verified under the sandbox's CA: intercepted? %s", out)
	}
	world, _ := os.ReadFile(fi.CAFile)
	if err := c.WriteFile(ctx, sb.ID, "/tmp/world-ca.pem", world, 0o644); err != nil {
		t.Fatal(err)
	}
	if out := req(c, sb.ID, nil, "GET", "https://allowed.test/", "ca=/tmp/world-ca.pem"); !strings.Contains(out, "hello from allowed") {
		t.Errorf("allowed.test through its tunnel: %s", out)
	}
	// The TTL of a grant's placeholder, shorter than the sandbox's
	// (checked before it ran out, first thing after the create).
	time.Sleep(time.Until(created.Add(6 * time.Second)))
	req(c, sb.ID, nil, "GET", api+"/short", "H:X-Api-Key={SHORT_TOKEN}")
	if !strings.Contains(lastSeen(), `x-api-key=""`) {
		t.Errorf("the short grant after its TTL: api.test saw %s", lastSeen())
	}
}

func brokerARestartedDaemonKeepsTheGrants(t *testing.T, r *brokerRig) {
	ctx, d, c, apiSecret, sb, req, lastSeen, tokens := r.ctx, r.d, r.c, r.apiSecret, r.sb, r.req, r.lastSeen, r.tokens
	if out := req(c, sb.ID, nil, "GET", "https://api.test/repos/acme/shop/pulls", "H:Authorization=Bearer {API_TOKEN}"); !strings.HasPrefix(out, "200") || !strings.Contains(lastSeen(), `auth="Bearer `+apiSecret+`"`) {
		t.Errorf("the grant after a restart: %s; api.test saw %s", out, lastSeen())
	}
	_, err := d.client(t, tokens["API_TOKEN"]).Sandboxes(ctx)
	wantCode(t, "a grant's token as an API key", err, api.CodeUnauthenticated)
}

func brokerSecretScanningBlocksPastedKeys(t *testing.T, r *brokerRig) {
	ctx, fi, c, sb, req := r.ctx, r.fi, r.c, r.sb, r.req
	pasted := "ghp_" + "Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	_, err := c.Exec(ctx, sb.ID, &api.Exec{Cmd: []string{"curl", "-H", "Authorization: token " + pasted, "https://api.github.com/user"}}, nil, nil)
	wantCode(t, "a key in an argument", err, api.CodeSecretDetected)
	if err == nil || !strings.Contains(err.Error(), "github-pat") || strings.Contains(err.Error(), pasted) {
		t.Errorf("the error names the rule, not the key: %v", err)
	}
	key := privateKeyPEM(t)
	err = c.WriteFile(ctx, sb.ID, "/workspace/id_ecdsa", []byte(key), 0o600)
	wantCode(t, "a private key written", err, api.CodeSecretDetected)
	n := len(fi.Seen())
	// The key reaches the sandbox's process some way the API did not
	// see (here: in two halves), and it tries to send it out.
	halves := map[string]string{"P1": pasted[:16], "P2": pasted[16:]}
	if out := req(c, sb.ID, halves, "POST", "https://api.test/repos/acme/shop/issues", "body={\"body\": \"my token is {P1}{P2}\"}"); !strings.HasPrefix(out, "403") || !strings.Contains(out, "github-pat") || len(fi.Seen()) != n {
		t.Errorf("a key in an outbound body: %s", out)
	}
}

func brokerTokensAreBoundToTheirSandboxAndDieWithIt(t *testing.T, r *brokerRig) {
	ctx, c, apiSecret, apiGrant, sb, req, lastSeen, tokens := r.ctx, r.c, r.apiSecret, r.apiGrant, r.sb, r.req, r.lastSeen, r.tokens
	sb2, err := c.CreateSandbox(ctx, &api.CreateSandbox{Grants: []api.Grant{apiGrant}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, sb2.ID, "/tmp/req.py", []byte(reqScript), 0o644); err != nil {
		t.Fatal(err)
	}
	stolen := map[string]string{"STOLEN": tokens["API_TOKEN"]}
	req(c, sb2.ID, stolen, "GET", "https://api.test/repos/acme/shop/pulls", "H:Authorization=Bearer {STOLEN}")
	if strings.Contains(lastSeen(), apiSecret) || strings.Contains(lastSeen(), "alk_") {
		t.Errorf("another sandbox's token was honoured: %s", lastSeen())
	}
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	req(c, sb2.ID, stolen, "GET", "https://api.test/repos/acme/shop/pulls", "H:Authorization=Bearer {STOLEN}")
	if strings.Contains(lastSeen(), apiSecret) {
		t.Errorf("a destroyed sandbox's token was honoured: %s", lastSeen())
	}
	// Egress records are written behind the requests: wait for them.
	var j []byte
	for i := 0; i < 50; i++ {
		recs, err := c.Audit(ctx, sb2.ID, "secret.finding")
		if err != nil {
			t.Fatal(err)
		}
		if j, _ = json.Marshal(recs); strings.Contains(string(j), "revoked") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(string(j), "issued to another sandbox") || !strings.Contains(string(j), "revoked") {
		t.Errorf("findings of the replays:\n%s", j)
	}
	_ = c.Destroy(ctx, sb2.ID)
}

func privateKeyPEM(t *testing.T) string {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// `airlock run` keeps grants too, with secrets from its own environment or
// files (never its command line) and a broker that ends with the run, on
// every wall (the sandbox trusts the broker's CA through the same
// generated files).
func TestRunGrant(t *testing.T) {
	onWalls(t, runGrant)
}

func runGrant(t *testing.T, wall string) {
	fi := &fakeInternet{Internet: fakenet.New(t), env: []string{"SSL_CERT_FILE=", "AIRLOCK_TEST_API_KEY=run-secret-value-0001"}, wall: wall}
	fi.env[0] += fi.CAFile
	ws := workspace(t)
	if err := os.WriteFile(filepath.Join(ws, "req.py"), []byte(reqScript), 0o644); err != nil {
		t.Fatal(err)
	}
	r := fi.airlock(t, "run", "--workspace", ws, "--grant", "api-key@api.test GET:/repos/acme/shop/** env=API_TOKEN",
		"--secret", "api-key=env:AIRLOCK_TEST_API_KEY", "--", "sh", "-c",
		`python3 req.py GET https://api.test/repos/acme/shop/pulls 'H:Authorization=Bearer {API_TOKEN}' && python3 req.py GET https://api.test/repos/acme/other 'H:Authorization=Bearer {API_TOKEN}' && echo "token=$API_TOKEN"`)
	if r.code != 0 || !strings.Contains(r.stdout, "200 api.test: GET /repos/acme/shop/pulls") || !strings.Contains(r.stdout, "token=alk_") {
		t.Fatalf("run with a grant:\n%s", r)
	}
	seen := strings.Join(fi.Seen(), "\n")
	if !strings.Contains(seen, `GET /repos/acme/shop/pulls auth="Bearer run-secret-value-0001"`) || strings.Contains(seen, `/repos/acme/other auth="Bearer`) {
		t.Errorf("api.test saw:\n%s", seen)
	}
	if strings.Contains(r.stdout+r.stderr, "run-secret-value-0001") {
		t.Errorf("the secret reached the sandbox's output:\n%s", r)
	}
	r = fi.airlock(t, "run", "--grant", "nope@api.test GET:/x", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "--secret nope=env:") {
		t.Errorf("a grant without its secret:\n%s", r)
	}
}

// pathsScript sends GET PATH for each argument to api.test through a
// CONNECT tunnel of the proxy, byte for byte (no client-side cleaning),
// with the grant's placeholder; it prints the status and the path.
const pathsScript = `import http.client, os, ssl, sys, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
for path in sys.argv[1:]:
    c = http.client.HTTPSConnection(p.hostname, p.port, context=ssl.create_default_context(), timeout=15)
    c.set_tunnel("api.test", 443)
    try:
        c.request("GET", path, headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]})
        print(c.getresponse().status, path)
    except Exception as e:
        print("ERR", path, e)
    c.close()
`

// The dot-segment variants that servers normalise to ".." match no grant
// rule: api.test receives each of them without the credential, whatever
// the wall.
func TestGrantPathVariantsGetNoCredential(t *testing.T) {
	onWalls(t, grantPathVariantsGetNoCredential)
}

func grantPathVariantsGetNoCredential(t *testing.T, wall string) {
	fi := &fakeInternet{Internet: fakenet.New(t), env: []string{"SSL_CERT_FILE=", "AIRLOCK_TEST_API_KEY=run-secret-value-0002"}, wall: wall}
	fi.env[0] += fi.CAFile
	ws := workspace(t)
	if err := os.WriteFile(filepath.Join(ws, "paths.py"), []byte(pathsScript), 0o644); err != nil {
		t.Fatal(err)
	}
	variants := []string{
		"/repos/acme/shop/..;/other", "/repos/acme/shop/..;x/other", "/repos/acme/shop/..%3B/other", "/repos/acme/shop/%252e%252e/other",
		"/repos/acme/shop/%c0%ae%c0%ae/other", "/repos/acme/shop/%EF%BC%8E%EF%BC%8E/other", "/repos/acme/shop/%E2%80%A5/other",
		"/repos/acme/shop/.../other", "/repos/acme/shop/..%20/other", "/repos/acme/shop/pulls;jsessionid=1",
	}
	args := append([]string{"run", "--workspace", ws, "--grant", "api-key@api.test GET:/repos/acme/shop/** env=API_TOKEN",
		"--secret", "api-key=env:AIRLOCK_TEST_API_KEY", "--", "python3", "paths.py", "/repos/acme/shop/pulls"}, variants...)
	r := fi.airlock(t, args...)
	if r.code != 0 || !strings.Contains(r.stdout, "200 /repos/acme/shop/pulls\n") {
		t.Fatalf("run:\n%s", r)
	}
	seen := fi.Seen()
	if len(seen) != 1+len(variants) || !strings.Contains(seen[0], `GET /repos/acme/shop/pulls auth="Bearer run-secret-value-0002"`) {
		t.Fatalf("api.test saw:\n%s\nthe sandbox:\n%s", strings.Join(seen, "\n"), r)
	}
	for i, line := range seen[1:] {
		if !strings.Contains(line, " "+variants[i]+" ") || !strings.Contains(line, `auth=""`) {
			t.Errorf("%s: api.test saw %s", variants[i], line)
		}
	}
}
