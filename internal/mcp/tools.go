package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

// Caps on what a tool answers, so one call cannot flood the model's
// context; what is cut is marked.
const (
	maxOutput    = 32 << 10 // per stream of run_command
	maxReadBytes = 256 << 10
	// maxReadFileBytes is the largest file read_file reads (to pick its
	// line range): its answer goes to a model as text.
	maxReadFileBytes = 64 << 20
	maxEntries       = 1000
	maxMatches       = 500
)

type runIn struct {
	Command        string            `json:"command" jsonschema:"the shell command to run (sh -c), e.g. 'go test ./...' or 'npm test -- checkout.spec.ts'"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory (default /workspace)"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 300, at most 3600)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables for this command"`
}

type readIn struct {
	Path      string `json:"path" jsonschema:"file path; relative paths are under /workspace"`
	StartLine int    `json:"start_line,omitempty" jsonschema:"first line to return (1-based; default 1)"`
	EndLine   int    `json:"end_line,omitempty" jsonschema:"last line to return (inclusive; default: the end of the file)"`
}

type writeIn struct {
	Path    string `json:"path" jsonschema:"file path; relative paths are under /workspace; missing directories are made"`
	Content string `json:"content" jsonschema:"the file's whole new content"`
}

type editIn struct {
	Path      string `json:"path" jsonschema:"file path; relative paths are under /workspace"`
	OldString string `json:"old_string" jsonschema:"the exact text to replace; it must occur exactly once in the file (include surrounding lines to make it unique)"`
	NewString string `json:"new_string" jsonschema:"the replacement text"`
}

type listIn struct {
	Path       string `json:"path,omitempty" jsonschema:"directory to list (default /workspace)"`
	Depth      int    `json:"depth,omitempty" jsonschema:"levels to descend (default 2, at most 6)"`
	IncludeGit bool   `json:"include_git,omitempty" jsonschema:"also list .git directories (skipped by default)"`
}

type searchIn struct {
	Pattern    string `json:"pattern" jsonschema:"the text to search for (a basic regular expression unless fixed_string)"`
	Path       string `json:"path,omitempty" jsonschema:"file or directory to search (default /workspace)"`
	Glob       string `json:"glob,omitempty" jsonschema:"only files whose name matches, e.g. '*.go'"`
	IgnoreCase bool   `json:"ignore_case,omitempty"`
	Fixed      bool   `json:"fixed_string,omitempty" jsonschema:"take pattern literally"`
	MaxResults int    `json:"max_results,omitempty" jsonschema:"at most this many matching lines (default 100, at most 500)"`
}

type diffIn struct{}

type netIn struct {
	OnlyRefused bool `json:"only_refused,omitempty" jsonschema:"only what was refused or failed"`
	Limit       int  `json:"limit,omitempty" jsonschema:"the most recent N decisions (default 50)"`
}

// text is a tool's answer for the model.
func text(format string, a ...any) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf(format, a...)}}}
}

// toolErr makes a service or API error into words for the model; the SDK
// returns it as a tool error, not a protocol failure.
func toolErr(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return errors.New(ae.Message)
	}
	return err
}

// under puts a relative path under /workspace.
func under(p string) string {
	if p == "" {
		return "/workspace"
	}
	if !strings.HasPrefix(p, "/") {
		return path.Join("/workspace", p)
	}
	return p
}

// closed is the OpenWorldHint of the tools that act on the sandbox's own
// files: nothing outside it.
var closed = false

// readOnly annotates a tool that changes nothing and reaches nothing
// outside the sandbox.
func readOnly(title string) *sdk.ToolAnnotations {
	return &sdk.ToolAnnotations{Title: title, ReadOnlyHint: true, OpenWorldHint: &closed}
}

