package keys

import (
	"os"
	"strings"
	"testing"
)

const realSecret = "ghp_REALsecretVALUEthatMUSTneverLEAVE0001"

func TestSealing(t *testing.T) {
	k := Ephemeral()
	sealed := k.Seal("acme/github-ro/1", []byte(realSecret))
	if strings.Contains(string(sealed), "REALsecret") {
		t.Fatal("sealed value holds the plaintext")
	}
	if got, err := k.Open("acme/github-ro/1", sealed); err != nil || string(got) != realSecret {
		t.Fatalf("open: %q %v", got, err)
	}
	if _, err := k.Open("evil/github-ro/1", sealed); err == nil {
		t.Error("a sealed value opened under another tenant's name")
	}
	if _, err := Ephemeral().Open("acme/github-ro/1", sealed); err == nil {
		t.Error("a sealed value opened under another key")
	}
	dir := t.TempDir()
	k1, err := LoadFile(dir + "/broker.key")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadFile(dir + "/broker.key")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k2.Open("x", k1.Seal("x", []byte("v"))); err != nil || string(got) != "v" {
		t.Errorf("key file reloaded: %v", err)
	}
	_ = os.Chmod(dir+"/broker.key", 0o644)
	if _, err := LoadFile(dir + "/broker.key"); err == nil {
		t.Error("a world-readable key file was accepted")
	}
}
