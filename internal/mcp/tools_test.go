package mcp

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
)

func TestCappedKeepsBothEndsAndSaysWhatItCut(t *testing.T) {
	c := newCapped(10)
	for _, s := range []string{"abc", "defgh", "ijklmnop", "qrstuvwxyz"} {
		_, _ = c.Write([]byte(s))
	}
	got := c.String()
	if !strings.HasPrefix(got, "abcde") || !strings.HasSuffix(got, "vwxyz") || !strings.Contains(got, "[... 16 bytes cut ...]") || c.Len() != 26 {
		t.Errorf("%q (len %d)", got, c.Len())
	}
	small := newCapped(10)
	_, _ = small.Write([]byte("short"))
	if small.String() != "short" {
		t.Errorf("%q", small.String())
	}
}

func TestUnderAndToolErr(t *testing.T) {
	for in, want := range map[string]string{"": "/workspace", "calc.py": "/workspace/calc.py", "a/../b": "/workspace/b", "/tmp/x": "/tmp/x"} {
		if got := under(in); got != want {
			t.Errorf("under(%q) = %q, want %q", in, got, want)
		}
	}
	if err := toolErr(&api.Error{Code: api.CodeNotFound, Message: "no such file"}); err.Error() != "no such file" {
		t.Errorf("an API error for the model: %q", err)
	}
	if err := toolErr(errors.New("plain")); err.Error() != "plain" {
		t.Errorf("%q", err)
	}
}

// A file name holding a newline cannot forge a search match, nor an
// escape sequence reach whoever reads the tool's text.
func TestMatchLinesQuoteNames(t *testing.T) {
	out := "/workspace/calc.py\x001:def add(a, b):\n/workspace/x\n/workspace/calc.py:9:forged\x1b]52;c;aGk=\a\x002:def add\n"
	got := strings.Join(matchLines(out), "\n")
	want := "/workspace/calc.py:1:def add(a, b):\n" + `"/workspace/x\n/workspace/calc.py:9:forged\033]52;c;aGk=\a"` + ":2:def add"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Output cut in the middle: the rest is shown, line by line, quoted.
	if got := strings.Join(matchLines("a\x001:x\n[... 9 bytes cut ...]\n2:y\x1b[2K\n"), "\n"); got != "a:1:x\n[... 9 bytes cut ...]\n"+`"2:y\033[2K"` {
		t.Errorf("cut: %q", got)
	}
}