// addTools registers the session's tools, each a method of the session,
// annotated with what they may do (hints for the client: every one acts
// in the sandbox only; run_command may reach the hosts its policy allows).
func (s *Session) addTools(srv *sdk.Server) {
	sdk.AddTool(srv, &sdk.Tool{Name: "run_command", Annotations: &sdk.ToolAnnotations{Title: "Run a command in the sandbox"}, Description: "Run a shell command inside the sandbox (in /workspace unless cwd says otherwise) and return its exit code, stdout, stderr and how long it took. Use it to build, run tests, install packages or inspect the environment. The sandbox reaches only the hosts its egress policy allows, none unless the session was started with some: when a download or install fails, read network_log rather than retrying. Output past 32 KiB per stream is cut in the middle, marked."}, s.runCommand)
	sdk.AddTool(srv, &sdk.Tool{Name: "read_file", Annotations: readOnly("Read a file"), Description: "Read a text file of the sandbox, optionally a range of lines (1-based, inclusive). Large files are cut at 256 KiB, marked; read them by line ranges. Files over 64 MiB are refused."}, s.readFile)
	sdk.AddTool(srv, &sdk.Tool{Name: "write_file", Annotations: &sdk.ToolAnnotations{Title: "Write a file", IdempotentHint: true, OpenWorldHint: &closed}, Description: "Create or replace a file of the sandbox with the given content (missing directories are made)."}, s.writeFile)
	sdk.AddTool(srv, &sdk.Tool{Name: "edit_file", Annotations: &sdk.ToolAnnotations{Title: "Edit a file", OpenWorldHint: &closed}, Description: "Replace one exact occurrence of old_string with new_string in a file. old_string must occur exactly once: the call fails, saying so, when it is absent or found more than once (then include more surrounding text)."}, s.editFile)
	sdk.AddTool(srv, &sdk.Tool{Name: "list_files", Annotations: readOnly("List files"), Description: "List a directory of the sandbox recursively (default /workspace, depth 2), skipping .git unless asked. Each line: type, size, path."}, s.listFiles)
	sdk.AddTool(srv, &sdk.Tool{Name: "search_files", Annotations: readOnly("Search files"), Description: "Search file contents in the sandbox (grep, recursive, skipping .git and binary files). Returns path:line:text for each matching line."}, s.searchFiles)
	sdk.AddTool(srv, &sdk.Tool{Name: "diff", Annotations: readOnly("What changed in /workspace"), Description: "The changes made to /workspace so far, as a unified diff (the session's result)."}, s.diff)
	sdk.AddTool(srv, &sdk.Tool{Name: "network_log", Annotations: readOnly("The network log"), Description: "What the sandbox tried to reach over the network and what the egress policy decided, with the reason for each refusal. Call it when a download, install or request fails, to explain the failure instead of retrying."}, s.networkLog)
}

func (s *Session) runCommand(ctx context.Context, req *sdk.CallToolRequest, in runIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, nil, errors.New("command is empty")
	}
	timeout := in.TimeoutSeconds
	if timeout <= 0 {
		timeout = 300
	}
	timeout = min(timeout, 3600)
	cwd := in.Cwd
	if cwd != "" {
		cwd = under(cwd)
	}
	stdout, stderr := newCapped(maxOutput), newCapped(maxOutput)
	t0 := time.Now()
	end, err := sb.Exec(ctx, &api.Exec{Cmd: []string{"sh", "-c", in.Command}, Cwd: cwd, Env: in.Env, Timeout: fmt.Sprintf("%ds", timeout)}, stdout, stderr)
	if err != nil {
		return nil, nil, toolErr(err)
	}
	res := text("%s", commandReport(end, time.Since(t0), timeout, stdout, stderr))
	res.IsError = false
	return res, nil, nil
}

// commandReport is run_command's answer: how the command ended, then its
// output.
func commandReport(end *api.ExecEnd, took time.Duration, timeout int, stdout, stderr *capped) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit code: %d (took %.2f s)\n", end.ExitCode, took.Seconds())
	switch {
	case end.TimedOut:
		fmt.Fprintf(&b, "TIMED OUT after %d s: the command was killed\n", timeout)
	case end.SandboxEnded:
		fmt.Fprintf(&b, "THE SANDBOX ENDED while the command ran: %s\n", end.EndReason)
	case end.Limit != "":
		fmt.Fprintf(&b, "LIMIT (%s): %s\n", end.Limit, end.Status)
	case end.Error != "":
		fmt.Fprintf(&b, "error: %s\n", end.Error)
	}
	fmt.Fprintf(&b, "--- stdout ---\n%s", stdout)
	if !strings.HasSuffix(stdout.String(), "\n") && stdout.Len() > 0 {
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "--- stderr ---\n%s", stderr)
	return b.String()
}

func (s *Session) readFile(ctx context.Context, req *sdk.CallToolRequest, in readIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	p := under(in.Path)
	data, err := sb.ReadFile(ctx, p, maxReadFileBytes)
	if err != nil {
		return nil, nil, toolErr(err)
	}
	res, err := lineRange(p, data, in.StartLine, in.EndLine)
	return res, nil, err
}

