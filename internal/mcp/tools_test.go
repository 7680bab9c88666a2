package mcp

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

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

func resultText(t *testing.T, r *sdk.CallToolResult) string {
	t.Helper()
	if r == nil || len(r.Content) != 1 {
		t.Fatalf("result %+v: want one text", r)
	}
	return r.Content[0].(*sdk.TextContent).Text
}

// read_file's lines are 1-based and inclusive; a start past the end is an
// error naming the file's length, an end past it is the end.
func TestLineRangeCountsFromOne(t *testing.T) {
	data := []byte("one\ntwo\nthree\n")
	for _, c := range []struct {
		first, last int
		want        string
	}{
		{0, 0, "f (lines 1-3 of 3)\none\ntwo\nthree\n"},
		{2, 2, "f (lines 2-2 of 3)\ntwo\n"},
		{2, 99, "f (lines 2-3 of 3)\ntwo\nthree\n"},
		{3, 1, "f (lines 3-1 of 3)\n"},
	} {
		r, err := lineRange("f", data, c.first, c.last)
		if err != nil {
			t.Fatal(err)
		}
		if got := resultText(t, r); got != c.want {
			t.Errorf("lines %d-%d: %q, want %q", c.first, c.last, got, c.want)
		}
	}
	if _, err := lineRange("f", data, 4, 0); err == nil || !strings.Contains(err.Error(), "f has 3 lines") {
		t.Errorf("start past the end: %v", err)
	}
	if r, err := lineRange("e", nil, 5, 0); err != nil || resultText(t, r) != "e (lines 5-0 of 0)\n" {
		t.Errorf("empty file: %v", err)
	}
	big, _ := lineRange("b", []byte(strings.Repeat("x", maxReadBytes+10)), 1, 0)
	if got := resultText(t, big); !strings.HasSuffix(got, "[... cut at 256 KiB: read the rest with start_line/end_line ...]\n") {
		t.Errorf("a large file is not marked cut: %q", got[len(got)-80:])
	}
}

// list_files leaves .git out unless asked and quotes what the sandbox named.
func TestListingSkipsGitAndQuotesNames(t *testing.T) {
	ents := []api.FileEntry{
		{Name: ".git", Path: "/workspace/.git", Type: "dir"},
		{Name: "HEAD", Path: "/workspace/.git/HEAD", Type: "file", Size: 4},
		{Name: "a\x1b[2Jb", Path: "/workspace/a\x1b[2Jb", Type: "file", Size: 12},
		{Name: "l", Path: "/workspace/l", Type: "symlink", Target: "/etc\n"},
	}
	want := "file      12 \"/workspace/a\\033[2Jb\"\nlink         /workspace/l -> \"/etc\\n\"\n"
	if got := resultText(t, listing("/workspace", ents, false)); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	if got := resultText(t, listing("/workspace", ents, true)); !strings.HasPrefix(got, "dir          /workspace/.git/\nfile       4 /workspace/.git/HEAD\n") {
		t.Errorf("with .git: %q", got)
	}
	if got := resultText(t, listing("/workspace", ents[:2], false)); got != "/workspace is empty" {
		t.Errorf("only .git: %q", got)
	}
}

// A search pattern or path that starts with "-" cannot be taken for an
// option of grep.
func TestGrepArgvEndsOptions(t *testing.T) {
	got := grepArgv(searchIn{Pattern: "--include=x", Path: "-rf", IgnoreCase: true, Fixed: true, Glob: "*.go"})
	want := []string{"grep", "-rnIHZ", "--exclude-dir=.git", "-i", "-F", "--include=*.go", "-e", "--include=x", "--", "/workspace/-rf"}
	if !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
}

// network_log: one line per decision, refusals only when asked, and what
// the sandbox sent (host, method, path, query type) quoted.
func TestEgressLinesQuoteWhatTheSandboxSent(t *testing.T) {
	evs := []json.RawMessage{
		json.RawMessage(`{"time":"2026-01-02T03:04:05Z","kind":"http","host":"ok.test","port":443,"method":"GET","path":"/","decision":"allowed","grant":"g1"}`),
		json.RawMessage(`{"time":"2026-01-02T03:04:06Z","kind":"http","host":"evil\u001b]0;x\u0007.test","port":80,"method":"POST","path":"/a\tb","decision":"denied","reason":"not in the policy","findings":[{},{}]}`),
		json.RawMessage(`{"time":"2026-01-02T03:04:07Z","kind":"dns","host":"x.test","qtype":"TXT\n","decision":"denied"}`),
		json.RawMessage(`not json`),
	}
	want := []string{
		"03:04:05 ALLOWED http    ok.test:443 GET / (credential of grant g1 used)",
		`03:04:06 DENIED  http    "evil\033]0;x\a.test":80 POST "/a\tb" — not in the policy (2 finding(s) recorded)`,
		`03:04:07 DENIED  dns     x.test lookup "TXT\n"`,
	}
	if got := egressLines(evs, false); !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := egressLines(evs, true); !slices.Equal(got, want[1:]) {
		t.Errorf("only refused:\n%s", strings.Join(got, "\n"))
	}
}

// run_command's answer says how the command ended before its output.
func TestCommandReportSaysHowItEnded(t *testing.T) {
	out, errs := newCapped(maxOutput), newCapped(maxOutput)
	_, _ = out.Write([]byte("no newline"))
	got := commandReport(&api.ExecEnd{ExitCode: 137, SandboxEnded: true, EndReason: "memory limit exceeded"}, 1500*time.Millisecond, 300, out, errs)
	want := "exit code: 137 (took 1.50 s)\nTHE SANDBOX ENDED while the command ran: memory limit exceeded\n--- stdout ---\nno newline\n--- stderr ---\n"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	if got := commandReport(&api.ExecEnd{ExitCode: -1, TimedOut: true}, 0, 5, newCapped(8), newCapped(8)); !strings.Contains(got, "TIMED OUT after 5 s") {
		t.Errorf("timeout: %q", got)
	}
}
