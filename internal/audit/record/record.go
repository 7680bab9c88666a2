// Package record is what the audit log says: one Go type per kind of
// record, written only through a Recorder and read back by Decode. The
// daemon, `airlock mcp` and `airlock run` make their records with these
// types, so the same action has the same record whichever door it came
// through; `airlock audit report` reads them through the same types. It
// imports internal/audit (the log), internal/spec (a sandbox's spec),
// internal/egress/eventlog (the egress record is the proxy's Event),
// internal/workspace (a change's type), internal/scan (the rule set's
// name) and internal/errdefs.
package record

import (
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/scan"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/workspace"
)

// Data is one record's data: its type names its kind.
type Data interface{ Kind() string }

// Who is whom a record is about: the tenant (by id), the sandbox and the
// trigger's task id; and who made the call when it was not the tenant's
// own key (Actor "admin").
type Who struct{ Tenant, Sandbox, Trigger, Actor string }

// Digest is a stream's size and SHA-256 (hex), never its contents.
type Digest struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Controls are the controls a sandbox has, and any explicit opt-out.
// Wall names the wall ("container" or "gvisor"); Runsc is runsc's version
// on the gvisor wall.
type Controls struct {
	Wall         string   `json:"wall"`
	Runsc        string   `json:"runsc,omitempty"`
	Namespaces   bool     `json:"namespaces"`
	Cgroups      bool     `json:"cgroups"`
	Seccomp      bool     `json:"seccomp"`
	Capabilities string   `json:"capabilities"`
	NoNewPrivs   bool     `json:"no_new_privs"`
	Landlock     bool     `json:"landlock"`
	OptOut       []string `json:"opt_out,omitempty"`
}

// SandboxCreated is a sandbox made: its validated spec (environment by
// name only, grants without tokens), what it runs on and why it exists.
// Expires is nil for a run (its deadline is in the spec's timeout);
// Metadata and Trigger are the creator's (null for a run). InitPID is 0
// in a run's record, which is made before init exists. Pool names the
// pool the sandbox was taken from (made ahead: its sandbox.pooled record
// came first); PoolMiss says why a create that named or matched a pool
// was made afresh. ExternalID is the create's external id, if it named
// one.
type SandboxCreated struct {
	Spec         spec.Spec  `json:"spec"`
	Image        string     `json:"image"`
	ImageDigest  string     `json:"image_digest"`
	PolicySHA256 string     `json:"policy_sha256"`
	Metadata     any        `json:"metadata"`
	Trigger      any        `json:"trigger"`
	Expires      *time.Time `json:"expires"`
	IdleTimeout  string     `json:"idle_timeout"`
	Controls     Controls   `json:"controls"`
	InitPID      int        `json:"init_pid"`
	Pool         string     `json:"pool,omitempty"`
	PoolMiss     string     `json:"pool_miss,omitempty"`
	ExternalID   string     `json:"external_id,omitempty"`
}

// SandboxPooled is a sandbox made ahead for a tenant's pool, frozen until
// a create takes it (its sandbox.created record) or it ends: its spec
// (without the environment, which a create gives it), what it runs on.
type SandboxPooled struct {
	Pool        string    `json:"pool"`
	Spec        spec.Spec `json:"spec"`
	ImageDigest string    `json:"image_digest"`
	Controls    Controls  `json:"controls"`
	InitPID     int       `json:"init_pid"`
}

// PoolSet and PoolRemoved: a tenant's warm pool set (what it makes ahead,
// and how many) or removed.
type (
	PoolSet struct {
		Name string    `json:"name"`
		Size int       `json:"size"`
		Spec spec.Spec `json:"spec"`
	}
	PoolRemoved struct {
		Name string `json:"name"`
	}
)

// SandboxDestroyed is a sandbox's end: why, what it used, and what it
// changed in /workspace (nil when the sandbox ended before it had one, or
// was found without a record). While is "create" for a create ended
// before it went live.
type SandboxDestroyed struct {
	Reason          string     `json:"reason"`
	While           string     `json:"while,omitempty"`
	Limits          []string   `json:"limits"`
	CPUSeconds      float64    `json:"cpu_seconds"`
	MemoryPeakBytes int64      `json:"memory_peak_bytes"`
	OOMKills        int64      `json:"oom_kills"`
	PidsLimited     int64      `json:"pids_limited"`
	Workspace       *Workspace `json:"workspace"`
}