// lineRange is read_file's answer: lines first to last (1-based,
// inclusive; last <= 0 is the end) of the file p holding data, cut at
// maxReadBytes.
func lineRange(p string, data []byte, first, last int) (*sdk.CallToolResult, error) {
	lines := strings.SplitAfter(string(data), "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	first = max(first, 1)
	if last <= 0 || last > len(lines) {
		last = len(lines)
	}
	if first > len(lines) && len(lines) > 0 {
		return nil, fmt.Errorf("%s has %d lines; start_line %d is past its end", p, len(lines), first)
	}
	body := ""
	if first <= last {
		body = strings.Join(lines[first-1:last], "")
	}
	cut := ""
	if len(body) > maxReadBytes {
		cut = fmt.Sprintf("\n[... cut at %d KiB: read the rest with start_line/end_line ...]\n", maxReadBytes>>10)
		body = body[:maxReadBytes]
	}
	return text("%s (lines %d-%d of %d)\n%s%s", p, first, last, len(lines), body, cut), nil
}

func (s *Session) writeFile(ctx context.Context, req *sdk.CallToolRequest, in writeIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	p := under(in.Path)
	if err := sb.WriteFile(ctx, p, []byte(in.Content)); err != nil {
		return nil, nil, toolErr(err)
	}
	return text("wrote %d bytes to %s", len(in.Content), p), nil, nil
}

func (s *Session) editFile(ctx context.Context, req *sdk.CallToolRequest, in editIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	p := under(in.Path)
	if in.OldString == "" {
		return nil, nil, errors.New("old_string is empty: to create or replace a whole file use write_file")
	}
	if err := sb.Edit(ctx, p, in.OldString, in.NewString); err != nil {
		return nil, nil, toolErr(err)
	}
	return text("edited %s: replaced 1 occurrence", p), nil, nil
}

func (s *Session) listFiles(ctx context.Context, req *sdk.CallToolRequest, in listIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	p, depth := under(in.Path), in.Depth
	if depth <= 0 {
		depth = 2
	}
	depth = min(depth, 6)
	ents, err := sb.ListDir(ctx, p, depth)
	if err != nil {
		return nil, nil, toolErr(err)
	}
	return listing(p, ents, in.IncludeGit), nil, nil
}

// listing is list_files' answer: one line per entry (type, size, quoted
// path), .git left out unless includeGit, at most maxEntries.
func listing(p string, ents []api.FileEntry, includeGit bool) *sdk.CallToolResult {
	var b strings.Builder
	n := 0
	for _, e := range ents {
		if !includeGit && (e.Name == ".git" || strings.Contains(e.Path, "/.git/")) {
			continue
		}
		if n++; n > maxEntries {
			fmt.Fprintf(&b, "[... more than %d entries: list a subdirectory ...]\n", maxEntries)
			break
		}
		switch e.Type {
		case "dir":
			fmt.Fprintf(&b, "dir          %s/\n", untrusted.Quote(e.Path))
		case "symlink":
			fmt.Fprintf(&b, "link         %s -> %s\n", untrusted.Quote(e.Path), untrusted.Quote(e.Target))
		default:
			fmt.Fprintf(&b, "file %7d %s\n", e.Size, untrusted.Quote(e.Path))
		}
	}
	if n == 0 {
		return text("%s is empty", p)
	}
	return text("%s", b.String())
}

func (s *Session) searchFiles(ctx context.Context, req *sdk.CallToolRequest, in searchIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	if in.Pattern == "" {
		return nil, nil, errors.New("pattern is empty")
	}
	limit := in.MaxResults
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, maxMatches)
	out, errb := newCapped(maxOutput*4), newCapped(maxOutput)
	end, err := sb.Exec(ctx, &api.Exec{Cmd: grepArgv(in), Timeout: "120s"}, out, errb)
	if err != nil {
		return nil, nil, toolErr(err)
	}
	switch end.ExitCode {
	case 0:
	case 1:
		return text("no matches for %q in %s", in.Pattern, under(in.Path)), nil, nil
	default:
		return nil, nil, fmt.Errorf("search failed (exit %d): %s", end.ExitCode, strings.TrimSpace(errb.String()))
	}
	lines := matchLines(out.String())
	more := ""
	if len(lines) > limit {
		more = fmt.Sprintf("[... %d more matching lines: narrow the search ...]\n", len(lines)-limit)
		lines = lines[:limit]
	}
	return text("%s\n%s", strings.Join(lines, "\n"), more), nil, nil
}

// grepArgv is the command search_files runs.
func grepArgv(in searchIn) []string {
	// -HZ: every match names its file, ended by a NUL, so a name
	// holding a newline cannot forge a match line; names are then
	// shown quoted.
	argv := []string{"grep", "-rnIHZ", "--exclude-dir=.git"}
	if in.IgnoreCase {
		argv = append(argv, "-i")
	}
	if in.Fixed {
		argv = append(argv, "-F")
	}
	if in.Glob != "" {
		argv = append(argv, "--include="+in.Glob)
	}
	return append(argv, "-e", in.Pattern, "--", under(in.Path))
}

func (s *Session) diff(ctx context.Context, req *sdk.CallToolRequest, _ diffIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	d, err := sb.Diff(ctx)
	if err != nil {
		return nil, nil, toolErr(err)
	}
	if d == "" {
		return text("no changes in /workspace"), nil, nil
	}
	return text("%s", d), nil, nil
}

