package e2bapi

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/e2bapi/envd"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/tenant"
)

const domain = "e2b.test:8443"

type rig struct {
	t       *testing.T
	svc     *fakeService
	front   *Front
	tokens  *Tokens
	envdHit []envd.Target
	portHit []string
	// portSaw is the last request a port was given.
	portSaw *http.Request
}

var (
	alice = &tenant.Principal{ID: "t-alice", Tenant: "alice"}
	bob   = &tenant.Principal{ID: "t-bob", Tenant: "bob"}
)

func newRig(t *testing.T) *rig {
	r := &rig{t: t, svc: newFakeService(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), tokens: NewTokens([]byte("0123456789abcdef0123456789abcdef"))}
	r.front = New(Config{Sandboxes: r.svc, Tenants: fakeTenants{"key-alice": alice, "key-bob": bob}, Tokens: r.tokens, Domain: domain,
		Templates: map[string]string{"base": "host", "py": "oci:/srv/py.oci"}, Now: func() time.Time { return r.svc.now },
		Envd: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			tg, ok := envd.TargetOf(req.Context())
			if !ok {
				t.Error("envd called without a target")
			}
			r.envdHit = append(r.envdHit, tg)
			w.WriteHeader(http.StatusNoContent)
		}),
		// A port token here is "pt <tenant> <id> <port>".
		PortToken: func(req *http.Request, id string, port int) (*tenant.Principal, bool) {
			tok := req.Header.Get("X-Airlock-Port-Token")
			if tok == "" {
				return nil, false
			}
			for _, p := range []*tenant.Principal{alice, bob} {
				if tok == fmt.Sprintf("pt %s %s %d", p.ID, id, port) {
					return p, true
				}
			}
			return nil, true
		},
		Ports: func(w http.ResponseWriter, req *http.Request, p *tenant.Principal, id string, port int, auth string) {
			r.portHit = append(r.portHit, fmt.Sprintf("%s %s %d %s", p.Tenant, id, port, auth))
			r.portSaw = req
			w.WriteHeader(http.StatusTeapot)
		},
	})
	return r
}

// do sends a request to the front and returns the response's status,
// headers and body.
func (r *rig) do(method, target, key, body string, hdr ...string) (int, http.Header, string) {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	r.front.ServeHTTP(w, req)
	return w.Code, w.Header(), w.Body.String()
}

// create makes a sandbox of key's tenant through the front.
func (r *rig) create(key, body string) sandboxOut {
	code, _, out := r.do("POST", "/v2/sandboxes", key, body)
	if code != http.StatusCreated {
		r.t.Fatalf("create: %d %s", code, out)
	}
	var sb sandboxOut
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		r.t.Fatal(err)
	}
	return sb
}

