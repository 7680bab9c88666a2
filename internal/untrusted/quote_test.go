package untrusted

import (
	"strconv"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestQuoteDisarmsTerminalSequences(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"README.md", "README.md"},
		{"dir/with space.txt", "dir/with space.txt"},
		{"héllo-日本.txt", "héllo-日本.txt"},
		{"line\x1b[2Kerase", `"line\033[2Kerase"`},
		{"\x1b]52;c;ZWNobyBwd25lZA==\a", `"\033]52;c;ZWNobyBwd25lZA==\a"`},
		{"x\n+++ b/forged", `"x\n+++ b/forged"`},
		{"tab\there\r", `"tab\there\r"`},
		{`quote"and\back`, `"quote\"and\\back"`},
		{`"looks-quoted"`, `"\"looks-quoted\""`},
		{"del\x7f", `"del\177"`},
		{"c1\u009b31m", `"c1\302\23331m"`},
		{"bidi\u202etxt.exe", `"bidi\342\200\256txt.exe"`},
		{"bad\xff\xfe", `"bad\377\376"`},
		{"nul\x00", `"nul\000"`},
	} {
		if got := Quote(c.in); got != c.want {
			t.Errorf("Quote(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestQuoteTextKeepsOrdinaryQuotes(t *testing.T) {
	if got := QuoteText(`bad environment variable "A=B"`); got != `bad environment variable "A=B"` {
		t.Errorf("%s", got)
	}
	if got := QuoteText("open \"x\x1b[2K\""); got != `"open \"x\033[2K\""` {
		t.Errorf("%s", got)
	}
}

// FuzzQuoteIsSafeAndReversible: whatever the name, the quoted form holds
// only printable characters (no control byte, no invalid UTF-8), and
// either is the name itself or unquotes back to it.
func FuzzQuoteIsSafeAndReversible(f *testing.F) {
	for _, s := range []string{"", "a", "\x1b[2K", "a\nb", `"`, `\`, "\u009b", "\xff", "日本", "\u202e", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if tq := QuoteText(name); tq != name && tq != Quote(name) {
			t.Fatalf("QuoteText(%q) = %q", name, tq)
		}
		q := Quote(name)
		if !utf8.ValidString(q) {
			t.Fatalf("Quote(%q) = %q: invalid UTF-8", name, q)
		}
		for _, r := range q {
			if !unicode.IsPrint(r) {
				t.Fatalf("Quote(%q) = %q holds %U", name, q, r)
			}
		}
		if q == name {
			if len(name) > 0 && name[0] == '"' {
				t.Fatalf("Quote(%q) left a leading quote", name)
			}
			return
		}
		back, err := strconv.Unquote(q)
		if err != nil || back != name {
			t.Fatalf("Unquote(Quote(%q)) = %q, %v", name, back, err)
		}
	})
}