func (s *Session) networkLog(ctx context.Context, req *sdk.CallToolRequest, in netIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandbox(ctx, req.Session)
	if err != nil {
		return nil, nil, err
	}
	evs, err := sb.Egress(ctx)
	if err != nil {
		return nil, nil, toolErr(err)
	}
	limit := in.Limit
	if limit <= 0 {
		limit = 50
	}
	lines := egressLines(evs, in.OnlyRefused)
	if len(lines) == 0 {
		return text("no network activity recorded for this sandbox yet"), nil, nil
	}
	if len(lines) > limit {
		lines = lines[len(lines)-limit:]
	}
	return text("%s\n", strings.Join(lines, "\n")), nil, nil
}

// egressLines are network_log's lines, one per egress decision (the data
// of an egress audit record), refusals only if onlyRefused; what the
// sandbox sent is quoted.
func egressLines(evs []json.RawMessage, onlyRefused bool) []string {
	var lines []string
	for _, raw := range evs {
		var e struct {
			Time                     time.Time
			Kind, Host, Method, Path string
			Port                     int
			Decision, Reason, Rule   string
			QType                    string `json:"qtype"`
			Grant                    string
			Findings                 []json.RawMessage
		}
		if json.Unmarshal(raw, &e) != nil {
			continue
		}
		if onlyRefused && e.Decision == "allowed" {
			continue
		}
		// Hosts, methods and paths are what the sandbox sent: quoted.
		target := untrusted.Quote(e.Host)
		if e.Port != 0 {
			target = fmt.Sprintf("%s:%d", target, e.Port)
		}
		what := strings.TrimSpace(untrusted.Quote(e.Method) + " " + untrusted.Quote(e.Path))
		if e.Kind == "dns" {
			what = "lookup " + untrusted.Quote(e.QType)
		}
		line := fmt.Sprintf("%s %-7s %-7s %s %s", e.Time.Format("15:04:05"), strings.ToUpper(e.Decision), e.Kind, target, what)
		if e.Reason != "" {
			line += " — " + e.Reason
		}
		if e.Grant != "" {
			line += " (credential of grant " + e.Grant + " used)"
		}
		if len(e.Findings) > 0 {
			line += fmt.Sprintf(" (%d finding(s) recorded)", len(e.Findings))
		}
		lines = append(lines, line)
	}
	return lines
}

func (s *Session) addResources(srv *sdk.Server) {
	srv.AddResourceTemplate(&sdk.ResourceTemplate{
		Name: "workspace-file", Title: "A file of the sandbox's /workspace", URITemplate: "file:///workspace/{+path}",
		Description: "The current content of a file under /workspace in the session's sandbox.", MIMEType: "text/plain",
	}, func(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
		uri := req.Params.URI
		p, ok := strings.CutPrefix(uri, "file://")
		if !ok || path.Clean(p) != p || !strings.HasPrefix(p, "/workspace/") {
			return nil, sdk.ResourceNotFoundError(uri)
		}
		sb, err := s.sandbox(ctx, req.Session)
		if err != nil {
			return nil, err
		}
		data, err := sb.ReadFile(ctx, p, maxReadBytes)
		if err != nil {
			return nil, sdk.ResourceNotFoundError(uri)
		}
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: string(data)}}}, nil
	})
}

// matchLines turns grep -HZ's output (name NUL line-number:text newline)
// into "name:line-number:text" lines, the name quoted (untrusted.Quote).
func matchLines(out string) []string {
	var lines []string
	for out != "" {
		name, rest, ok := strings.Cut(out, "\x00")
		if !ok { // what is left of a cut output
			for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
				lines = append(lines, untrusted.QuoteText(l))
			}
			break
		}
		var match string
		match, out, _ = strings.Cut(rest, "\n")
		lines = append(lines, untrusted.Quote(name)+":"+match)
	}
	return lines
}

// capped keeps the first and last halves of what is written past max
// bytes, and says how much it cut.
type capped struct {
	max        int
	head, tail []byte
	total      int
}

func newCapped(max int) *capped { return &capped{max: max} }

func (c *capped) Write(b []byte) (int, error) {
	c.total += len(b)
	room := c.max/2 - len(c.head)
	if room > 0 {
		n := min(room, len(b))
		c.head = append(c.head, b[:n]...)
		b = b[n:]
	}
	c.tail = append(c.tail, b...)
	if over := len(c.tail) - c.max/2; over > 0 {
		c.tail = slices.Delete(c.tail, 0, over)
	}
	return len(b), nil
}

func (c *capped) Len() int { return c.total }

func (c *capped) String() string {
	if c.total <= len(c.head)+len(c.tail) {
		return string(c.head) + string(c.tail)
	}
	return fmt.Sprintf("%s\n[... %d bytes cut ...]\n%s", c.head, c.total-len(c.head)-len(c.tail), c.tail)
}