func TestCreateMapsE2BFieldsAndAlwaysAnswersTheDomain(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{"templateID":"py","envVars":{"FOO":"bar"},"metadata":{"suite":"e2b"},"timeout":120,"secure":true,"network":{"allowPublicTraffic":true}}`)
	want := sandboxOut{SandboxID: "sb001", TemplateID: "py", ClientID: "airlock", EnvdVersion: EnvdVersion, EnvdAccessToken: r.tokens.Envd("sb001"), Domain: domain}
	if !reflect.DeepEqual(sb, want) {
		t.Errorf("answer %+v, want %+v", sb, want)
	}
	got := r.svc.creates[0]
	if got.Image != "oci:/srv/py.oci" || got.Env["FOO"] != "bar" || got.Metadata["suite"] != "e2b" || got.Metadata[templateKey] != "py" || got.TTL != "2m0s" || got.Network.Mode != "none" {
		t.Errorf("service asked %+v", got)
	}
	// Defaults: template base, E2B's 300 s on v2 and the schema's 15 s on v1.
	r.create("key-alice", ``)
	if c := r.svc.creates[1]; c.Image != "host" || c.TTL != "5m0s" || c.Metadata[templateKey] != "base" {
		t.Errorf("default create asked %+v", c)
	}
	if code, _, out := r.do("POST", "/sandboxes", "key-alice", `{"templateID":"base"}`); code != http.StatusCreated || r.svc.creates[2].TTL != "15s" {
		t.Errorf("v1 create: %d %s, ttl %s", code, out, r.svc.creates[2].TTL)
	}
	// Metadata the front keeps for itself is not shown, nor settable.
	_, _, out := r.do("GET", "/sandboxes/sb001", "key-alice", "")
	var d detailOut
	_ = json.Unmarshal([]byte(out), &d)
	if d.TemplateID != "py" || len(d.Metadata) != 1 || d.Metadata["suite"] != "e2b" || d.Domain != domain || d.EnvdVersion != EnvdVersion || d.CPUCount != 2 || d.MemoryMB != 512 || d.State != "running" {
		t.Errorf("detail %s", out)
	}
	if code, _, out := r.do("POST", "/v2/sandboxes", "key-alice", `{"metadata":{"e2b.template":"x"}}`); code != 400 || !strings.Contains(out, `"code":400`) {
		t.Errorf("reserved metadata key: %d %s", code, out)
	}
}

func TestUnknownTemplateAndUnsupportedFieldsAreRefusedByName(t *testing.T) {
	r := newRig(t)
	for body, want := range map[string]string{
		`{"templateID":"nope"}`:                       `"code":404`,
		`{"iam":{"tokens":{}}}`:                       "iam",
		`{"mcp":{}}`:                                  "mcp",
		`{"volumeMounts":[{"name":"v","path":"/v"}]}`: "volumeMounts",
		`{"autoResume":{"enabled":true}}`:             "autoResume needs",
		`{"network":{"rules":{}}}`:                    "network.rules",
		`{"network":{"egressProxy":{"address":"x"}}}`: "egressProxy",
		`{"timeout":0}`:                               "timeout",
		`{"templateID":`:                              "bad JSON",
	} {
		if code, _, out := r.do("POST", "/v2/sandboxes", "key-alice", body); code < 400 || !strings.Contains(out, want) {
			t.Errorf("%s: %d %s, want %s", body, code, out, want)
		}
	}
	if len(r.svc.creates) != 0 {
		t.Errorf("refused creates reached the service: %+v", r.svc.creates)
	}
}

// lifecycle.onTimeout 'pause' is the service's on_ttl "pause"; with
// autoResume, the sandbox's own traffic resumes it, with the timeout its
// create asked; without, it does not.
func TestOnTimeoutPauseAndAutoResume(t *testing.T) {
	r := newRig(t)
	auto := r.create("key-alice", `{"timeout":90,"autoPause":true,"autoResume":{"enabled":true}}`)
	manual := r.create("key-alice", `{"autoPause":true}`)
	if c := r.svc.creates[0]; c.OnTTL != "pause" || c.Metadata[autoResumeKey] != "true" || c.Metadata[timeoutKey] != "90" {
		t.Errorf("asked %+v", c)
	}
	if c := r.svc.creates[1]; c.OnTTL != "pause" || c.Metadata[autoResumeKey] != "" {
		t.Errorf("asked %+v", c)
	}
	for _, id := range []string{auto.SandboxID, manual.SandboxID} {
		if _, err := r.svc.Pause(t.Context(), alice, id); err != nil {
			t.Fatal(err)
		}
	}
	_, _, out := r.do("GET", "/sandboxes/"+auto.SandboxID, "key-alice", "")
	if !strings.Contains(out, `"lifecycle":{"onTimeout":"pause","autoResume":true}`) {
		t.Errorf("detail %s", out)
	}
	// Control-plane reads do not resume.
	if b, _ := r.svc.Get(t.Context(), alice, auto.SandboxID); b.State != api.StatePaused {
		t.Fatalf("getInfo resumed it")
	}
	for _, c := range []struct {
		id    string
		state string
	}{{auto.SandboxID, api.StateRunning}, {manual.SandboxID, api.StatePaused}} {
		code, _, out := r.do("GET", "/health", "", "", "E2b-Sandbox-Id", c.id, "X-Access-Token", r.tokens.Envd(c.id))
		b, _ := r.svc.Get(t.Context(), alice, c.id)
		if code != 204 || b.State != c.state {
			t.Errorf("%s's traffic: %d %s, state %s, want %s", c.id, code, out, b.State, c.state)
		}
	}
	if r.svc.extended[auto.SandboxID] != "1m30s" {
		t.Errorf("resumed with timeout %q, want its create's 90 s", r.svc.extended[auto.SandboxID])
	}
}

func TestNetworkIsDefaultDenyAndNeverTheWholeInternet(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		name     string
		internet *bool
		n        *network
		operator []string
		want     api.Network
		err      bool
	}{
		{name: "nothing said", want: api.Network{Mode: "none"}},
		{name: "nothing said, operator list", operator: []string{"pypi.org"}, want: api.Network{Mode: "proxy", Allow: []string{"pypi.org"}}},
		{name: "internet off", internet: &no, operator: []string{"pypi.org"}, want: api.Network{Mode: "none"}},
		{name: "internet on", internet: &yes, err: true},
		{name: "internet on, operator list", internet: &yes, operator: []string{"pypi.org"}, want: api.Network{Mode: "proxy", Allow: []string{"pypi.org"}}},
		{name: "allow all", n: &network{AllowOut: []string{"0.0.0.0/0"}}, err: true},
		{name: "names", internet: &no, n: &network{AllowOut: []string{"pypi.org", "*.github.com", "1.2.3.4", "5.6.7.8/32"}, DenyOut: []string{"0.0.0.0/0", "evil.example", "9.9.9.9"}},
			want: api.Network{Mode: "proxy", Allow: []string{"pypi.org", "*.github.com", "1.2.3.4", "5.6.7.8"}, Deny: []string{"evil.example", "9.9.9.9"}}},
		{name: "a range", n: &network{AllowOut: []string{"10.0.0.0/8"}}, err: true},
	} {
		got, err := networkOf(c.internet, c.n, c.operator)
		if c.err {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: %+v %v, want invalid argument", c.name, got, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v %v, want %+v", c.name, got, err, c.want)
		}
	}
}

func TestErrorsCarryTheIntegerCodeTheSDKsReadBack(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	for _, c := range []struct {
		method, path, key, body string
		code                    int
	}{
		{"POST", "/v2/sandboxes", "", `{}`, 401},
		{"POST", "/v2/sandboxes", "wrong", `{}`, 401},
		{"DELETE", "/sandboxes/nope", "key-alice", "", 404},
		{"POST", "/sandboxes/" + sb.SandboxID + "/pause", "key-alice", `{}`, 204},
		{"POST", "/sandboxes/" + sb.SandboxID + "/pause", "key-alice", `{}`, 409}, // the SDK's false
		{"POST", "/sandboxes/nope/timeout", "key-alice", `{"timeout":60}`, 404},
		{"PUT", "/sandboxes/" + sb.SandboxID + "/network", "key-alice", `{}`, 404},
		{"DELETE", "/templates/base", "key-alice", "", 404},
		{"DELETE", "/sandboxes/" + sb.SandboxID, "key-alice", "", 204},
		{"DELETE", "/sandboxes/" + sb.SandboxID, "key-alice", "", 404}, // the SDK's false
		{"GET", "/sandboxes/" + sb.SandboxID, "key-alice", "", 404},    // ended: gone, as on E2B
	} {
		code, _, out := r.do(c.method, c.path, c.key, c.body)
		if code != c.code {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, code, out, c.code)
			continue
		}
		if code >= 400 {
			var e errorOut
			if err := json.Unmarshal([]byte(out), &e); err != nil || e.Code != code || e.Message == "" {
				t.Errorf("%s %s: body %s: want {\"code\": %d, \"message\": ...}", c.method, c.path, out, code)
			}
		}
	}
}

func TestAnotherTenantsSandboxIsAMissingOne(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/%s", ""},
		{"DELETE", "/sandboxes/%s", ""},
		{"POST", "/sandboxes/%s/timeout", `{"timeout":60}`},
		{"POST", "/sandboxes/%s/pause", `{}`},
		{"POST", "/v2/sandboxes/%s/connect", `{}`},
		{"GET", "/sandboxes/%s/metrics", ""},
		{"POST", "/sandboxes/%s/snapshots", `{}`},
	} {
		code, _, theirs := r.do(c.method, fmt.Sprintf(c.path, sb.SandboxID), "key-bob", c.body)
		mcode, _, missing := r.do(c.method, fmt.Sprintf(c.path, "sb999"), "key-bob", c.body)
		if code != 404 || mcode != 404 || strings.ReplaceAll(theirs, sb.SandboxID, "ID") != strings.ReplaceAll(missing, "sb999", "ID") {
			t.Errorf("%s %s: another's %d %s, a missing one's %d %s", c.method, c.path, code, theirs, mcode, missing)
		}
	}
	if code, _, out := r.do("GET", "/v2/sandboxes", "key-bob", ""); code != 200 || out != "[]\n" {
		t.Errorf("bob's list: %d %s", code, out)
	}
	if b, _ := r.svc.Get(t.Context(), alice, sb.SandboxID); b.State != api.StateRunning {
		t.Errorf("bob's calls changed alice's sandbox: %+v", b)
	}
}

func TestConnectResumesAPausedSandboxAndOnlyExtendsARunningOne(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{"timeout":3600}`)
	// Running, asked for less than it has: untouched, 200.
	if code, _, out := r.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", "key-alice", `{"timeout":60}`); code != 200 || !strings.Contains(out, r.tokens.Envd(sb.SandboxID)) || !strings.Contains(out, domain) {
		t.Errorf("connect running: %d %s", code, out)
	}
	if _, ok := r.svc.extended[sb.SandboxID]; ok {
		t.Errorf("connect shortened a running sandbox's timeout to %s", r.svc.extended[sb.SandboxID])
	}
	// Paused: kept a day, then resumed with its timeout set: 201.
	if code, _, _ := r.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", "key-alice", `{}`); code != 204 || r.svc.extended[sb.SandboxID] != "24h0m0s" {
		t.Fatalf("pause: %d, extended to %q", code, r.svc.extended[sb.SandboxID])
	}
	if code, _, out := r.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", "key-alice", `{"timeout":60}`); code != 201 || r.svc.extended[sb.SandboxID] != "1m0s" {
		t.Errorf("connect paused: %d %s, extended to %q", code, out, r.svc.extended[sb.SandboxID])
	}
	if b, _ := r.svc.Get(t.Context(), alice, sb.SandboxID); b.State != api.StateRunning {
		t.Errorf("after connect: %s", b.State)
	}
	if code, _, _ := r.do("POST", "/sandboxes/"+sb.SandboxID+"/timeout", "key-alice", `{"timeout":90}`); code != 204 || r.svc.extended[sb.SandboxID] != "1m30s" {
		t.Errorf("setTimeout: %d, %q", code, r.svc.extended[sb.SandboxID])
	}
}

