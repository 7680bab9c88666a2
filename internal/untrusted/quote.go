package untrusted

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Quote returns name as it may be shown to a person: unchanged when it is
// valid UTF-8 of printable characters without a double quote or a
// backslash; otherwise in double quotes with C escapes, as git's
// core.quotePath does: \a \b \t \n \v \f \r \" \\ by name, every other
// byte of a control, non-printable (C1 controls, bidirectional overrides,
// zero-width and separator characters) or invalid UTF-8 sequence as a
// three-digit octal escape. So no escape sequence, line break or forged
// line a sandbox writes into a file name reaches a terminal, and a quoted
// name cannot pass for an unquoted one. strconv.Unquote reverses it.
func Quote(name string) string {
	if !needsQuote(name) {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) + 2)
	b.WriteByte('"')
	for i := 0; i < len(name); {
		r, n := utf8.DecodeRuneInString(name[i:])
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteByte(byte(r))
		case r < 0x20 && named[r] != 0:
			b.WriteByte('\\')
			b.WriteByte(named[r])
		case !printable(r, n):
			for _, c := range []byte(name[i : i+n]) {
				b.WriteByte('\\')
				b.WriteByte('0' + c>>6)
				b.WriteByte('0' + c>>3&7)
				b.WriteByte('0' + c&7)
			}
		default:
			b.WriteString(name[i : i+n])
		}
		i += n
	}
	b.WriteByte('"')
	return b.String()
}

// named are the control characters with a one-letter escape.
var named = [0x20]byte{'\a': 'a', '\b': 'b', '\t': 't', '\n': 'n', '\v': 'v', '\f': 'f', '\r': 'r'}

// printable reports whether the rune r, n bytes long in its string, may be
// written as itself (an invalid byte decodes as RuneError of length 1).
func printable(r rune, n int) bool {
	return !(r == utf8.RuneError && n == 1) && unicode.IsPrint(r)
}

// QuoteText is Quote for free text a sandbox wrote (an error message),
// where a double quote or a backslash is ordinary: the text is quoted only
// when it holds a control, non-printable or invalid byte.
func QuoteText(text string) string {
	for i := 0; i < len(text); {
		r, n := utf8.DecodeRuneInString(text[i:])
		if !printable(r, n) {
			return Quote(text)
		}
		i += n
	}
	return text
}

func needsQuote(name string) bool {
	for i := 0; i < len(name); {
		r, n := utf8.DecodeRuneInString(name[i:])
		if r == '"' || r == '\\' || !printable(r, n) {
			return true
		}
		i += n
	}
	return false
}
