package untrusted

import (
	"io"
	"strings"
	"unicode/utf8"
)

// TerminalText is text a sandbox wrote (a diff of its files) as it may be
// written to a terminal: printable characters, tabs and line breaks as
// they are; every other control (a carriage return that would let a line
// overwrite itself, an escape sequence, a C1 control), a bidirectional
// override or other non-printable character, and each byte of an invalid
// UTF-8 sequence as an octal escape, as Quote writes them (without
// quotes: the text is not a name).
func TerminalText(text string) string {
	clean := true
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		if r != '\n' && r != '\t' && !printable(r, n) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return text
	}
	var b strings.Builder
	b.Grow(len(text) + 16)
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		if r == '\n' || r == '\t' || printable(r, n) {
			b.WriteString(text[i : i+n])
		} else {
			for _, c := range []byte(text[i : i+n]) {
				b.WriteByte('\\')
				b.WriteByte('0' + c>>6)
				b.WriteByte('0' + c>>3&7)
				b.WriteByte('0' + c&7)
			}
		}
		i += n
	}
	return b.String()
}

// TerminalWriter writes through TerminalText to w. Each Write is taken
// as whole text: a character split across two writes is escaped byte by
// byte, never passed through.
func TerminalWriter(w io.Writer) io.Writer { return terminalWriter{w} }

type terminalWriter struct{ w io.Writer }

func (t terminalWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(t.w, TerminalText(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