// Workspace is what one record says of a workspace's changes (capped:
// WorkspaceOf).
type Workspace struct {
	// Changed counts every change the reading found; Paths lists at
	// most MaxChanges of them.
	Changed      int                  `json:"changed"`
	Truncated    bool                 `json:"truncated"`
	TruncatedWhy string               `json:"truncated_why,omitempty"`
	Paths        []workspace.Reported `json:"paths"`
	// Unread names the subtrees the reading could not read, and why.
	Unread []string `json:"unread,omitempty"`
	// Patch is the diff kept beside the log (nil: none kept).
	Patch *Patch `json:"patch"`
	// Error says why the changes could not be read at all.
	Error string `json:"error,omitempty"`
}

// Patch is a workspace's diff, stored beside the log.
type Patch struct {
	File      string `json:"file"`
	SHA256    string `json:"sha256"`
	Bytes     int    `json:"bytes"`
	Truncated bool   `json:"truncated"`
}

// SandboxPaused, SandboxResumed: a sandbox frozen and thawed; AtTTL, it
// was paused by its TTL (on_ttl "pause"), and ends at Expires.
type (
	SandboxPaused struct {
		AtTTL   bool       `json:"at_ttl,omitempty"`
		Expires *time.Time `json:"expires,omitempty"`
	}
	SandboxResumed struct{}
)

// SandboxExtended is a sandbox's new expiry.
type SandboxExtended struct {
	Expires time.Time `json:"expires"`
}

// SandboxAdopted is a sandbox a restarted daemon took over.
type SandboxAdopted struct {
	InitPID int `json:"init_pid"`
}

// SandboxSnapshot is a snapshot saved of a sandbox.
type SandboxSnapshot struct {
	Snapshot string `json:"snapshot"`
	Content  string `json:"content"`
	Name     string `json:"name"`
	Base     string `json:"base"`
	Root     bool   `json:"root"`
	Bytes    int64  `json:"bytes"`
	// Memory is the size of the sandbox's memory checkpoint the snapshot
	// holds (0: files only).
	Memory    int64      `json:"memory_bytes,omitempty"`
	Skipped   []string   `json:"skipped"`
	Workspace *Workspace `json:"workspace"`
}

// ExecStart is a command about to run: committed before it runs.
// Environment by name only.
type ExecStart struct {
	ExecID     string   `json:"exec_id"`
	Argv       []string `json:"argv"`
	Cwd        string   `json:"cwd"`
	User       string   `json:"user"`
	Env        []string `json:"env"`
	Background bool     `json:"background"`
	Tag        string   `json:"tag"`
	TTY        bool     `json:"tty"`
	Timeout    string   `json:"timeout"`
	StdinBytes int      `json:"stdin_bytes"`
}

// ExecEnd is how a command ended, as its sandbox reported it. Stdout,
// Stderr and PTY are nil when the host did not see that stream (`airlock
// run` hands the command the caller's own) or nothing passed.
type ExecEnd struct {
	ExecID     string  `json:"exec_id"`
	PID        int     `json:"pid"`
	DurationMS float64 `json:"duration_ms"`
	ExitCode   int     `json:"exit_code"`
	Status     string  `json:"status"`
	Error      string  `json:"error"`
	TimedOut   bool    `json:"timed_out"`
	// SandboxEnded is why the sandbox ended under the command ("": it
	// did not).
	SandboxEnded string  `json:"sandbox_ended,omitempty"`
	Stdout       *Digest `json:"stdout"`
	Stderr       *Digest `json:"stderr"`
	PTY          *Digest `json:"pty"`
}

// SecretFinding is a credential found in a call, or a grant's placeholder
// where it does not belong: named by rule and a keyed fingerprint, never
// by its value. Host, Method and Path are an egress request's.
type SecretFinding struct {
	Call          string `json:"call"`
	Where         string `json:"where"`
	Rule          string `json:"rule"`
	Rules         string `json:"rules"`
	Fingerprint   string `json:"fingerprint"`
	Action        string `json:"action"`
	Reason        string `json:"reason,omitempty"`
	PartlyScanned bool   `json:"partly_scanned,omitempty"`
	Host          string `json:"host,omitempty"`
	Method        string `json:"method,omitempty"`
	Path          string `json:"path,omitempty"`
}

