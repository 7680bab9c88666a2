package cli

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/audit"
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
  sudo airlock audit report ID`,
	}
	c.AddCommand(auditVerifyCmd(g), auditPubkeyCmd(g), auditQueryCmd(g), auditReportCmd(g))
	return c
}

func auditVerifyCmd(g *globals) *cobra.Command {
	var pubFile string
	var asJSON bool
	c := &cobra.Command{
		Use:   "verify [DIR | RUN-LOG-FILE]",
		Short: "Check the log's chain, order, signatures and completeness; name the first bad record",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
			s, err := audit.Verify(dir, pub, head, live || head != nil)
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
				return printJSON(g.stdout, map[string]any{"ok": true, "segments": s.Segments, "records": s.Records, "checkpoints": s.Checkpoints, "head": s.Head, "head_checked": head != nil})
			}
			fmt.Fprintf(g.stdout, "ok: %d records in %d segments, %d signed checkpoints, head seq %d", s.Records, s.Segments, s.Checkpoints, s.Head.Seq)
			if head == nil {
				fmt.Fprint(g.stdout, " (no head kept apart to check the end against)")
			}
			fmt.Fprintln(g.stdout)
			return nil
		},
	}
	c.Flags().StringVar(&pubFile, "pubkey", "", "the audit public key (PEM; default: derived from DATA_DIR/audit.key)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
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
	keyFile := system.AuditKeyFile(g.dataDir)
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

// auditHead reads the head kept apart in the daemon's database, and
// whether a daemon is writing the log now (its newest segment is open).
func auditHead(g *globals, dir string) (*audit.Head, bool) {
	live := false
	if f, err := os.Open(filepath.Join(g.stateDir, "daemon.lock")); err == nil {
		live = flockHeld(f)
		f.Close()
	}
	if filepath.Clean(dir) != filepath.Clean(system.AuditDir(g.dataDir)) {
		return nil, live
	}
	db, err := store.Open(filepath.Join(g.dataDir, "airlock.db"))
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

func auditQueryCmd(g *globals) *cobra.Command {
	var f auditFilter
	var since, until string
	var follow bool
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
			enc := json.NewEncoder(g.stdout)
			return audit.Read(cmd.Context(), system.AuditDir(g.dataDir), follow, func(r *audit.Record) error {
				if f.match(r) {
					return enc.Encode(r)
				}
				return nil
			})
		},
	}
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

func auditReportCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "report SANDBOX",
		Short: "Summarize one sandbox's run: trigger, commands, network, files changed, limits",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var recs []*audit.Record
			err := audit.Read(cmd.Context(), system.AuditDir(g.dataDir), false, func(r *audit.Record) error {
				if r.Sandbox == args[0] {
					recs = append(recs, r)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if len(recs) == 0 {
				return errdefs.New(errdefs.ErrNotFound, "no audit records of sandbox "+args[0])
			}
			return writeReport(g.stdout, recs)
		},
	}
}

// writeReport summarises one sandbox's records for a person. Paths, hosts,
// argv and what the sandbox reported are chosen by the sandbox or its
// caller: they are shown quoted (untrusted.Quote).
func writeReport(w io.Writer, recs []*audit.Record) error {
	q := func(v any) string { return untrusted.Quote(fmt.Sprint(v)) }
	argv := func(v any) string {
		l, _ := v.([]any)
		out := make([]string, len(l))
		for i, a := range l {
			out[i] = q(a)
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	var data map[string]any
	get := func(r *audit.Record) map[string]any {
		data = map[string]any{}
		_ = json.Unmarshal(r.Data, &data)
		return data
	}
	first := recs[0]
	fmt.Fprintf(w, "sandbox %s (tenant %s)\n", first.Sandbox, first.Tenant)
	allowed, denied := map[string]int{}, map[string]int{}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	var files []string
	changed := -1 // as the destroy record counts them (it lists at most 1000)
	for _, r := range recs {
		d := get(r)
		switch r.Kind {
		case "sandbox.created":
			fmt.Fprintf(w, "created %s; trigger %s\n", r.Time.Format(time.RFC3339), q(d["trigger"]))
			fmt.Fprintf(w, "controls %v\n", d["controls"])
		case "exec.start":
			fmt.Fprintf(tw, "  %s\tstart\texec %s\t%s\n", r.Time.Format("15:04:05.000"), q(d["exec_id"]), argv(d["argv"]))
		case "exec.end":
			fmt.Fprintf(tw, "  %s\tend\texec %s\tpid %v, exit %v, %s (reported by the sandbox)\n", r.Time.Format("15:04:05.000"), q(d["exec_id"]), d["pid"], d["exit_code"], q(d["status"]))
		case "egress":
			host := q(d["host"])
			if d["decision"] == "allowed" {
				allowed[host]++
			} else {
				denied[host]++
			}
		case "sandbox.destroyed":
			fmt.Fprintf(w, "ended %s: %s\n", r.Time.Format(time.RFC3339), q(d["reason"]))
			if ws, ok := d["workspace"].(map[string]any); ok {
				if n, ok := ws["changed"].(float64); ok {
					changed = int(n)
				}
				if paths, ok := ws["paths"].([]any); ok {
					for _, p := range paths {
						if m, ok := p.(map[string]any); ok {
							files = append(files, fmt.Sprintf("%v %s (%v bytes)", m["kind"], q(m["path"]), m["size"]))
						}
					}
				}
			}
			if n := d["pids_limited"]; n != nil && n != float64(0) {
				fmt.Fprintf(w, "limit: pids (%v forks refused)\n", n)
			}
			if n := d["oom_kills"]; n != nil && n != float64(0) {
				fmt.Fprintln(w, "limit: memory (OOM)")
			}
		default:
			if strings.HasPrefix(r.Kind, "file.") {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", r.Time.Format("15:04:05.000"), r.Kind, q(d["path"]))
			}
		}
	}
	fmt.Fprintln(w, "commands and file calls:")
	tw.Flush()
	fmt.Fprintf(w, "network: %d hosts allowed, %d denied\n", len(allowed), len(denied))
	for h, n := range denied {
		fmt.Fprintf(w, "  denied %s (x%d)\n", h, n)
	}
	if changed > len(files) {
		fmt.Fprintf(w, "files changed in /workspace: %d (%d listed)\n", changed, len(files))
	} else {
		fmt.Fprintf(w, "files changed in /workspace: %d\n", len(files))
	}
	for _, f := range files {
		fmt.Fprintln(w, "  "+f)
	}
	return nil
}

// flockHeld reports whether another process holds f's lock.
func flockHeld(f *os.File) bool {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}
