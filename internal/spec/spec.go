// Package spec turns an external sandbox request into one validated Spec.
// It is pure (no I/O, no syscalls) and fuzzed: every field a caller sets is
// checked here before any other package sees it, and unknown fields are
// rejected by the decoders that feed it. It may import only api/ and errdefs.
package spec

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Defaults for every limit. They are documented in docs/security-model.md.
const (
	DefaultMemory  = 2 << 30
	DefaultDisk    = 1 << 30
	DefaultCPUs    = 1.0
	DefaultPids    = 512
	DefaultTimeout = 10 * time.Minute
	DefaultNoFile  = 1024

	// MinMemory keeps a sandbox able to start at all.
	MinMemory = 16 << 20
	// MinDisk is the smallest writable area (it also holds /etc and /dev).
	MinDisk = 4 << 20
)

// Ceilings of every limit: what a host can mean. A value past one is
// refused, never clamped; sums of them (a tenant's quota) cannot overflow.
const (
	MaxMemory      = 1 << 40 // 1 TiB
	MaxDisk        = 1 << 40
	MaxCPUs        = 1024
	MaxPids        = 1 << 22 // the kernel's PID_MAX_LIMIT
	MaxNoFile      = 1 << 20 // the kernel's default fs.nr_open
	MaxEgressBytes = 1 << 40
	MaxMaxConns    = 65536
	MaxTimeout     = 7 * 24 * time.Hour
	// MaxEnvName and MaxEnv bound an environment's names and size.
	MaxEnvName = 256
	MaxEnv     = 4096
	// MaxHostRules bounds allow and deny rules together: the proxy
	// checks them on every request.
	MaxHostRules = 1024
)

// Degradable controls are the only controls a caller may opt out of, and
// only explicitly. Namespaces, cgroups, seccomp and capabilities have none.
var Degradable = []string{"landlock"}

// Isolations are the walls a sandbox may be made on: "container" (the
// default: airlock's namespace launcher) and "gvisor" (runsc, whose own
// kernel answers the sandbox's system calls).
var Isolations = []string{"container", "gvisor"}

// HeldTo refuses a sandbox on wall asked for a tenant held to wall held
// ("" or "container": any wall). Isolations are in order of strength: a
// tenant held to a wall may have it or a stronger one, never less (an
// operator's "never downgrade" rule).
func HeldTo(asked, held string) error {
	if held == "" {
		held = "container"
	}
	if asked == "" {
		asked = "container"
	}
	if slices.Index(Isolations, asked) >= slices.Index(Isolations, held) {
		return nil
	}
	return errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("--isolation %s is refused: this tenant is held to --isolation %s (ask for it, or an operator may lift it with airlock tenant update --isolation container)", asked, held))
}

// ValidHold checks a tenant's isolation hold ("" keeps the default).
func ValidHold(held string) error {
	if held != "" && !slices.Contains(Isolations, held) {
		return errdefs.Invalid(fmt.Sprintf("isolation %q: must be %s", held, strings.Join(Isolations, " or ")))
	}
	return nil
}