func TestListFiltersByMetadataAndStateAndPages(t *testing.T) {
	r := newRig(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, r.create("key-alice", fmt.Sprintf(`{"metadata":{"suite":"e2b","n":"%d","odd key":"a&b=c"}}`, i)).SandboxID)
	}
	r.create("key-alice", `{"metadata":{"suite":"other"}}`)
	r.create("key-bob", `{"metadata":{"suite":"e2b"}}`)
	if code, _, _ := r.do("POST", "/sandboxes/"+ids[1]+"/pause", "key-alice", `{}`); code != 204 {
		t.Fatal("pause")
	}
	// The SDK escapes each key and value, then the whole query once more.
	meta := url.Values{url.QueryEscape("suite"): {url.QueryEscape("e2b")}, url.QueryEscape("odd key"): {url.QueryEscape("a&b=c")}}.Encode()
	var got []string
	token := ""
	pages := 0
	for {
		q := url.Values{"metadata": {meta}, "limit": {"2"}}
		if token != "" {
			q.Set("nextToken", token)
		}
		code, h, out := r.do("GET", "/v2/sandboxes?"+q.Encode(), "key-alice", "")
		if code != 200 {
			t.Fatalf("list: %d %s", code, out)
		}
		var page []detailOut
		_ = json.Unmarshal([]byte(out), &page)
		for _, d := range page {
			got = append(got, d.SandboxID)
		}
		pages++
		if token = h.Get("X-Next-Token"); token == "" || pages > 5 {
			break
		}
	}
	if !reflect.DeepEqual(got, ids) || pages != 3 {
		t.Errorf("pages %d of %v, want %v", pages, got, ids)
	}
	code, _, out := r.do("GET", "/v2/sandboxes?state=paused&metadata="+url.QueryEscape(meta), "key-alice", "")
	if var1 := `"sandboxID":"` + ids[1] + `"`; code != 200 || strings.Count(out, "sandboxID") != 1 || !strings.Contains(out, var1) {
		t.Errorf("paused ones: %d %s", code, out)
	}
	if code, _, out := r.do("GET", "/v2/sandboxes?state=running&state=paused&order=desc&limit=1", "key-alice", ""); code != 200 || !strings.Contains(out, "sb006") {
		t.Errorf("newest first: %d %s", code, out)
	}
	if code, _, _ := r.do("GET", "/v2/sandboxes?nextToken=garbage", "key-alice", ""); code != 400 {
		t.Errorf("forged token: %d", code)
	}
}