// ScanSummary is what one call's scan left out.
type ScanSummary struct {
	Call              string   `json:"call"`
	Findings          int      `json:"findings"`
	FindingsRecorded  int      `json:"findings_recorded"`
	FindingsDropped   int      `json:"findings_dropped"`
	ScannedBytes      int      `json:"scanned_bytes"`
	Bytes             int      `json:"bytes"`
	MaxScanBytes      int      `json:"max_scan_bytes"`
	MaxFindingRecords int      `json:"max_finding_records"`
	PartlyScanned     []string `json:"partly_scanned,omitempty"`
	PartlyScannedMore int      `json:"partly_scanned_more,omitempty"`
}

// Egress is one decision of a sandbox's egress proxy or DNS forwarder.
type Egress struct{ eventlog.Event }

// FileCall is what every file call's record says: the path and who the
// call acted as.
type FileCall struct {
	Path string `json:"path"`
	User string `json:"user"`
}

// Call is the file call's path and user: every file call's record has it
// (their types embed FileCall).
func (c FileCall) Call() FileCall { return c }

// The file calls, one kind each.
type (
	FileRead struct {
		FileCall
		Content Digest `json:"content"`
	}
	FileStat   struct{ FileCall }
	FileMkdir  struct{ FileCall }
	FileRemove struct{ FileCall }
	FileDiff   struct{ FileCall }
	FileWrite  struct {
		FileCall
		Mode    string `json:"mode"`
		Content Digest `json:"content"`
	}
	FileEdit struct {
		FileCall
		Old          Digest `json:"old"`
		New          Digest `json:"new"`
		SizeReported int64  `json:"size_reported"`
	}
	FileList struct {
		FileCall
		Depth   int `json:"depth"`
		Entries int `json:"entries"`
	}
	FileMove struct {
		FileCall
		To string `json:"to"`
	}
	FileWatch struct {
		FileCall
		Recursive bool `json:"recursive"`
	}
	FileUpload struct {
		FileCall
		Entries int   `json:"entries"`
		Bytes   int64 `json:"bytes"`
		Skipped int   `json:"skipped"`
	}
	FileDownload struct {
		FileCall
		Skipped []string `json:"skipped"`
	}
)

// FileSent is a streamed download or diff once its last byte went: Tar
// for a download, Patch for a diff.
type FileSent struct {
	Op       string  `json:"op"`
	Path     string  `json:"path"`
	Tar      *Digest `json:"tar,omitempty"`
	Patch    *Digest `json:"patch,omitempty"`
	Complete bool    `json:"complete"`
}

// AuditDropped counts records a cap dropped: a sandbox's egress records
// (Kind "egress"), or failed authentications (Kind "auth.failed", with
// the remote addresses they came from).
type AuditDropped struct {
	Of                    string           `json:"kind"`
	Records               int64            `json:"records"`
	CapPerSecond          int              `json:"cap_per_second"`
	CapPerSourcePerSecond int              `json:"cap_per_source_per_second,omitempty"`
	Sources               map[string]int64 `json:"sources,omitempty"`
	OtherSources          int64            `json:"other_sources,omitempty"`
}

// KillSwitch is the kill switch pulled: by the admin or a tenant, and the
// sandboxes it destroyed.
type KillSwitch struct {
	Admin     bool     `json:"admin"`
	Destroyed []string `json:"destroyed"`
}

// AuthFailed is a request with no key or an unknown one: a prefix of the
// key's SHA-256, never the key.
type AuthFailed struct {
	Reason          string `json:"reason,omitempty"`
	KeySHA256Prefix string `json:"key_sha256_prefix,omitempty"`
	Remote          string `json:"remote"`
}