// Spec is the validated description of one sandbox.
type Spec struct {
	// Isolation names the wall (Isolations); "" is "container" (specs
	// recorded before walls could be chosen).
	Isolation string `json:"isolation,omitempty"`
	// Image is "host", an absolute rootfs directory, "oci:PATH",
	// "docker-archive:PATH" or a registry reference.
	Image          string        `json:"image"`
	WritableRootfs bool          `json:"writable_rootfs,omitempty"`
	Workspace      string        `json:"workspace,omitempty"` // host directory, absolute
	Repo           string        `json:"repo,omitempty"`      // host git repository, absolute
	Commit         string        `json:"commit,omitempty"`
	User           string        `json:"user"` // "user" (uid 1000) or "root"
	Env            []string      `json:"env,omitempty"`
	Command        []string      `json:"command"`
	TTY            bool          `json:"tty,omitempty"`
	Limits         Limits        `json:"limits"`
	AllowDegraded  []string      `json:"allow_degraded,omitempty"`
	Hostname       string        `json:"hostname,omitempty"`
	Timeout        time.Duration `json:"timeout"`
	// OnTTL "pause" pauses a long-lived sandbox at its TTL instead of
	// ending it ("" ends it).
	OnTTL string `json:"on_ttl,omitempty"`
	Net   Net    `json:"net"`
	// Grants let it use secrets it never holds (proxy mode only).
	Grants []Grant `json:"grants,omitempty"`
	// Tenant owns the sandbox (airlock serve); its secrets are the ones
	// the grants name.
	Tenant string `json:"tenant,omitempty"`
	// Scan is the secret-scanning policy in force: block, redact or
	// record ("" when nothing is scanned).
	Scan string `json:"scan,omitempty"`
	// HostRoots, when set, are the only host directories the spec's host
	// paths (workspace, repo, a rootfs, oci: or docker-archive: image) may
	// lie under; each is opened beneath its root without following a link
	// out of it. A tenant's spec has its tenant's roots; nil takes host
	// paths as they are (airlock run and airlock mcp: root, one user).
	HostRoots []string `json:"host_roots,omitempty"`
	// Restore is the content id of a snapshot with memory the sandbox is
	// restored from (running, its processes as they were). The daemon
	// sets it from image "snapshot:<id>"; no request names it.
	Restore string `json:"restore,omitempty"`
	// Fork is the content id of the fork checkpoint whose files a fork's
	// copy was made from: they are removed once no copy runs from them.
	// The daemon sets it; no request names it.
	Fork string `json:"fork,omitempty"`
	// Pool names the pool the sandbox was made ahead for (airlock serve):
	// it was made without Env, which the daemon gave it when a create
	// took it, and passes with each of its commands. The daemon sets it;
	// no request names it.
	Pool string `json:"pool,omitempty"`
}

// ScanPolicies are what may be done with a credential found in a call.
var ScanPolicies = []string{"block", "redact", "record"}

// Net is a sandbox's network: none at all, or only its egress proxy.
type Net struct {
	Mode       string   `json:"mode"`             // "none" or "proxy"
	Allow      []string `json:"allow,omitempty"`  // host patterns and preset names
	Deny       []string `json:"deny,omitempty"`   // host patterns
	PolicyFile string   `json:"policy,omitempty"` // YAML or JSON allow/deny file (host path)
	// EgressBytes caps what the sandbox sends out through the proxy.
	EgressBytes int64 `json:"egress_bytes"`
	// MaxConns caps its concurrent proxied connections.
	MaxConns int `json:"max_conns"`
}

// Network defaults.
const (
	DefaultEgressBytes = 1 << 30
	DefaultMaxConns    = 256
)

// Limits are the resource caps; all are enforced by the kernel.
type Limits struct {
	Memory int64   `json:"memory"` // bytes
	Disk   int64   `json:"disk"`   // bytes of writable space (tmpfs)
	CPUs   float64 `json:"cpus"`   // CFS quota in CPUs
	Pids   int64   `json:"pids"`
	NoFile uint64  `json:"nofile"`
}

// CommandLimits are the memory and pids limits of a long-lived sandbox's
// commands: a child cgroup of the sandbox's, a reserve below its limits,
// so that a runaway command meets its own limit (the kernel's OOM kill, or
// refused forks, stay among the commands) while init and the agent keep
// the reserve. The reserve is an eighth of the memory (16 MiB to 128 MiB)
// and 32 pids, at most half of either.
func (l Limits) CommandLimits() (memory, pids int64) {
	reserve := min(max(l.Memory/8, 16<<20), 128<<20, l.Memory/2)
	return l.Memory - reserve, l.Pids - min(32, l.Pids/2)
}

// Default returns a Spec with every default filled in.
func Default() Spec {
	return Spec{
		Isolation: "container",
		Image:     "host",
		User:      "user",
		Limits: Limits{
			Memory: DefaultMemory, Disk: DefaultDisk, CPUs: DefaultCPUs,
			Pids: DefaultPids, NoFile: DefaultNoFile,
		},
		Timeout: DefaultTimeout,
		Net:     Net{EgressBytes: DefaultEgressBytes, MaxConns: DefaultMaxConns},
	}
}