func TestSnapshotsPassThroughAsTemplates(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	code, _, out := r.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", "key-alice", `{"name":"t"}`)
	var sn snapshotOut
	if _ = json.Unmarshal([]byte(out), &sn); code != 201 || sn.SnapshotID != "snapshot:snap0" || !reflect.DeepEqual(sn.Names, []string{"t"}) {
		t.Fatalf("snapshot: %d %s", code, out)
	}
	r.create("key-alice", `{"templateID":"snapshot:snap0"}`)
	if c := r.svc.creates[1]; c.Image != "snapshot:snap0" || c.Metadata[templateKey] != "snapshot:snap0" {
		t.Errorf("create from it asked %+v", c)
	}
	if code, _, out := r.do("GET", "/snapshots?sandboxID="+sb.SandboxID, "key-alice", ""); code != 200 || !strings.Contains(out, "snapshot:snap0") {
		t.Errorf("list: %d %s", code, out)
	}
	if code, _, _ := r.do("DELETE", "/templates/snapshot:snap0", "key-alice", ""); code != 204 {
		t.Errorf("delete: %d", code)
	}
	if code, _, _ := r.do("DELETE", "/templates/snapshot:snap0", "key-alice", ""); code != 404 {
		t.Errorf("delete again: %d", code)
	}
}

