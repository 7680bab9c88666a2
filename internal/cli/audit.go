package cli

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/audit/record"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/system"
	"github.com/airlock-sandbox/airlock/internal/untrusted"
)

func auditCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "audit",
		Short: "Read and verify the daemon's tamper-evident audit log",
		Long: `The daemon records what every sandbox did (created, commands, files, egress,
destroyed and why) in a hash-chained log under DATA_DIR/audit, each segment
closed by a checkpoint signed with DATA_DIR/audit.key. These commands read it
on the daemon's host, as root.

  sudo airlock audit verify
  sudo airlock audit query --sandbox ID --kind exec.start
  sudo airlock audit report ID
  airlock audit report --log RUN-LOG-FILE     (an airlock run's own log)`,
	}
	var logPath string
	c.PersistentFlags().StringVar(&logPath, "log", "", "for query and report: the log to read, a daemon's directory or an airlock run's file (default: DATA_DIR/audit)")
	c.AddCommand(auditVerifyCmd(g), auditPubkeyCmd(g), auditQueryCmd(g, &logPath), auditReportCmd(g, &logPath))
	return c
}

func auditVerifyCmd(g *globals) *cobra.Command {
	var pubFile, anchorFlag string
	var asJSON bool
	c := &cobra.Command{
		Use:   "verify [DIR | RUN-LOG-FILE]",
		Short: "Check the log's chain, order, signatures and completeness; name the first bad record",
		Long: `verify checks the log's chain, order, signatures and completeness, and
names the first bad record (exit 1).

With --anchor SEQ:HASH (a head read from the daemon earlier and kept
elsewhere: audit_head of GET /v1/node, which a cluster records), the log
must also hold record SEQ with that hash: a log cut below the anchor, or
rewritten at or before it, fails, even where its chain was made whole
again.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			anchor, err := parseAnchor(anchorFlag)
			if err != nil {
				return err
			}
			dir := system.AuditDir(g.dataDir)
			if len(args) == 1 {
				dir = args[0]
			}
			pub, err := auditPublicKey(g, dir, pubFile)
			if err != nil {
				return err
			}
			// The newest segment of a running daemon, or of one killed before
			// it could close it, has no closing checkpoint yet; its end is
			// then checked against the head kept apart.
			head, live := auditHead(g, dir)
			if fi, err := os.Stat(dir); err == nil && fi.Mode().IsRegular() {
				head, live = nil, false // a finished run's log must end with its closing checkpoint
			}
			s, err := audit.VerifyAnchored(dir, pub, head, live || head != nil, anchor)
			var ve *audit.VerifyError
			if errors.As(err, &ve) {
				if asJSON {
					_ = printJSON(g.stdout, map[string]any{"ok": false, "file": ve.File, "line": ve.Line, "seq": ve.Seq, "reason": ve.Reason})
				} else {
					fmt.Fprintf(g.stdout, "BAD: %v\n", ve)
				}
				return exitError{1}
			}
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.stdout, map[string]any{"ok": true, "segments": s.Segments, "records": s.Records, "checkpoints": s.Checkpoints, "head": s.Head, "head_checked": head != nil, "anchor_checked": anchor != nil})
			}
			fmt.Fprintf(g.stdout, "ok: %d records in %d segments, %d signed checkpoints, head seq %d", s.Records, s.Segments, s.Checkpoints, s.Head.Seq)
			if head == nil {
				fmt.Fprint(g.stdout, " (no head kept apart to check the end against)")
			}
			if anchor != nil {
				fmt.Fprintf(g.stdout, "; anchor seq %d holds", anchor.Seq)
			}
			fmt.Fprintln(g.stdout)
			return nil
		},
	}
	c.Flags().StringVar(&pubFile, "pubkey", "", "the audit public key (PEM; default: derived from DATA_DIR/audit.key)")
	c.Flags().StringVar(&anchorFlag, "anchor", "", "SEQ:HASH: fail unless the log holds record SEQ with this hash (a head seen earlier: GET /v1/node's audit_head)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// parseAnchor reads --anchor SEQ:HASH ("": none).
func parseAnchor(v string) (*audit.Head, error) {
	if v == "" {
		return nil, nil
	}
	seqText, hash, _ := strings.Cut(v, ":")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil || seq == 0 || len(hash) != 64 || strings.Trim(hash, "0123456789abcdef") != "" {
		return nil, errdefs.Invalid(fmt.Sprintf("--anchor %q: want SEQ:HASH, a record's sequence number (from 1) and its hash (64 lowercase hex digits), as GET /v1/node's audit_head gives them", v))
	}
	return &audit.Head{Seq: seq, Hash: hash}, nil
}

func auditPublicKey(g *globals, dir, pubFile string) (ed25519.PublicKey, error) {
	if pubFile != "" {
		b, err := os.ReadFile(pubFile)
		if err != nil {
			return nil, errdefs.Invalid("--pubkey: " + err.Error())
		}
		pub, err := audit.ParsePublicKey(b)
		if err != nil {
			return nil, errdefs.Invalid("--pubkey: " + err.Error())
		}
		return pub, nil
	}
	keyFile := system.AuditKeyFile(logHome(dir))
	if fi, err := os.Stat(dir); err == nil && fi.Mode().IsRegular() {
		keyFile = filepath.Join(system.RunStateDir(), "audit.key") // an `airlock run` log
	}
	if _, err := os.Stat(keyFile); err != nil {
		return nil, errdefs.New(errdefs.ErrNotFound, "no audit key at "+keyFile+": pass --pubkey")
	}
	key, err := audit.LoadOrCreateKey(keyFile)
	if err != nil {
		return nil, err
	}
	return key.Public().(ed25519.PublicKey), nil
}

// logHome is the directory that holds a log directory's signing key and
// the database keeping its head apart: the daemon's data directory for
// DATA_DIR/audit, an `airlock mcp` session's directory for its audit/.
func logHome(dir string) string { return filepath.Dir(filepath.Clean(dir)) }

// auditHead reads the head kept apart in the log's database, and
// whether a daemon is writing the log now (its newest segment is open).
func auditHead(g *globals, dir string) (*audit.Head, bool) {
	live := false
	if f, err := os.Open(filepath.Join(g.stateDir, "daemon.lock")); err == nil {
		live = flockHeld(f)
		f.Close()
	}
	if filepath.Clean(dir) != filepath.Clean(system.AuditDir(g.dataDir)) {
		live = false // that lock is the daemon's, of its own log
	}
	dbFile := filepath.Join(logHome(dir), "airlock.db")
	if _, err := os.Stat(dbFile); err != nil {
		return nil, live
	}
	db, err := store.Open(dbFile)
	if err != nil {
		return nil, live
	}
	defer db.Close()
	v, err := db.Meta(context.Background(), system.AuditHeadMeta)
	if err != nil || v == "" {
		return nil, live
	}
	var h audit.Head
	if json.Unmarshal([]byte(v), &h) != nil {
		return nil, live
	}
	return &h, live
}

func auditPubkeyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pubkey",
		Short: "Print the audit log's public key (PEM), for verifying a copy elsewhere",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := os.Stat(system.AuditKeyFile(g.dataDir)); err != nil {
				return errdefs.New(errdefs.ErrNotFound, "no audit key yet: it is made when the daemon first starts")
			}
			key, err := audit.LoadOrCreateKey(system.AuditKeyFile(g.dataDir))
			if err != nil {
				return err
			}
			_, err = g.stdout.Write(audit.PublicKeyPEM(key))
			return err
		},
	}
}

// auditFilter selects records.
type auditFilter struct {
	tenant, sandbox, trigger, kind, decision string
	since, until                             time.Time
}

func (f *auditFilter) match(r *audit.Record) bool {
	switch {
	case f.tenant != "" && r.Tenant != f.tenant,
		f.sandbox != "" && r.Sandbox != f.sandbox,
		f.trigger != "" && r.Trigger != f.trigger,
		f.kind != "" && r.Kind != f.kind && !strings.HasPrefix(r.Kind, f.kind+"."),
		!f.since.IsZero() && r.Time.Before(f.since),
		!f.until.IsZero() && r.Time.After(f.until):
		return false
	}
	if f.decision != "" {
		var d struct {
			Decision string `json:"decision"`
		}
		if json.Unmarshal(r.Data, &d) != nil || d.Decision != f.decision {
			return false
		}
	}
	return true
}

func auditQueryCmd(g *globals, logPath *string) *cobra.Command {
	var f auditFilter
	var since, until string
	var follow, asJSON bool
	c := &cobra.Command{
		Use:   "query [flags]",
		Short: "Print audit records as JSON lines, filtered",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if f.since, err = parseWhen("--since", since); err != nil {
				return err
			}
			if f.until, err = parseWhen("--until", until); err != nil {
				return err
			}
			if asJSON && follow {
				return errdefs.Invalid("--json prints one list, which --follow never ends: use one of them")
			}
			enc := json.NewEncoder(g.stdout)
			n := 0
			if asJSON {
				fmt.Fprint(g.stdout, "[")
			}
			err = audit.Read(cmd.Context(), auditLogPath(g, *logPath), follow, func(r *audit.Record) error {
				if !f.match(r) {
					return nil
				}
				if asJSON && n > 0 {
					fmt.Fprint(g.stdout, ",")
				}
				n++
				return enc.Encode(r)
			})
			if asJSON && err == nil {
				fmt.Fprintln(g.stdout, "]")
			}
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON list of the records ([] when none) instead of JSON lines")
	fl := c.Flags()
	fl.StringVar(&f.tenant, "tenant", "", "only this tenant's records, by its id (airlock tenant ls; records name tenants by id)")
	fl.StringVar(&f.sandbox, "sandbox", "", "only this sandbox's records")
	fl.StringVar(&f.trigger, "trigger", "", "only records of this trigger (task id)")
	fl.StringVar(&f.kind, "kind", "", "only this kind (sandbox.created, exec.start, exec.end, file.write, egress, ...) or family (exec, file)")
	fl.StringVar(&f.decision, "decision", "", "egress records with this decision (allowed, denied, error)")
	fl.StringVar(&since, "since", "", "from this time (RFC 3339) or this long ago (Go duration, 1h)")
	fl.StringVar(&until, "until", "", "up to this time (RFC 3339) or this long ago")
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing records as they are written")
	return c
}

func parseWhen(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, errdefs.Invalid(fmt.Sprintf("%s %q: want RFC 3339 time or a duration such as 1h", flag, v))
	}
	return t, nil
}

func auditReportCmd(g *globals, logPath *string) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "report [SANDBOX]",
		Short: "Summarize one sandbox's run: trigger, commands, network, files changed, limits",
		Long: `Summarize one sandbox's records for a person: its trigger and controls, every
command with its exit, every file call, the hosts it reached and was refused,
the credentials found, the files it changed in /workspace and the limits it hit.
--json prints the same summary as one object, names exactly as recorded.

  sudo airlock audit report 8035500fd41a
  airlock audit report --log ~/.local/state/airlock/runs/20261201T101500.123456789Z.audit

SANDBOX may be left out when the log holds one sandbox (an airlock run's log).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var recs []*audit.Record
			ids := map[string]bool{}
			err := audit.Read(cmd.Context(), auditLogPath(g, *logPath), false, func(r *audit.Record) error {
				if r.Sandbox != "" {
					ids[r.Sandbox] = true
				}
				if r.Sandbox != "" && (len(args) == 0 || r.Sandbox == args[0]) {
					recs = append(recs, r)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if len(args) == 0 && len(ids) > 1 {
				return errdefs.Invalid(fmt.Sprintf("the log holds %d sandboxes: name one (airlock audit query --kind sandbox.created lists them)", len(ids)))
			}
			if len(recs) == 0 {
				return errdefs.New(errdefs.ErrNotFound, "no audit records of sandbox "+strings.Join(args, ""))
			}
			if asJSON {
				return cmdutil.PrintJSON(g.stdout, summarize(recs))
			}
			return writeReport(g.stdout, recs)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the summary as one JSON object")
	return c
}

// auditLogPath is the log the reading commands read: --log, or the
// daemon's.
func auditLogPath(g *globals, logPath string) string {
	if logPath != "" {
		return logPath
	}
	return system.AuditDir(g.dataDir)
}

// A report is one sandbox's records summarised: what audit report prints,
// as text for a person or as JSON.
type report struct {
	Sandbox  string    `json:"sandbox_id"`
	Tenant   string    `json:"tenant,omitempty"`
	Created  time.Time `json:"created,omitzero"`
	Image    string    `json:"image,omitempty"`
	Trigger  any       `json:"trigger,omitempty"`
	Controls any       `json:"controls,omitempty"`
	// Calls are the commands' starts and ends and the file calls, in
	// the log's order.
	Calls       []reportCall   `json:"calls"`
	Ended       time.Time      `json:"ended,omitzero"`
	EndReason   string         `json:"end_reason,omitempty"`
	Limits      []string       `json:"limits"`
	PidsLimited int64          `json:"forks_refused,omitempty"`
	Allowed     map[string]int `json:"hosts_allowed"` // host: requests
	Denied      map[string]int `json:"hosts_denied"`
	Findings    []reportFind   `json:"credentials_found"`
	// FilesChanged is the destroy record's count (-1: no destroy record
	// with a workspace); Files lists at most the first 1,000.
	FilesChanged int          `json:"files_changed"`
	Files        []reportFile `json:"files"`
	// Unreadable counts records of an unknown kind or shape.
	Unreadable int `json:"unreadable_records"`
}

type reportCall struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // exec.start, exec.end, or the file call's kind
	ExecID   string    `json:"exec_id,omitempty"`
	Argv     []string  `json:"argv,omitempty"`
	PID      int       `json:"pid,omitempty"`
	ExitCode *int      `json:"exit_code,omitempty"`
	Status   string    `json:"status,omitempty"`
	Path     string    `json:"path,omitempty"`
}

type reportFind struct {
	Rule   string `json:"rule"`
	Where  string `json:"where"`
	Call   string `json:"call"`
	Action string `json:"action"`
}

type reportFile struct {
	Kind string `json:"kind"`
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// summarize reads one sandbox's records, each through its kind's type
// (internal/audit/record).
func summarize(recs []*audit.Record) *report {
	rp := &report{Sandbox: recs[0].Sandbox, Tenant: recs[0].Tenant, Calls: []reportCall{}, Limits: []string{},
		Allowed: map[string]int{}, Denied: map[string]int{}, Findings: []reportFind{}, FilesChanged: -1, Files: []reportFile{}}
	for _, r := range recs {
		d, err := record.Decode(r)
		if err != nil {
			rp.Unreadable++
			continue
		}
		switch d := d.(type) {
		case *record.SandboxCreated:
			rp.Created, rp.Image, rp.Trigger, rp.Controls = r.Time, d.Image, d.Trigger, d.Controls
		case *record.ExecStart:
			rp.Calls = append(rp.Calls, reportCall{Time: r.Time, Kind: r.Kind, ExecID: d.ExecID, Argv: d.Argv})
		case *record.ExecEnd:
			code := d.ExitCode
			rp.Calls = append(rp.Calls, reportCall{Time: r.Time, Kind: r.Kind, ExecID: d.ExecID, PID: d.PID, ExitCode: &code, Status: d.Status})
		case *record.Egress:
			if d.Decision == "allowed" {
				rp.Allowed[d.Host]++
			} else {
				rp.Denied[d.Host]++
			}
		case *record.SecretFinding:
			rp.Findings = append(rp.Findings, reportFind{Rule: d.Rule, Where: d.Where, Call: d.Call, Action: d.Action})
		case *record.SandboxDestroyed:
			rp.Ended, rp.EndReason = r.Time, d.Reason
			if ws := d.Workspace; ws != nil {
				rp.FilesChanged = ws.Changed
				for _, p := range ws.Paths {
					rp.Files = append(rp.Files, reportFile{Kind: p.Kind, Path: p.Path, Size: p.Size})
				}
			}
			rp.PidsLimited = d.PidsLimited
			if d.PidsLimited > 0 {
				rp.Limits = append(rp.Limits, "pids")
			}
			if d.OOMKills > 0 {
				rp.Limits = append(rp.Limits, "memory")
			}
			for _, l := range d.Limits {
				if l != "pids" && l != "memory" {
					rp.Limits = append(rp.Limits, l)
				}
			}
		case interface{ Call() record.FileCall }:
			rp.Calls = append(rp.Calls, reportCall{Time: r.Time, Kind: r.Kind, Path: d.Call().Path})
		}
	}
	return rp
}

// writeReport summarises one sandbox's records for a person. Paths,
// hosts, argv and what the sandbox reported are chosen by the sandbox or
// its caller: they are shown quoted (untrusted.Quote).
func writeReport(w io.Writer, recs []*audit.Record) error {
	rp := summarize(recs)
	q := func(v any) string { return untrusted.Quote(fmt.Sprint(v)) }
	argv := func(l []string) string {
		out := make([]string, len(l))
		for i, a := range l {
			out[i] = q(a)
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	if rp.Tenant != "" {
		fmt.Fprintf(w, "sandbox %s (tenant %s)\n", rp.Sandbox, rp.Tenant)
	} else {
		fmt.Fprintf(w, "sandbox %s\n", rp.Sandbox)
	}
	if !rp.Created.IsZero() {
		fmt.Fprintf(w, "created %s; image %s", rp.Created.Format(time.RFC3339), q(rp.Image))
		if rp.Trigger != nil {
			fmt.Fprintf(w, "; trigger %s", q(jsonText(rp.Trigger)))
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "controls %s\n", jsonText(rp.Controls))
	}
	if !rp.Ended.IsZero() {
		fmt.Fprintf(w, "ended %s: %s\n", rp.Ended.Format(time.RFC3339), q(rp.EndReason))
	}
	for _, l := range rp.Limits {
		switch l {
		case "pids":
			fmt.Fprintf(w, "limit: pids (%d forks refused)\n", rp.PidsLimited)
		case "memory":
			fmt.Fprintln(w, "limit: memory (OOM)")
		default:
			fmt.Fprintf(w, "limit: %s\n", l)
		}
	}
	fmt.Fprintln(w, "commands and file calls:")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, c := range rp.Calls {
		at := c.Time.Format("15:04:05.000")
		switch c.Kind {
		case "exec.start":
			fmt.Fprintf(tw, "  %s\tstart\texec %s\t%s\n", at, q(c.ExecID), argv(c.Argv))
		case "exec.end":
			pid := ""
			if c.PID > 0 {
				pid = fmt.Sprintf("pid %d, ", c.PID)
			}
			fmt.Fprintf(tw, "  %s\tend\texec %s\t%sexit %d, %s (reported by the sandbox)\n", at, q(c.ExecID), pid, *c.ExitCode, q(c.Status))
		default:
			fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", at, c.Kind, q(c.Path))
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "network: %d hosts allowed, %d denied\n", len(rp.Allowed), len(rp.Denied))
	for _, h := range slices.Sorted(maps.Keys(rp.Denied)) {
		fmt.Fprintf(w, "  denied %s (x%d)\n", q(h), rp.Denied[h])
	}
	if len(rp.Findings) > 0 {
		fmt.Fprintf(w, "credentials found: %d\n", len(rp.Findings))
		for _, f := range rp.Findings {
			fmt.Fprintf(w, "  %s in %s (%s): %s\n", q(f.Rule), q(f.Where), f.Call, f.Action)
		}
	}
	if rp.FilesChanged > len(rp.Files) {
		fmt.Fprintf(w, "files changed in /workspace: %d (%d listed)\n", rp.FilesChanged, len(rp.Files))
	} else {
		fmt.Fprintf(w, "files changed in /workspace: %d\n", len(rp.Files))
	}
	for _, f := range rp.Files {
		fmt.Fprintf(w, "  %s %s (%d bytes)\n", f.Kind, q(f.Path), f.Size)
	}
	if rp.Unreadable > 0 {
		fmt.Fprintf(w, "records of an unknown kind or shape (an older airlock's?): %d (airlock audit query shows them)\n", rp.Unreadable)
	}
	return nil
}

// jsonText is v as compact JSON, for a line of the report.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// flockHeld reports whether another process holds f's lock.
func flockHeld(f *os.File) bool {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}