// Wall is the name of the wall the sandbox is made on.
func (s *Spec) Wall() string {
	if s.Isolation == "" {
		return "container"
	}
	return s.Isolation
}

// NetMode settles Mode: proxy when any rule or policy file is given,
// none otherwise, unless the caller named one.
func (s *Spec) NetMode() string {
	if s.Net.Mode != "" {
		return s.Net.Mode
	}
	if len(s.Net.Allow) > 0 || s.Net.PolicyFile != "" || len(s.Grants) > 0 {
		return "proxy"
	}
	return "none"
}

// The validators below are written out rather than compiled regexps: every
// sandbox's init runs this binary's package initialisers, and compiling
// regexps there cost more than half a millisecond per sandbox.

// CheckEnvName refuses an environment variable name that is not letters,
// digits and _ (not starting with a digit), at most MaxEnvName bytes: a
// name holding "=" or NUL would change another variable, or the command
// line it ends up in.
func CheckEnvName(k string) error {
	if !envKeyOK(k) {
		return errdefs.Invalid(fmt.Sprintf("environment variable name %.80q: must be 1–%d letters, digits and _, not starting with a digit (no \"=\", no NUL)", k, MaxEnvName))
	}
	return nil
}

func envKeyOK(k string) bool {
	if len(k) > MaxEnvName {
		return false
	}
	for i, c := range k {
		letter := c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return k != ""
}

func hostnameOK(h string) bool {
	if h == "" || len(h) > 63 || h[0] == '-' || h[len(h)-1] == '-' {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func revisionOK(r string) bool {
	if r == "" || len(r) > 200 || r[0] == '-' {
		return false
	}
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._/^~@{}-", c)) {
			return false
		}
	}
	return true
}

// Validate checks every field and returns the first problem, classed as
// errdefs.ErrInvalidArgument, naming the flag a user would fix.
func (s *Spec) Validate() error {
	if len(s.Command) == 0 || s.Command[0] == "" {
		return errdefs.Invalid("no command given: use airlock run [flags] -- COMMAND [ARG...]")
	}
	return s.validate()
}

// ValidateLongLived checks the spec of a long-lived sandbox (airlock
// serve): no command (commands are executed later), Timeout is its TTL.
func (s *Spec) ValidateLongLived() error {
	if len(s.Command) > 0 {
		return errdefs.Invalid("a long-lived sandbox takes no command: execute commands in it once created")
	}
	if s.TTY {
		return errdefs.Invalid("a long-lived sandbox has no terminal of its own: ask for one per command")
	}
	return s.validate()
}

func (s *Spec) validate() error {
	bad := func(format string, a ...any) error { return errdefs.Invalid(fmt.Sprintf(format, a...)) }
	for _, a := range s.Command {
		if strings.IndexByte(a, 0) >= 0 {
			return bad("command argument contains a NUL byte")
		}
	}
	if s.Isolation != "" && !slices.Contains(Isolations, s.Isolation) {
		return bad("--isolation %q: must be %s", s.Isolation, strings.Join(Isolations, " or "))
	}
	if err := validateImage(s.Image); err != nil {
		return err
	}
	if s.Workspace != "" && s.Repo != "" {
		return bad("--workspace and --repo are mutually exclusive")
	}
	if s.Workspace != "" && !cleanAbs(s.Workspace) {
		return bad("--workspace %q: must be an absolute, clean path", s.Workspace)
	}
	if (s.Repo == "") != (s.Commit == "") {
		return bad("--repo and --commit go together")
	}
	if s.Repo != "" {
		if !cleanAbs(s.Repo) {
			return bad("--repo %q: must be an absolute, clean path", s.Repo)
		}
		if !revisionOK(s.Commit) {
			return bad("--commit %q: not a revision", s.Commit)
		}
	}
	switch s.User {
	case "user", "root":
	default:
		return bad("--user %q: must be \"user\" or \"root\"", s.User)
	}
	if len(s.Env) > MaxEnv {
		return bad("--env: at most %d variables", MaxEnv)
	}
	seen := map[string]bool{}
	for _, kv := range s.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !envKeyOK(k) {
			return bad("--env %.80q: must be KEY=VALUE with KEY of 1–%d letters, digits and _", kv, MaxEnvName)
		}
		if strings.IndexByte(kv, 0) >= 0 {
			return bad("--env %q: contains a NUL byte", k)
		}
		if seen[k] {
			return bad("--env %s given twice", k)
		}
		seen[k] = true
	}
	if s.Hostname != "" && !hostnameOK(s.Hostname) {
		return bad("hostname %q: must be a lower-case DNS label", s.Hostname)
	}
	for _, d := range s.AllowDegraded {
		if !slices.Contains(Degradable, d) {
			return bad("--allow-degraded %q: only %s may be degraded; namespaces, cgroups, seccomp and capabilities have no opt-out", d, strings.Join(Degradable, ", "))
		}
	}
	switch s.Net.Mode {
	case "", "none", "proxy":
	default:
		return bad("--net %q: must be none or proxy", s.Net.Mode)
	}
	if s.Net.Mode == "none" && (len(s.Net.Allow) > 0 || s.Net.PolicyFile != "") {
		return bad("--net none takes no --allow or --policy")
	}
	if s.Net.PolicyFile != "" && !cleanAbs(s.Net.PolicyFile) {
		return bad("--policy %q: must be an absolute, clean path", s.Net.PolicyFile)
	}
	if len(s.Net.Allow)+len(s.Net.Deny) > MaxHostRules {
		return bad("--allow and --deny: at most %d rules in all", MaxHostRules)
	}
	for _, a := range append(append([]string{}, s.Net.Allow...), s.Net.Deny...) {
		if a == "" || len(a) > 260 || strings.ContainsAny(a, " \t\n\x00/") {
			return bad("--allow %q: not a host pattern", a)
		}
	}
	if s.Net.EgressBytes < 0 || s.Net.EgressBytes > MaxEgressBytes {
		return bad("egress bytes %d: must be between 0 and %s", s.Net.EgressBytes, FormatSize(MaxEgressBytes))
	}
	if s.Net.MaxConns < 1 || s.Net.MaxConns > MaxMaxConns {
		return bad("max conns %d: must be between 1 and %d", s.Net.MaxConns, MaxMaxConns)
	}
	if len(s.Grants) > 0 && s.Net.Mode == "none" {
		return bad("grants act through the egress proxy: --net none takes none")
	}
	if err := s.validateGrants(); err != nil {
		return err
	}
	if err := s.validateHostRoots(); err != nil {
		return err
	}
	if s.Scan != "" && !slices.Contains(ScanPolicies, s.Scan) {
		return bad("--scan %q: must be one of %s", s.Scan, strings.Join(ScanPolicies, ", "))
	}
	l := s.Limits
	switch {
	case l.Memory < MinMemory || l.Memory > MaxMemory:
		return bad("--memory %d: must be between %s and %s", l.Memory, FormatSize(MinMemory), FormatSize(MaxMemory))
	case l.Disk < MinDisk || l.Disk > MaxDisk:
		return bad("--disk %d: must be between %s and %s", l.Disk, FormatSize(MinDisk), FormatSize(MaxDisk))
	case !(l.CPUs >= 0.01 && l.CPUs <= MaxCPUs):
		return bad("--cpus %v: must be between 0.01 and %d", l.CPUs, MaxCPUs)
	case l.Pids < 8 || l.Pids > MaxPids:
		return bad("--pids %d: must be between 8 and %d", l.Pids, MaxPids)
	case l.NoFile < 64 || l.NoFile > MaxNoFile:
		return bad("nofile %d: must be between 64 and %d", l.NoFile, MaxNoFile)
	case s.Timeout <= 0 || s.Timeout > MaxTimeout:
		return bad("--timeout %v: must be between 1ns and %v", s.Timeout, MaxTimeout)
	case s.OnTTL != "" && s.OnTTL != "pause":
		return bad("on_ttl %q: end or pause", s.OnTTL)
	}
	return nil
}

