// Package api is airlock's wire contract: the JSON types of the daemon's
// HTTP API (docs/api.md), its error codes, and the generated code of the
// in-sandbox agent's Connect services (process, filesystem, agentpb). It
// imports only the standard library, protobuf and connect.
package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Version is the HTTP API's path prefix.
const Version = "v1"

// DefaultSocket is where `airlock serve` listens by default.
const DefaultSocket = "/run/airlock/airlock.sock"

// Code is a stable, machine-readable error code.
type Code string

// Error codes. Each has one HTTP status (Status).
const (
	CodeInvalidArgument    Code = "invalid_argument"    // 400: the request is malformed or fails validation
	CodeUnauthenticated    Code = "unauthenticated"     // 401: no key, or an unknown one
	CodePermissionDenied   Code = "permission_denied"   // 403: the key may not do this (a tenant key on an admin call)
	CodeNotFound           Code = "not_found"           // 404: no such object, or not this tenant's
	CodeAlreadyExists      Code = "already_exists"      // 409
	CodeFailedPrecondition Code = "failed_precondition" // 409: the object is not in a state that allows this
	CodeTooLarge           Code = "too_large"           // 413: a body or file over its cap
	CodeQuotaExceeded      Code = "quota_exceeded"      // 429: a tenant quota or a host limit
	CodeInternal           Code = "internal"            // 500
	CodeUnavailable        Code = "unavailable"         // 503: the host lacks a control airlock requires
	CodeTimeout            Code = "timeout"             // 504
	CodeSecretDetected     Code = "secret_detected"     // 422: a credential in the call, and the tenant's scan policy blocks it
)

var statuses = map[Code]int{
	CodeInvalidArgument:    http.StatusBadRequest,
	CodeUnauthenticated:    http.StatusUnauthorized,
	CodePermissionDenied:   http.StatusForbidden,
	CodeNotFound:           http.StatusNotFound,
	CodeAlreadyExists:      http.StatusConflict,
	CodeFailedPrecondition: http.StatusConflict,
	CodeTooLarge:           http.StatusRequestEntityTooLarge,
	CodeQuotaExceeded:      http.StatusTooManyRequests,
	CodeInternal:           http.StatusInternalServerError,
	CodeUnavailable:        http.StatusServiceUnavailable,
	CodeTimeout:            http.StatusGatewayTimeout,
	CodeSecretDetected:     http.StatusUnprocessableEntity,
}