func TestMetricsAreOneSampleOfUsage(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	r.svc.now = r.svc.now.Add(11 * time.Second) // created at +1s: 10 s old
	code, _, out := r.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics", "key-alice", "")
	var ms []metricOut
	if _ = json.Unmarshal([]byte(out), &ms); code != 200 || len(ms) != 1 {
		t.Fatalf("metrics: %d %s", code, out)
	}
	m := ms[0]
	if m.MemUsed != 64<<20 || m.MemTotal != 512<<20 || m.CPUCount != 2 || m.DiskTotal != 1<<30 || m.CPUUsedPct != 15 {
		t.Errorf("sample %+v", m)
	}
}

func TestSandboxTrafficIsRoutedByHostOrHeader(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	tok := r.tokens.Envd(sb.SandboxID)
	for _, hdr := range [][]string{
		{"Host", "49983-" + sb.SandboxID + ".e2b.test:8443"},
		{"Host", "49983-" + sb.SandboxID + ".E2B.test"},
		{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49983"},
		{"E2b-Sandbox-Id", sb.SandboxID},
	} {
		r.envdHit = nil
		code, _, out := r.do("POST", "/process.Process/List", "", `{}`, append(hdr, "X-Access-Token", tok)...)
		if code != 204 || len(r.envdHit) != 1 || r.envdHit[0].ID != sb.SandboxID || r.envdHit[0].Principal != alice {
			t.Errorf("%v: %d %s, envd saw %+v", hdr, code, out, r.envdHit)
		}
	}
	// Another port: the proxy, with the owner.
	if code, _, _ := r.do("GET", "/", "", "", "Host", "8000-"+sb.SandboxID+".e2b.test:8443", "X-Access-Token", tok); code != http.StatusTeapot || len(r.portHit) != 1 || r.portHit[0] != "alice "+sb.SandboxID+" 8000 access-token" {
		t.Errorf("port: %d %v", code, r.portHit)
	}
	if code, _, _ := r.do("GET", "/", "key-alice", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "3000"); code != http.StatusTeapot || len(r.portHit) != 2 || r.portHit[1] != "alice "+sb.SandboxID+" 3000 key" {
		t.Errorf("port with the owner's key: %d %v", code, r.portHit)
	}
	if code, _, _ := r.do("GET", "/", "", "", "Host", "3000-"+sb.SandboxID+".e2b.test", "X-Airlock-Port-Token", "pt t-alice "+sb.SandboxID+" 3000"); code != http.StatusTeapot || len(r.portHit) != 3 || r.portHit[2] != "alice "+sb.SandboxID+" 3000 token" {
		t.Errorf("port with a port token: %d %v", code, r.portHit)
	}
	// The API host, and hosts that only look alike, are the control plane.
	for _, host := range []string{"api.e2b.test:8443", "49983-" + sb.SandboxID + ".e2b.test.evil", "x-" + sb.SandboxID + ".e2b.test"} {
		if code, _, _ := r.do("GET", "/sandboxes/"+sb.SandboxID, "key-alice", "", "Host", host); code != 200 {
			t.Errorf("host %s: %d, want the control plane", host, code)
		}
	}
}

func TestRefusedSandboxTrafficIsIndistinguishable(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	gone := r.create("key-alice", `{}`)
	r.do("DELETE", "/sandboxes/"+gone.SandboxID, "key-alice", "")
	want := `{"code":502,"message":"sandbox not running"}` + "\n"
	for name, hdr := range map[string][]string{
		"no token":                 {"E2b-Sandbox-Id", sb.SandboxID},
		"wrong token":              {"E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", r.tokens.Envd(sb.SandboxID) + "x"},
		"another sandbox's token":  {"E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", r.tokens.Envd(gone.SandboxID)},
		"missing sandbox":          {"E2b-Sandbox-Id", "sb999", "X-Access-Token", r.tokens.Envd("sb999")},
		"ended sandbox":            {"E2b-Sandbox-Id", gone.SandboxID, "X-Access-Token", r.tokens.Envd(gone.SandboxID)},
		"bad port":                 {"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "x", "X-Access-Token", r.tokens.Envd(sb.SandboxID)},
		"port, another's key":      {"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8000", "X-API-Key", "key-bob"},
		"port, no key":             {"Host", "8000-" + sb.SandboxID + ".e2b.test"},
		"port of a missing one":    {"Host", "8000-sb999.e2b.test", "X-API-Key", "key-alice"},
		"host route, wrong token":  {"Host", "49983-" + sb.SandboxID + ".e2b.test", "X-Access-Token", "airlock_envd_x"},
		"another key's token mint": {"E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", NewTokens([]byte("another daemon's key, 32 bytes!!")).Envd(sb.SandboxID)},
		"port token, another port": {"Host", "8000-" + sb.SandboxID + ".e2b.test", "X-Airlock-Port-Token", "pt t-alice " + sb.SandboxID + " 3000"},
		// A token present decides: the owner's key beside a bad one does not let it in.
		"port token forged, a key": {"Host", "8000-" + sb.SandboxID + ".e2b.test", "X-Airlock-Port-Token", "pt x", "X-API-Key", "key-alice"},
		"another's port token":     {"Host", "8000-" + sb.SandboxID + ".e2b.test", "X-Airlock-Port-Token", "pt t-bob " + sb.SandboxID + " 8000"},
		"port token on envd":       {"E2b-Sandbox-Id", sb.SandboxID, "X-Airlock-Port-Token", "pt t-alice " + sb.SandboxID + " 49983"},
		"key on envd":              {"E2b-Sandbox-Id", sb.SandboxID, "X-API-Key", "key-alice"},
	} {
		code, _, out := r.do("GET", "/health", "", "", hdr...)
		if code != http.StatusBadGateway || out != want {
			t.Errorf("%s: %d %s, want 502 %s", name, code, out, want)
		}
	}
	if len(r.envdHit)+len(r.portHit) != 0 {
		t.Errorf("refused requests reached envd %v or a port %v", r.envdHit, r.portHit)
	}
}

// The front's own headers never reach a sandbox's server: the access
// token, the key (X-API-Key; Authorization when it was the key), the
// routing headers. The server's own Authorization, when the key came in
// X-API-Key, does.
func TestPortRequestsCarryNoCredentialOfTheFront(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	tok := r.tokens.Envd(sb.SandboxID)
	for _, c := range []struct {
		name     string
		hdr      []string
		wantAuth string
	}{
		{"access token, key beside it", []string{"X-Access-Token", tok, "X-API-Key", "key-alice", "Authorization", "Basic app"}, "Basic app"},
		{"X-API-Key", []string{"X-API-Key", "key-alice", "Authorization", "Basic app"}, "Basic app"},
		{"Authorization", []string{"Authorization", "Bearer key-alice"}, ""},
		{"port token", []string{"X-Airlock-Port-Token", "pt t-alice " + sb.SandboxID + " 8000", "X-Access-Token", "wrong", "X-API-Key", "key-bob"}, ""},
	} {
		r.portSaw = nil
		hdr := append([]string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8000", "X-App", "1"}, c.hdr...)
		if code, _, out := r.do("GET", "/x", "", "", hdr...); code != http.StatusTeapot || r.portSaw == nil {
			t.Errorf("%s: %d %s", c.name, code, out)
			continue
		}
		h := r.portSaw.Header
		for _, k := range []string{"X-Access-Token", "X-API-Key", "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
			if h.Get(k) != "" {
				t.Errorf("%s: %s reached the port: %v", c.name, k, h)
			}
		}
		if h.Get("Authorization") != c.wantAuth || h.Get("X-App") != "1" {
			t.Errorf("%s: the port saw %v", c.name, h)
		}
	}
}

// sign makes a /files signature the way the SDK's getSignature does.
func sign(path, op, user, token string, exp int64) string {
	s := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		s += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

func TestSignedFileURLsNeedNoTokenButAValidSignature(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	tok := r.tokens.Envd(sb.SandboxID)
	now := r.svc.now.Unix()
	files := func(method string, q url.Values) int {
		code, _, _ := r.do(method, "/files?"+q.Encode(), "", "", "Host", "49983-"+sb.SandboxID+".e2b.test")
		return code
	}
	for _, c := range []struct {
		name, method string
		q            url.Values
		code         int
	}{
		{"read", "GET", url.Values{"path": {"/home/user/a.txt"}, "signature": {sign("/home/user/a.txt", "read", "", tok, 0)}}, 204},
		{"write, user, expiry", "POST", url.Values{"path": {"/a"}, "username": {"root"}, "signature": {sign("/a", "write", "root", tok, now+60)}, "signature_expiration": {strconv.FormatInt(now+60, 10)}}, 204},
		{"expired", "GET", url.Values{"path": {"/a"}, "signature": {sign("/a", "read", "", tok, now-1)}, "signature_expiration": {strconv.FormatInt(now-1, 10)}}, 502},
		{"expiry moved", "GET", url.Values{"path": {"/a"}, "signature": {sign("/a", "read", "", tok, now-1)}, "signature_expiration": {strconv.FormatInt(now+60, 10)}}, 502},
		{"read signature used to write", "POST", url.Values{"path": {"/a"}, "signature": {sign("/a", "read", "", tok, 0)}}, 502},
		{"another path", "GET", url.Values{"path": {"/etc/shadow"}, "signature": {sign("/a", "read", "", tok, 0)}}, 502},
		{"another user", "GET", url.Values{"path": {"/a"}, "username": {"root"}, "signature": {sign("/a", "read", "", tok, 0)}}, 502},
		{"another sandbox's", "GET", url.Values{"path": {"/a"}, "signature": {sign("/a", "read", "", r.tokens.Envd("sb999"), 0)}}, 502},
	} {
		if code := files(c.method, c.q); code != c.code {
			t.Errorf("%s: %d, want %d", c.name, code, c.code)
		}
	}
	// A signature opens /files only.
	q := "?path=/a&signature=" + url.QueryEscape(sign("/a", "read", "", tok, 0))
	if code, _, _ := r.do("POST", "/process.Process/List"+q, "", "{}", "E2b-Sandbox-Id", sb.SandboxID); code != 502 {
		t.Errorf("signature on an RPC: %d", code)
	}
}

func TestTokensSurviveARestartAndTheKeyIsRootOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "e2b.key")
	a, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	if a.Envd("sb1") != b.Envd("sb1") || a.Envd("sb1") == a.Envd("sb2") || !strings.HasPrefix(a.Envd("sb1"), "airlock_envd_") {
		t.Errorf("tokens %s %s %s", a.Envd("sb1"), b.Envd("sb1"), a.Envd("sb2"))
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", st.Mode(), err)
	}
	if c, _ := LoadTokens(filepath.Join(t.TempDir(), "other.key")); c.Envd("sb1") == a.Envd("sb1") {
		t.Error("two daemons' keys gave one token")
	}
	_ = os.WriteFile(path, []byte("short"), 0o600)
	if _, err := LoadTokens(path); err == nil {
		t.Error("a truncated key file was taken")
	}
}

func TestUnknownRoutesAnswerE2BErrors(t *testing.T) {
	r := newRig(t)
	code, _, out := r.do("POST", "/v3/templates", "key-alice", `{}`)
	var e errorOut
	if _ = json.Unmarshal([]byte(out), &e); code != 404 || e.Code != 404 || !strings.Contains(e.Message, "not supported") {
		t.Errorf("%d %s", code, out)
	}
}

// docs/e2b.md's table names every route the control plane serves.
func TestDocsListEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../../docs/e2b.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range newRig(t).front.Routes() {
		if !strings.Contains(string(b), "`"+rt+"`") {
			t.Errorf("docs/e2b.md does not name %s", rt)
		}
	}
}

// A signed /files URL acts as the user it was signed for (none: the
// default user): a holder who adds Basic credentials naming another
// user (root) does not reach envd with them.
func TestSignedFileURLActsAsItsSignedUser(t *testing.T) {
	r := newRig(t)
	sb := r.create("key-alice", `{}`)
	var auth []string
	r.front.cfg.Envd = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		auth = append(auth, req.Header.Get("Authorization"))
		w.WriteHeader(http.StatusNoContent)
	})
	tok := r.tokens.Envd(sb.SandboxID)
	q := url.Values{"path": {"/home/user/a.txt"}, "signature": {sign("/home/user/a.txt", "write", "", tok, 0)}}
	root := "Basic " + base64.StdEncoding.EncodeToString([]byte("root:"))
	if code, _, out := r.do("POST", "/files?"+q.Encode(), "", "", "Host", "49983-"+sb.SandboxID+".e2b.test", "Authorization", root); code != http.StatusNoContent {
		t.Fatalf("signed write: %d %s", code, out)
	}
	// With its access token, the caller may name any user.
	if code, _, out := r.do("POST", "/files?path=/a", "", "", "E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", tok, "Authorization", root); code != http.StatusNoContent {
		t.Fatalf("write with the token: %d %s", code, out)
	}
	if len(auth) != 2 || auth[0] != "" || auth[1] != root {
		t.Errorf("envd saw Authorization %q, want none for the signed URL and root's for the token", auth)
	}
}
