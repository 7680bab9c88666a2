package scan

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
)

// randomToken is a high-entropy string of n characters of alphabet.
func randomToken(n int, alphabet string) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func privateKeyPEM(t testing.TB) string {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func TestScanFindsWellKnownFormats(t *testing.T) {
	s, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if s.Rules() < 200 {
		t.Fatalf("only %d rules compiled", s.Rules())
	}
	// Fixed values: a random one may contain one of the generic rule's
	// many stopwords, which allow it (a flaky test).
	ghp := "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	aws := "AKIAQ4ZT6WX2LR7NPJ3V"
	key := privateKeyPEM(t)
	generic := "Zq8Xv2Lw9Pt4Rk7Jm3Nb6Hc1Fd5Gs0Qy"
	for _, c := range []struct{ text, rule, secret string }{
		{"curl -H 'Authorization: token " + ghp + "' https://api.github.com", "github-pat", ghp},
		{"export AWS_ACCESS_KEY_ID=" + aws, "aws-access-token", aws},
		{"here is my key:\n" + key, "private-key", ""},
		{`config.api_key = "` + generic + `"`, "generic-api-key", generic},
	} {
		fs := s.Scan(c.text)
		var hit *Finding
		for i := range fs {
			if fs[i].Rule == c.rule {
				hit = &fs[i]
			}
		}
		if hit == nil {
			t.Errorf("%s not found in %q: %+v", c.rule, c.text, fs)
			continue
		}
		if c.secret != "" && hit.Secret != c.secret {
			t.Errorf("%s: secret %q, want %q", c.rule, hit.Secret, c.secret)
		}
		if c.text[hit.Start:hit.End] != hit.Secret {
			t.Errorf("%s: offsets do not name the secret", c.rule)
		}
		red := Redact(c.text, fs)
		if strings.Contains(red, hit.Secret) || !strings.Contains(red, "[REDACTED:") {
			t.Errorf("%s: redaction left the secret: %q", c.rule, red)
		}
	}
}

func TestScanLeavesOrdinaryTextAlone(t *testing.T) {
	s, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{
		"go test ./...",
		"git clone https://github.com/acme/shop.git",
		"password=$PASSWORD",
		"api_key = ${API_KEY}",
		`token: "{{ secrets.TOKEN }}"`,
		"key=aaaaaaaaaaaaaaaaaaaa",
		"npm install left-pad@1.3.0",
		"SSL_CERT_FILE=/etc/airlock/ca-bundle.pem",
	} {
		if fs := s.Scan(text); len(fs) > 0 {
			t.Errorf("%q: found %s", text, fs[0].Rule)
		}
	}
}

func TestAllowlistAndCondition(t *testing.T) {
	s, err := New([]byte(`
[allowlist]
stopwords = ["example"]
[[rules]]
id = "t"
regex = '''tok_([a-z0-9]{8})'''
keywords = ["tok_"]
[[rules.allowlists]]
condition = "AND"
regexTarget = "line"
regexes = ['''^# ''']
stopwords = ["0000"]
`))
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string]int{
		"tok_abcd1234":      1,
		"tok_exampl00":      1,
		"x tok_0000abcd":    1, // AND: the line condition fails
		"# tok_0000abcd":    0, // AND: both hold
		"TOK_abcd1234":      0, // the regex is case-sensitive
		"tok_abcd1234 tok_": 1,
	} {
		if got := len(s.Scan(text)); got != want {
			t.Errorf("%q: %d findings, want %d", text, got, want)
		}
	}
	if fs := s.Scan("a tok_abcd1234"); len(fs) != 1 || fs[0].Secret != "abcd1234" {
		t.Errorf("secret group: %+v", fs)
	}
}

func FuzzScan(f *testing.F) {
	s, err := Default()
	if err != nil {
		f.Fatal(err)
	}
	f.Add("api_key=" + randomToken(30, alnum))
	f.Add("ghp_" + randomToken(36, alnum) + "\n")
	f.Add(privateKeyPEM(f))
	f.Add("")
	f.Fuzz(func(t *testing.T, text string) {
		fs := s.Scan(text)
		for _, x := range fs {
			if x.Start < 0 || x.End > len(text) || x.Start >= x.End || text[x.Start:x.End] != x.Secret {
				t.Fatalf("bad finding %+v", x)
			}
		}
		red := Redact(text, fs)
		for _, x := range fs {
			if len(x.Secret) >= 8 && strings.Contains(red, x.Secret) && !strings.Contains(strings.ReplaceAll(text, x.Secret, ""), x.Secret) {
				t.Fatalf("redaction kept %q", x.Secret)
			}
		}
	})
}

func BenchmarkScan(b *testing.B) {
	s, err := Default()
	if err != nil {
		b.Fatal(err)
	}
	arg := "python -m pytest tests/test_checkout.py -k flaky --maxfail=1"
	body := strings.Repeat(`{"name":"widget","price":12.5,"tags":["a","b"]}`+"\n", 20000) // ~1 MiB
	b.Run("argv", func(b *testing.B) {
		for b.Loop() {
			s.Scan(arg)
		}
	})
	b.Run("1MiB", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			s.Scan(body)
		}
	})
}

// A rule's regexes are compiled only once a text holds one of its
// keywords (an ordinary command line compiles none); New still refuses a
// rule file whose expressions do not parse, and every embedded rule
// compiles.
func TestRulesCompileWhenTheirKeywordsAppear(t *testing.T) {
	s, err := build(embeddedRules, false) // as Default reads them: unparsed
	if err != nil {
		t.Fatal(err)
	}
	compiled := func() (n int) {
		for _, r := range s.rules {
			if r.re != nil {
				n++
			}
		}
		return n
	}
	if fs := s.Scan("sh -c true"); len(fs) != 0 || compiled() != 0 {
		t.Fatalf("an ordinary command line: findings %+v, %d rules compiled", fs, compiled())
	}
	if fs := s.Scan("export AWS_ACCESS_KEY_ID=AKIAQ4ZT6WX2LR7NPJ3V"); len(fs) == 0 || compiled() == 0 || compiled() == len(s.rules) {
		t.Fatalf("an AWS key: findings %+v, %d of %d rules compiled", fs, compiled(), len(s.rules))
	}
	for _, r := range s.rules {
		r.compile() // panics on one that does not compile
	}
	for _, bad := range []string{
		"[[rules]]\nid = \"x\"\nregex = '''(unclosed'''\nkeywords = [\"x\"]\n",
		"[[rules]]\nid = \"x\"\nregex = '''x'''\nkeywords = [\"x\"]\n[[rules.allowlists]]\nregexes = ['''[z-a]''']\n",
	} {
		if _, err := New([]byte(bad)); err == nil || !strings.Contains(err.Error(), "scan rules: x:") {
			t.Errorf("%q: %v, want refused", bad, err)
		}
	}
}