// PortConnect is an inbound connection to a TCP port inside a sandbox,
// recorded before it is made: the port, the door it came through
// ("api", "forward", "e2b") and how the caller proved itself ("key", or
// "token": a port token the tenant minted), and the caller's address.
type PortConnect struct {
	Port   int    `json:"port"`
	Door   string `json:"door"`
	Auth   string `json:"auth"`
	Remote string `json:"remote,omitempty"`
}

// TenantCreated, TenantUpdated, TenantDeleted: a tenant's life.
// CallerKey: the tenant's key is one its creator holds (given by its
// SHA-256), not one the daemon made; KeyReplaced: the update replaced
// the tenant's key (the old one stopped working). Never the key or its
// digest.
type (
	TenantCreated struct {
		Name       string   `json:"name"`
		Quotas     any      `json:"quotas"`
		ScanPolicy string   `json:"scan_policy"`
		Roots      []string `json:"roots"`
		Isolation  string   `json:"isolation"`
		CallerKey  bool     `json:"caller_key,omitempty"`
	}
	TenantUpdated struct {
		Quotas      any      `json:"quotas"`
		ScanPolicy  string   `json:"scan_policy"`
		Roots       []string `json:"roots"`
		Isolation   string   `json:"isolation"`
		KeyReplaced bool     `json:"key_replaced,omitempty"`
	}
	TenantDeleted struct {
		Name      string   `json:"name"`
		Destroyed []string `json:"destroyed"`
	}
	// TenantE2BKey: the tenant was given a new E2B-shaped key (never the
	// key); Replaced, it had one, which stopped working.
	TenantE2BKey struct {
		Name     string `json:"name"`
		Replaced bool   `json:"replaced"`
	}
)

// SandboxForked is a fork of the sandbox the record is about: the new
// sandboxes' ids (each has its own sandbox.created), whether they carry
// its memory (gVisor) or its files only (the container wall), the
// checkpoint's content digest and size. The checkpoint is the fork's
// own: no snapshot is listed or kept for it.
type SandboxForked struct {
	Sandboxes   []string `json:"sandboxes"`
	Memory      bool     `json:"memory"`
	Content     string   `json:"content"`
	Bytes       int64    `json:"bytes"`
	MemoryBytes int64    `json:"memory_bytes"`
}

// SandboxRefused is a create refused by the tenant's policy: it asked for
// wall Isolation, and the tenant is held to Required.
type SandboxRefused struct {
	Isolation string `json:"isolation"`
	Required  string `json:"required"`
	Reason    string `json:"reason"`
}

// SecretAdded, SecretRotated, SecretRemoved: a secret's life, by name and
// version (never its value).
type (
	SecretAdded struct {
		Name    string `json:"name"`
		Version int    `json:"version"`
	}
	SecretRotated struct {
		Name    string `json:"name"`
		Version int    `json:"version"`
	}
	SecretRemoved struct {
		Name string `json:"name"`
	}
)

// MCPSpec is a tenant's default MCP sandbox spec saved (environment by
// name only).
type MCPSpec struct {
	Spec any      `json:"spec"`
	Env  []string `json:"env"`
}