// Degraded reports whether the caller opted out of control c.
func (s *Spec) Degraded(c string) bool { return slices.Contains(s.AllowDegraded, c) }

func cleanAbs(p string) bool {
	return path.IsAbs(p) && path.Clean(p) == p && !strings.ContainsRune(p, 0)
}

// HostPaths lists the host paths the spec names, each with the field that
// names it: what a tenant may name only under its roots.
func (s *Spec) HostPaths() [][2]string {
	var out [][2]string
	if p := ImagePath(s.Image); p != "" {
		out = append(out, [2]string{"image", p})
	}
	for _, f := range [][2]string{{"workspace", s.Workspace}, {"repo", s.Repo}, {"policy", s.Net.PolicyFile}} {
		if f[1] != "" {
			out = append(out, f)
		}
	}
	return out
}

// ImagePath is the host path an image name stands for: a rootfs
// directory, or the file or directory after oci: or docker-archive: ("" for
// the host image and registry references).
func ImagePath(img string) string {
	if strings.HasPrefix(img, "/") {
		return img
	}
	for _, pre := range []string{"oci:", "docker-archive:"} {
		if p, ok := strings.CutPrefix(img, pre); ok {
			return p
		}
	}
	return ""
}

// Within reports whether p is root or lies below it, both absolute and
// clean. It is lexical: links are the opener's business.
func Within(root, p string) bool {
	if !cleanAbs(root) || !cleanAbs(p) {
		return false
	}
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}

