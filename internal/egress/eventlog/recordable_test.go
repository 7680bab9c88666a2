package eventlog

import (
	"encoding/json"
	"strings"
	"testing"
)

// keyRedactor stands for the broker's scanner: it finds one key.
type keyRedactor struct{ key string }

func (k keyRedactor) Redact(texts, where []string) []Finding {
	var fs []Finding
	for i := range texts {
		if strings.Contains(texts[i], k.key) {
			texts[i] = strings.ReplaceAll(texts[i], k.key, "[REDACTED:k]")
			fs = append(fs, Finding{Rule: "k", Fingerprint: "hmac:k", Where: where[i], Action: "redacted"})
		}
	}
	return fs
}

// A key anywhere in any field a sandbox chose, however long the field
// and wherever the record cuts it, leaves no part of itself in the
// record: the scanner reads past the cut, and the cut is made after.
func FuzzRecordKeepsNoPartOfAKey(f *testing.F) {
	const key = "ghp_Zx81QmPq7RkT2vLw9NcY4bHs6JdF3gUe5KaM"
	f.Add(uint8(2), uint16(2015), []byte("a/"), 10)
	f.Add(uint8(0), uint16(230), []byte("x"), 5000)
	f.Add(uint8(5), uint16(1010), []byte("reason "), 0)
	f.Fuzz(func(t *testing.T, field uint8, at uint16, filler []byte, tail int) {
		if len(filler) == 0 {
			filler = []byte("a")
		}
		for i, c := range filler { // never a letter, digit or _ of the key
			filler[i] = "/.-"[int(c)%3]
		}
		fill := func(n int) string {
			return strings.Repeat(string(filler), n/len(filler)+1)[:n]
		}
		text := fill(int(at)%4096) + key + fill(max(0, tail)%8192)
		e := Event{Findings: []Finding{{Rule: "r"}}}
		fields := recordedFields(&e)
		*fields[int(field)%len(fields)].text = text
		Recordable(&e, keyRedactor{key})
		b, _ := json.Marshal(e)
		if strings.Contains(string(b), key[:8]) {
			t.Fatalf("part of the key is in the record: %s", b)
		}
		for _, f := range recordedFields(&e) {
			if len(*f.text) > f.max+40 {
				t.Fatalf("a field of %d bytes (at most %d)", len(*f.text), f.max)
			}
		}
	})
}