func (SandboxCreated) Kind() string   { return "sandbox.created" }
func (SandboxDestroyed) Kind() string { return "sandbox.destroyed" }
func (SandboxPaused) Kind() string    { return "sandbox.paused" }
func (SandboxResumed) Kind() string   { return "sandbox.resumed" }
func (SandboxExtended) Kind() string  { return "sandbox.extended" }
func (SandboxAdopted) Kind() string   { return "sandbox.adopted" }
func (SandboxRefused) Kind() string   { return "sandbox.refused" }
func (SandboxSnapshot) Kind() string  { return "sandbox.snapshot" }
func (SandboxForked) Kind() string    { return "sandbox.forked" }
func (ExecStart) Kind() string        { return "exec.start" }
func (ExecEnd) Kind() string          { return "exec.end" }
func (SecretFinding) Kind() string    { return "secret.finding" }
func (ScanSummary) Kind() string      { return "secret.scan_summary" }
func (Egress) Kind() string           { return "egress" }
func (FileRead) Kind() string         { return "file.read" }
func (FileStat) Kind() string         { return "file.stat" }
func (FileMkdir) Kind() string        { return "file.mkdir" }
func (FileRemove) Kind() string       { return "file.remove" }
func (FileDiff) Kind() string         { return "file.diff" }
func (FileWrite) Kind() string        { return "file.write" }
func (FileEdit) Kind() string         { return "file.edit" }
func (FileList) Kind() string         { return "file.list" }
func (FileMove) Kind() string         { return "file.move" }
func (FileWatch) Kind() string        { return "file.watch" }
func (FileUpload) Kind() string       { return "file.upload" }
func (FileDownload) Kind() string     { return "file.download" }
func (FileSent) Kind() string         { return "file.sent" }
func (AuditDropped) Kind() string     { return "audit.dropped" }
func (KillSwitch) Kind() string       { return "killswitch" }
func (AuthFailed) Kind() string       { return "auth.failed" }
func (TenantCreated) Kind() string    { return "tenant.created" }
func (TenantUpdated) Kind() string    { return "tenant.updated" }
func (TenantDeleted) Kind() string    { return "tenant.deleted" }
func (TenantE2BKey) Kind() string     { return "tenant.e2b_key" }
func (SecretAdded) Kind() string      { return "secret.added" }
func (SecretRotated) Kind() string    { return "secret.rotated" }
func (SecretRemoved) Kind() string    { return "secret.removed" }
func (MCPSpec) Kind() string          { return "mcp.spec" }
func (SandboxPooled) Kind() string    { return "sandbox.pooled" }
func (PoolSet) Kind() string          { return "pool.set" }
func (PoolRemoved) Kind() string      { return "pool.removed" }
func (PortConnect) Kind() string      { return "port.connect" }

// kinds makes an empty record of each kind, for Decode.
var kinds = map[string]func() Data{}

func init() {
	for _, f := range []func() Data{
		func() Data { return &SandboxCreated{} }, func() Data { return &SandboxDestroyed{} },
		func() Data { return &SandboxPaused{} }, func() Data { return &SandboxResumed{} },
		func() Data { return &SandboxExtended{} }, func() Data { return &SandboxAdopted{} },
		func() Data { return &SandboxSnapshot{} }, func() Data { return &ExecStart{} }, func() Data { return &ExecEnd{} },
		func() Data { return &SecretFinding{} }, func() Data { return &ScanSummary{} }, func() Data { return &Egress{} },
		func() Data { return &FileRead{} }, func() Data { return &FileStat{} }, func() Data { return &FileMkdir{} },
		func() Data { return &FileRemove{} }, func() Data { return &FileDiff{} }, func() Data { return &FileWrite{} },
		func() Data { return &FileEdit{} }, func() Data { return &FileList{} }, func() Data { return &FileMove{} },
		func() Data { return &FileWatch{} }, func() Data { return &FileUpload{} }, func() Data { return &FileDownload{} },
		func() Data { return &FileSent{} }, func() Data { return &AuditDropped{} }, func() Data { return &KillSwitch{} },
		func() Data { return &AuthFailed{} }, func() Data { return &TenantCreated{} }, func() Data { return &TenantUpdated{} },
		func() Data { return &TenantDeleted{} }, func() Data { return &SecretAdded{} }, func() Data { return &SecretRotated{} },
		func() Data { return &SecretRemoved{} }, func() Data { return &MCPSpec{} }, func() Data { return &SandboxRefused{} },
		func() Data { return &SandboxForked{} }, func() Data { return &SandboxPooled{} },
		func() Data { return &PoolSet{} }, func() Data { return &PoolRemoved{} }, func() Data { return &TenantE2BKey{} },
		func() Data { return &PortConnect{} },
	} {
		kinds[f().Kind()] = f
	}
}

// Kinds lists every kind of record this package knows.
func Kinds() []string {
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	return out
}

// EgressFindings are the secret.finding records of what an egress
// decision found.
func EgressFindings(ev eventlog.Event) []SecretFinding {
	out := make([]SecretFinding, 0, len(ev.Findings))
	for _, f := range ev.Findings {
		out = append(out, SecretFinding{Call: "egress", Where: f.Where, Rule: f.Rule, Rules: scan.RuleSet, Fingerprint: f.Fingerprint,
			Action: f.Action, Reason: f.Reason, Host: ev.Host, Method: ev.Method, Path: ev.Path})
	}
	return out
}