// RootOf is the root of roots that holds p ("" when none does).
func RootOf(roots []string, p string) string {
	best := ""
	for _, r := range roots {
		if Within(r, p) && len(r) > len(best) {
			best = r
		}
	}
	return best
}

func (s *Spec) validateHostRoots() error {
	if s.HostRoots == nil {
		return nil
	}
	for _, r := range s.HostRoots {
		if !cleanAbs(r) || r == "/" {
			return errdefs.Invalid(fmt.Sprintf("host root %q: must be an absolute, clean path other than /", r))
		}
	}
	for _, f := range s.HostPaths() {
		if RootOf(s.HostRoots, f[1]) == "" {
			return errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("%s %q: not under a host root of this tenant", f[0], f[1]))
		}
	}
	return nil
}

func validateImage(img string) error {
	switch {
	case img == "" || img == "host":
		return nil
	case strings.HasPrefix(img, "oci:"), strings.HasPrefix(img, "docker-archive:"):
		_, p, _ := strings.Cut(img, ":")
		if !cleanAbs(p) {
			return errdefs.Invalid(fmt.Sprintf("--image %q: the path after the prefix must be absolute and clean", img))
		}
		return nil
	case strings.HasPrefix(img, "/"):
		if !cleanAbs(img) {
			return errdefs.Invalid(fmt.Sprintf("--image %q: must be a clean absolute path", img))
		}
		return nil
	case len(img) > 512 || !registryRef().MatchString(img):
		return errdefs.Invalid(fmt.Sprintf("--image %q: not \"host\", an absolute path, oci:PATH, docker-archive:PATH or a registry reference (such as docker.io/library/alpine:3.20)", img))
	}
	return nil
}

// registryRef is the distribution reference grammar:
// [domain[:port]/]path[:tag][@digest]. Compiled on first use: every airlock
// process (a sandbox's init too) would pay for it at start.
var registryRef = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?` +
		`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*` +
		`(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$`)
})

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}

// ParseSize parses sizes such as 512M, 2G, 1.5GiB or 1048576 (bytes).
// Units are binary (K = 1024), case-insensitive.
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], t[i:]
	}
	mult, ok := sizeUnits[unit]
	if !ok || num == "" {
		return 0, errdefs.Invalid(fmt.Sprintf("size %q: want a number with an optional unit K, M, G or T", s))
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || f*float64(mult) >= math.MaxInt64/2 {
		return 0, errdefs.Invalid(fmt.Sprintf("size %q: out of range", s))
	}
	return int64(f * float64(mult)), nil
}

// FormatSize prints n bytes the way airlock's messages do: 256MiB, 2GiB.
func FormatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	u := 0
	for f >= 1024 && u < len(units)-1 && math.Mod(f, 1024) == 0 {
		f /= 1024
		u++
	}
	if u == 0 && n >= 1024 {
		return fmt.Sprintf("%.1fKiB", float64(n)/1024)
	}
	return fmt.Sprintf("%d%s", int64(f), units[u])
}