// Status is the HTTP status of code.
func (c Code) Status() int {
	if s, ok := statuses[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Codes lists every error code (for documentation tests).
func Codes() []Code {
	out := make([]Code, 0, len(statuses))
	for c := range statuses {
		out = append(out, c)
	}
	return out
}

// Error is every API error's body.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Limits are a sandbox's resource caps; zero means the default.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
}

// Network is a sandbox's network: "none" (default) or "proxy" with an
// allow-list.
type Network struct {
	Mode        string   `json:"mode,omitempty"`
	Allow       []string `json:"allow,omitempty"`
	Deny        []string `json:"deny,omitempty"`
	EgressBytes int64    `json:"egress_bytes,omitempty"`
	MaxConns    int      `json:"max_conns,omitempty"`
}

// Trigger records why a sandbox exists; every audit record of the sandbox
// links to it.
type Trigger struct {
	TaskID       string            `json:"task_id,omitempty"`
	PromptDigest string            `json:"prompt_digest,omitempty"`
	Inputs       map[string]string `json:"inputs,omitempty"`
}

// CreateSandbox asks for a new long-lived sandbox.
type CreateSandbox struct {
	// Isolation is the wall: "container" (default) or "gvisor" (runsc:
	// the sandbox's system calls are answered by gVisor's own kernel).
	Isolation      string            `json:"isolation,omitempty"`
	Image          string            `json:"image,omitempty"` // "host" (default), a rootfs directory, oci: or docker-archive: under the tenant's roots, a reference to a registry the operator lists, or snapshot:<id>
	WritableRootfs bool              `json:"writable_rootfs,omitempty"`
	Workspace      string            `json:"workspace,omitempty"` // host directory under one of the tenant's roots, shown copy-on-write at /workspace
	Repo           string            `json:"repo,omitempty"`      // host git repository under one of the tenant's roots, checked out at Commit
	Commit         string            `json:"commit,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Hostname       string            `json:"hostname,omitempty"`
	Limits         Limits            `json:"limits,omitzero"`
	Network        Network           `json:"network,omitzero"`
	AllowDegraded  []string          `json:"allow_degraded,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Trigger        Trigger           `json:"trigger,omitzero"`
	// TTL ends the sandbox this long after creation (Go duration, "30m");
	// default 1h, at most 7 days. IdleTimeout ends it after this long
	// without an API call on it; "" or "0": never.
	TTL         string `json:"ttl,omitempty"`
	IdleTimeout string `json:"idle_timeout,omitempty"`
	// OnTTL is what its TTL does: "end" (default), or "pause": the
	// sandbox is paused then and ends PausedTTL later unless resumed
	// (resuming keeps the expiry: extend it).
	OnTTL string `json:"on_ttl,omitempty"`
	// Grants let the sandbox use the tenant's secrets without holding
	// them (docs/credentials.md). They imply network mode "proxy".
	Grants []Grant `json:"grants,omitempty"`
	// Pool takes a sandbox of the caller's pool of that name, made ahead
	// (docs/api.md, Pools); without it a create whose image, limits,
	// isolation and network equal a pool's takes one of that pool's.
	// What a made sandbox cannot be given (a workspace or repo, grants,
	// another egress policy) makes the create an ordinary one.
	Pool string `json:"pool,omitempty"`
	// PoolOnly (with Pool) takes a sandbox of the pool or fails
	// (failed_precondition) when it has none ready: nothing is made.
	PoolOnly bool `json:"pool_only,omitempty"`
	// ExternalID is the caller's own name for the sandbox (at most 128 of
	// A-Za-z0-9 . _ : / -), unique among the tenant's listed sandboxes: a
	// create naming one the tenant has (live, or ended and still on
	// record) makes nothing and answers that sandbox (200, not 201).
	ExternalID string `json:"external_id,omitempty"`
}

// MaxExternalID bounds CreateSandbox.ExternalID's length.
const MaxExternalID = 128

// ListSandboxes filters GET /v1/sandboxes: ExternalID, the sandboxes of
// that external id (an ended one still on record too); All (the admin
// key only), every tenant's.
type ListSandboxes struct {
	ExternalID string
	All        bool
}

// SetPool defines (or redefines) one of the caller's pools: Size
// sandboxes like a create with these fields, made ahead and kept frozen.
type SetPool struct {
	Size      int     `json:"size"`
	Isolation string  `json:"isolation,omitempty"`
	Image     string  `json:"image,omitempty"`
	Limits    Limits  `json:"limits,omitzero"`
	Network   Network `json:"network,omitzero"`
}

// Pool is one of a tenant's pools: its definition, how many of its
// sandboxes are ready (made, frozen) and being made, and its hits and
// misses since it was set. Error is the last refill's failure, if the
// last one failed.
type Pool struct {
	Name      string  `json:"name"`
	Size      int     `json:"size"`
	Isolation string  `json:"isolation"`
	Image     string  `json:"image"`
	Limits    Limits  `json:"limits"`
	Network   Network `json:"network"`
	Ready     int     `json:"ready"`
	Filling   int     `json:"filling"`
	Hits      int64   `json:"hits"`
	Misses    int64   `json:"misses"`
	Error     string  `json:"error,omitempty"`
}

// Grant lets a sandbox use one of its tenant's secrets on matching
// requests to one host. The sandbox sees only a placeholder, in the
// variable Env; the egress proxy terminates TLS for Host alone and puts the
// real value in Header only on requests matching Allow.
type Grant struct {
	Secret string `json:"secret"`         // a secret of the tenant's (airlock secret add)
	Env    string `json:"env,omitempty"`  // default AIRLOCK_GRANT_<SECRET>
	Host   string `json:"host"`           // an exact host name
	Port   int    `json:"port,omitempty"` // default 443
	Header string `json:"header,omitempty"`
	// Scheme is how the value is written in Header: "bearer" (default:
	// "Bearer VALUE"), "token" ("token VALUE"), "basic" (the placeholder
	// is the password; Username, or the client's user name, goes with
	// it), or "raw" (the value alone).
	Scheme   string `json:"scheme,omitempty"`
	Username string `json:"username,omitempty"`
	// Allow lists the requests covered: "METHOD[,METHOD] /path", where a
	// "*" segment is any one segment, a final "**" any rest, and
	// "?key=value" requires that query parameter.
	Allow []string `json:"allow"`
	// TTL ends the placeholder this long after creation (Go duration);
	// without it the placeholder lives as long as the sandbox.
	TTL string `json:"ttl,omitempty"`
}

// AddSecret stores a secret for the caller's tenant; RotateSecret
// replaces its value. The value is never returned.
type AddSecret struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// RotateSecret gives a secret a new value; sandboxes' grants use it from
// their next request.
type RotateSecret struct {
	Value string `json:"value"`
}

// Secret describes a stored secret (never its value).
type Secret struct {
	Name    string    `json:"name"`
	Version int       `json:"version"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
}

// Sandbox states.
const (
	StateRunning = "running"
	StatePaused  = "paused"
	StateEnded   = "ended"
)

// Usage is the kernel's accounting for a sandbox.
type Usage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes"`
	OOMKills        int64   `json:"oom_kills,omitempty"`
	PidsLimited     int64   `json:"pids_limited,omitempty"`
}

// Progress is one report of long work: a create's (its image's pull and
// unpack), on the stream of POST /v1/sandboxes?progress=true, or a
// snapshot's, on POST /v1/sandboxes/{id}/snapshot?progress=true. Op is
// "pull" (a registry's bytes of layer Layer of Layers, of Total: its
// declared size), "unpack" (bytes written) or "snapshot" (bytes of file
// content copied); Message, when set, is shown instead of the counts (for
// good when Stays); Done ends the work.
type Progress struct {
	Op      string `json:"op"`
	Subject string `json:"subject,omitempty"`
	Message string `json:"message,omitempty"`
	Stays   bool   `json:"stays,omitempty"`
	Layer   int    `json:"layer,omitempty"`
	Layers  int    `json:"layers,omitempty"`
	Bytes   int64  `json:"bytes,omitempty"`
	Total   int64  `json:"total,omitempty"`
	Done    bool   `json:"done,omitempty"`
}

// CreateEvent is one line of POST /v1/sandboxes?progress=true: progress
// as it comes, then the sandbox, or the error that ended the create.
type CreateEvent struct {
	Progress *Progress `json:"progress,omitempty"`
	Sandbox  *Sandbox  `json:"sandbox,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}

// SnapshotEvent is one line of POST /v1/sandboxes/{id}/snapshot?progress=true:
// progress as it comes, then the snapshot, or the error that ended it.
type SnapshotEvent struct {
	Progress *Progress `json:"progress,omitempty"`
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}

// Sandbox describes one sandbox.
type Sandbox struct {
	ID          string            `json:"id"`
	Tenant      string            `json:"tenant"`    // the tenant's name when the sandbox was made
	TenantID    string            `json:"tenant_id"` // the tenant's id (never reused)
	State       string            `json:"state"`
	Isolation   string            `json:"isolation"` // "container" or "gvisor"
	Image       string            `json:"image"`
	Created     time.Time         `json:"created"`
	Expires     time.Time         `json:"expires"`
	IdleTimeout string            `json:"idle_timeout,omitempty"`
	OnTTL       string            `json:"on_ttl,omitempty"`
	LastActive  time.Time         `json:"last_active"`
	Limits      Limits            `json:"limits"`
	Network     Network           `json:"network"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Trigger     Trigger           `json:"trigger,omitzero"`
	Grants      []Grant           `json:"grants,omitempty"`
	Usage       *Usage            `json:"usage,omitempty"`
	Ended       *time.Time        `json:"ended,omitempty"`
	EndReason   string            `json:"end_reason,omitempty"`
	// Pool names the pool the sandbox was taken from ("": made for its
	// create). PoolMiss, in a create's answer, says why a create that
	// named or matched a pool got no sandbox of it.
	Pool     string `json:"pool,omitempty"`
	PoolMiss string `json:"pool_miss,omitempty"`
	// ExternalID is the create's external_id, if it named one.
	ExternalID string `json:"external_id,omitempty"`
}

// PausedTTL is how long a sandbox paused at its TTL (OnTTL "pause") is
// kept before it ends.
const PausedTTL = 24 * time.Hour

// Extend moves a sandbox's expiry to TTL from now.
type Extend struct {
	TTL string `json:"ttl"`
}

// MintPortToken asks for a token that reaches one port of a sandbox
// (POST /v1/sandboxes/{id}/port-tokens): Port, 1-65535; TTL, a Go
// duration (default 1h, at most 168h).
type MintPortToken struct {
	Port int    `json:"port"`
	TTL  string `json:"ttl,omitempty"`
}

// PortToken is a minted port token: what to send (the airlock_token
// query parameter, or the X-Airlock-Port-Token header), the URL of the
// port's root with the token in it (a path alone when the daemon was
// asked over its unix socket), and when it stops working.
type PortToken struct {
	Token   string    `json:"token"`
	URL     string    `json:"url"`
	Expires time.Time `json:"expires"`
}

// TTY asks for a terminal of this size.
type TTY struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Exec runs one command in a sandbox.
type Exec struct {
	Cmd  []string          `json:"cmd"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`  // default /workspace
	User string            `json:"user,omitempty"` // "user" (default) or "root"
	// Timeout kills the command after this long (Go duration); default none
	// beyond the sandbox's own TTL.
	Timeout string `json:"timeout,omitempty"`
	// Stdin is written to the command's stdin, which is then closed, unless
	// KeepStdin leaves it open for Input calls.
	Stdin     []byte `json:"stdin,omitempty"`
	KeepStdin bool   `json:"keep_stdin,omitempty"`
	// Background returns once the command has started; its output is
	// read later with the process stream.
	Background bool   `json:"background,omitempty"`
	Tag        string `json:"tag,omitempty"`
	TTY        *TTY   `json:"tty,omitempty"`
	// Detach (not part of the JSON API: E2B's envd front sets it) streams
	// the command's events like a foreground command's, but a caller that
	// goes away does not kill it: it runs on, counted as a background
	// command, to its end or its Timeout.
	Detach bool `json:"-"`
}

// ExecEvent is one line of an exec or process stream (NDJSON).
type ExecEvent struct {
	PID    uint32   `json:"pid,omitempty"`     // first event: the command started
	ExecID string   `json:"exec_id,omitempty"` // first event of exec: its id in the audit log
	Stdout []byte   `json:"stdout,omitempty"`
	Stderr []byte   `json:"stderr,omitempty"`
	PTY    []byte   `json:"pty,omitempty"`
	End    *ExecEnd `json:"end,omitempty"` // last event
	// Dropped (logs) is how many bytes of the command's output before
	// this event's the daemon no longer keeps.
	Dropped int64 `json:"dropped,omitempty"`
}

// ExecEnd is how a command ended. Its fields are reported by the sandbox's
// agent (inside the sandbox), except TimedOut and SandboxEnded.
type ExecEnd struct {
	ExitCode int    `json:"exit_code"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Limit names the limit of the sandbox's commands the command met
	// ("memory": the kernel's OOM killer killed it, or a process of it;
	// "pids": forks were refused); the sandbox lives on. Status says more.
	Limit string `json:"limit,omitempty"`
	// SandboxEnded says the sandbox itself ended (a limit, its TTL, a
	// kill) while the command ran; EndReason says why.
	SandboxEnded bool   `json:"sandbox_ended,omitempty"`
	EndReason    string `json:"end_reason,omitempty"`
}

// Process is one running command of a sandbox.
type Process struct {
	PID uint32   `json:"pid"`
	Tag string   `json:"tag,omitempty"`
	Cmd []string `json:"cmd"`
	Cwd string   `json:"cwd,omitempty"`
}

// Input is written to a process's stdin (or terminal); EOF closes stdin.
type Input struct {
	Data []byte `json:"data,omitempty"`
	EOF  bool   `json:"eof,omitempty"`
}

// Signal sends a signal to a process's group: "TERM" or "KILL".
type Signal struct {
	Signal string `json:"signal"`
}

// FileEntry describes one file of a sandbox. Reported by the sandbox.
type FileEntry struct {
	Name     string    `json:"name"`
	Path     string    `json:"path"`
	Type     string    `json:"type"` // file, dir, symlink
	Size     int64     `json:"size"`
	Mode     string    `json:"mode"` // e.g. -rw-r--r--
	Owner    string    `json:"owner,omitempty"`
	Group    string    `json:"group,omitempty"`
	Modified time.Time `json:"modified"`
	Target   string    `json:"target,omitempty"` // a symlink's target
}

// MakeDir creates a directory (and its parents).
type MakeDir struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
}

// Move renames a file or directory.
type Move struct {
	From string `json:"from"`
	To   string `json:"to"`
	User string `json:"user,omitempty"`
}

// Edit replaces one exact, unique occurrence of Old by New in a file.
type Edit struct {
	Path string `json:"path"`
	Old  string `json:"old"`
	New  string `json:"new"`
	User string `json:"user,omitempty"`
}

// WatchEvent is one line of a directory watch stream (NDJSON).
type WatchEvent struct {
	Path string `json:"path"`
	Op   string `json:"op"` // create, write, remove, rename, chmod
}

// Quotas bound what one tenant may use at once; zero means unlimited.
type Quotas struct {
	MaxSandboxes int     `json:"max_sandboxes,omitempty"`
	MaxMemory    int64   `json:"max_memory_bytes,omitempty"` // sum of the sandboxes' memory limits
	MaxCPUs      float64 `json:"max_cpus,omitempty"`         // sum of their CPU limits
	// CPUSeconds is the CPU time the tenant's sandboxes may use per
	// CPUPeriod (Go duration, default "1h"); past it they are stopped and
	// creates refused until the period ends.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	CPUPeriod  string  `json:"cpu_period,omitempty"`
	// MaxSnapshotBytes bounds the file content of the tenant's snapshots.
	MaxSnapshotBytes int64 `json:"max_snapshot_bytes,omitempty"`
}

// CreateSnapshot saves a sandbox's filesystem state as an image.
type CreateSnapshot struct {
	Name string `json:"name,omitempty"`
	// Memory saves the running sandbox's memory too (its processes, open
	// files, /tmp): a sandbox made from the snapshot is restored running.
	// gVisor sandboxes only.
	Memory bool `json:"memory,omitempty"`
}

// Snapshot is a saved filesystem state; create sandboxes from it with
// image "snapshot:<id>". The id is a digest of its content.
type Snapshot struct {
	ID      string    `json:"id"`
	Name    string    `json:"name,omitempty"`
	Sandbox string    `json:"sandbox"`
	Base    string    `json:"base"`     // the image it was taken over
	Root    bool      `json:"has_root"` // it holds a whole root filesystem
	Bytes   int64     `json:"bytes"`
	Created time.Time `json:"created"`
	Skipped []string  `json:"skipped,omitempty"` // special files not saved
	// Memory: the snapshot holds the sandbox's memory (a gVisor
	// checkpoint); MemoryBytes is the checkpoint's size, part of Bytes,
	// and CheckpointMillis how long the sandbox was paused for it (both
	// in the answer to the save only).
	Memory           bool  `json:"memory,omitempty"`
	MemoryBytes      int64 `json:"memory_bytes,omitempty"`
	CheckpointMillis int64 `json:"checkpoint_ms,omitempty"`
}

// CreateFork asks for Count new sandboxes made from one checkpoint of a
// running sandbox (POST /v1/sandboxes/{id}/fork), 1 to MaxForks.
type CreateFork struct {
	Count int `json:"count"`
}

// MaxForks bounds one fork's Count.
const MaxForks = 16

// Fork is what a fork made: Count new sandboxes, each continuing from
// the source's memory and files as they were at its checkpoint (Memory:
// a gVisor sandbox), or from its files only (the container wall: Memory
// false, every copy starts afresh from the files). The source runs on.
type Fork struct {
	Source    string     `json:"source"`
	Sandboxes []*Sandbox `json:"sandboxes"`
	Memory    bool       `json:"memory"`
	// Bytes is the size of the checkpoint (files, and memory when
	// Memory), MemoryBytes the memory's part; CheckpointMillis how long
	// a gVisor source was paused for it (0 on the container wall);
	// CreateMillis how long each copy's
	// create took (in Sandboxes' order; they run at once).
	Bytes            int64   `json:"bytes"`
	MemoryBytes      int64   `json:"memory_bytes,omitempty"`
	CheckpointMillis int64   `json:"checkpoint_ms"`
	CreateMillis     []int64 `json:"create_ms"`
}

// CreateTenant adds a tenant.
type CreateTenant struct {
	Name   string `json:"name"`
	Quotas Quotas `json:"quotas,omitzero"`
	// ScanPolicy says what happens to a credential found in a call:
	// "block" (default: the call fails, naming the rule), "redact" (it is
	// replaced and the call goes on) or "record" (the call goes on).
	ScanPolicy string `json:"scan_policy,omitempty"`
	// Roots are host directories the tenant may name paths under
	// (workspace, repo, a rootfs, oci: and docker-archive: images); none by
	// default. Each must be absolute, exist, and neither hold nor lie in
	// the daemon's own directories.
	Roots []string `json:"roots,omitempty"`
	// Isolation holds the tenant's sandboxes to a wall at least this
	// strong: "container" (default: any wall) or "gvisor" (a create
	// asking for less is refused, and audited as sandbox.refused).
	Isolation string `json:"isolation,omitempty"`
	// KeySHA256 makes the tenant's key one the caller holds, given as the
	// lowercase hex SHA-256 of the key string (64 digits); the answer then
	// carries no key. Without it a key is made and shown once.
	KeySHA256 string `json:"key_sha256,omitempty"`
}

// UpdateTenant changes a tenant's quotas or scan policy (fields left out
// stay as they are).
type UpdateTenant struct {
	Quotas     *Quotas `json:"quotas,omitempty"`
	ScanPolicy string  `json:"scan_policy,omitempty"`
	// Roots, when present, replace the tenant's host roots ([] removes
	// them all).
	Roots *[]string `json:"roots,omitempty"`
	// Isolation, when set, replaces the wall the tenant is held to
	// ("container" lifts the hold).
	Isolation string `json:"isolation,omitempty"`
	// KeySHA256, when set, replaces the tenant's key by the one of this
	// SHA-256 (lowercase hex of the key string): the old key stops
	// working at once.
	KeySHA256 string `json:"key_sha256,omitempty"`
}

// Tenant describes a tenant. Key is set only in the answer to its
// creation: it is stored hashed and cannot be shown again.
type Tenant struct {
	// ID is made when the tenant is created and never issued again; what
	// the tenant owns (sandboxes, snapshots, secrets, audit records) is
	// bound to it. Name may be reused once the tenant is deleted.
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Quotas     Quotas    `json:"quotas"`
	ScanPolicy string    `json:"scan_policy"`
	Roots      []string  `json:"roots,omitempty"`
	Isolation  string    `json:"isolation"` // the wall its sandboxes are held to at least
	Created    time.Time `json:"created"`
	Key        string    `json:"key,omitempty"`
	// Sandboxes counts what max_sandboxes counts: live sandboxes, its
	// pools' ready ones and those being made; Pooled, the pools' ready
	// ones among them.
	Sandboxes  int     `json:"sandboxes"`
	Pooled     int     `json:"pooled"`
	CPUSeconds float64 `json:"cpu_seconds_used"`
}

// E2BKey is a tenant's E2B-shaped key (e2b_ and 40 hex digits), an alias
// of its key for the E2B front (docs/e2b.md), shown once.
type E2BKey struct {
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
}

// KillAll destroys every sandbox of Tenant, or of every tenant when empty
// (admin only). It answers when they are gone.
type KillAll struct {
	Tenant string `json:"tenant,omitempty"`
}

// Killed lists what a kill switch destroyed.
type Killed struct {
	Destroyed []string `json:"destroyed"`
}

// AuditRecord is one record of the audit log (docs/api.md, "Audit").
// Source says who vouches for it: "observed" by the host, or "reported"
// by the sandbox.
type AuditRecord struct {
	Seq     uint64          `json:"seq"`
	Time    time.Time       `json:"time"`
	Kind    string          `json:"kind"`
	Tenant  string          `json:"tenant,omitempty"`
	Sandbox string          `json:"sandbox,omitempty"`
	Trigger string          `json:"trigger,omitempty"`
	Source  string          `json:"source"`
	Data    json.RawMessage `json:"data,omitempty"`
	Prev    string          `json:"prev"`
	Hash    string          `json:"hash"`
	Sig     string          `json:"sig,omitempty"`
}

// Resources are amounts of what a node hands out to sandboxes: CPUs and
// memory of their limits, and their number (GET /v1/node).
type Resources struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	Sandboxes   int     `json:"sandboxes"`
}

// NodePool is one tenant's warm pool as the node reports it.
type NodePool struct {
	Tenant  string `json:"tenant"`
	Name    string `json:"name"`
	Size    int    `json:"size"`
	Ready   int    `json:"ready"`
	Filling int    `json:"filling"`
}

// AuditHead is the last record of the node's audit log on disk: its
// sequence number and hash (`airlock audit verify --anchor SEQ:HASH`).
type AuditHead struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// Node is what a daemon says of itself to a cluster (GET /v1/node, admin
// key): its name, version and boot (BootID is random per start), its
// capacity and what its sandboxes hold of it (live, being made and
// pooled), the walls it can make, every tenant's pools, its audit log's
// head, and Rev, the revision of its event stream it was read at.
type Node struct {
	Name       string     `json:"name"`
	Version    string     `json:"version"`
	BootID     string     `json:"boot_id"`
	Capacity   Resources  `json:"capacity"`
	Allocated  Resources  `json:"allocated"`
	Isolations []string   `json:"isolations"`
	Pools      []NodePool `json:"pools"`
	AuditHead  *AuditHead `json:"audit_head,omitempty"`
	Rev        uint64     `json:"rev"`
}

// Node event types (NodeEvent.Type).
const (
	NodeEventHello          = "hello"           // first line: Node as it is
	NodeEventSandboxCreated = "sandbox.created" // Sandbox
	NodeEventSandboxEnded   = "sandbox.ended"   // Sandbox, with its end reason
	NodeEventPool           = "pool"            // Pool: its ready or filling count changed
	NodeEventCapacity       = "capacity"        // Node as it is: Allocated (or Capacity) changed
	NodeEventHeartbeat      = "heartbeat"       // nothing else
	NodeEventError          = "error"           // Error: the stream's last line (cut off)
)

// NodeEvent is one line of GET /v1/node/events (NDJSON). Rev increases
// strictly from line to line (with gaps).
type NodeEvent struct {
	Rev     uint64    `json:"rev"`
	Type    string    `json:"type"`
	Node    *Node     `json:"node,omitempty"`
	Sandbox *Sandbox  `json:"sandbox,omitempty"`
	Pool    *NodePool `json:"pool,omitempty"`
	Error   *Error    `json:"error,omitempty"`
}
