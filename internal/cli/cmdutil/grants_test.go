package cmdutil

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

func TestParseGrant(t *testing.T) {
	g, err := parseGrant("git-ro@github.com:8443 GET:/acme/shop.git/info/refs?service=git-upload-pack POST:/acme/shop.git/git-upload-pack scheme=basic user=x-access-token env=GIT_TOKEN ttl=30m")
	want := api.Grant{Secret: "git-ro", Host: "github.com", Port: 8443, Scheme: "basic", Username: "x-access-token", Env: "GIT_TOKEN", TTL: "30m",
		Allow: []string{"GET /acme/shop.git/info/refs?service=git-upload-pack", "POST /acme/shop.git/git-upload-pack"}}
	if err != nil || !reflect.DeepEqual(g, want) {
		t.Fatalf("%+v %v", g, err)
	}
	for _, bad := range []string{"", "github-ro", "github-ro@api.github.com", "@h GET:/", "s@h:x GET:/", "s@h GET:/ color=red", "s@h GET"} {
		if _, err := parseGrant(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	f := filepath.Join(t.TempDir(), "grants.yaml")
	_ = os.WriteFile(f, []byte("- secret: a\n  host: api.test\n  allow: [\"GET /x\"]\n"), 0o644)
	gs, err := GrantsOf([]string{"b@h.test GET:/y"}, f)
	if err != nil || len(gs) != 2 || gs[0].Secret != "a" || gs[1].Allow[0] != "GET /y" {
		t.Errorf("grants file and flag: %+v %v", gs, err)
	}
	_ = os.WriteFile(f, []byte("- secret: a\n  hots: api.test\n"), 0o644)
	if _, err := GrantsOf(nil, f); err == nil {
		t.Error("an unknown field in a grants file was accepted")
	}
}

func TestLocalSecrets(t *testing.T) {
	t.Setenv("AIRLOCK_TEST_SECRET", "s3cret")
	f := filepath.Join(t.TempDir(), "tok")
	_ = os.WriteFile(f, []byte("from-file\n"), 0o600)
	m, err := LocalSecrets([]string{"a=env:AIRLOCK_TEST_SECRET", "b=file:" + f})
	if err != nil || string(m["a"]) != "s3cret" || string(m["b"]) != "from-file" {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"a=s3cret", "a=env:AIRLOCK_UNSET_VARIABLE", "A=env:AIRLOCK_TEST_SECRET", "a=file:/nonexistent"} {
		if _, err := LocalSecrets([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
