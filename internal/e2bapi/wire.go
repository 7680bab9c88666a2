package e2bapi

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The control plane's JSON, as E2B's OpenAPI (spec/openapi.yml) names it.
// Requests are decoded leniently (the SDKs send fields airlock has no use
// for); what airlock cannot honour is refused by name (createOf), never
// dropped silently.

// newSandbox is POST /v2/sandboxes (and v1's POST /sandboxes).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Timeout             *int64            `json:"timeout"` // seconds
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *network          `json:"network"`
	IAM                 any               `json:"iam"`
	MCP                 any               `json:"mcp"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts []any `json:"volumeMounts"`
}

type network struct {
	AllowOut    []string `json:"allowOut,omitempty"`
	DenyOut     []string `json:"denyOut,omitempty"`
	Rules       any      `json:"rules,omitempty"`
	EgressProxy any      `json:"egressProxy,omitempty"`
	// Inbound traffic settings: airlock lets nothing in but through this
	// front's port routing, so these change nothing.
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    any   `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int `json:"httpsPorts,omitempty"`
}

// sandboxOut is E2B's Sandbox (create, connect).
type sandboxOut struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             string  `json:"domain"`
}

// detailOut is E2B's SandboxDetail (GET /sandboxes/{id}) and, without
// Network, Lifecycle and Domain, ListedSandbox.
type detailOut struct {
	SandboxID           string            `json:"sandboxID"`
	TemplateID          string            `json:"templateID"`
	ClientID            string            `json:"clientID"`
	EnvdVersion         string            `json:"envdVersion"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	State               string            `json:"state"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int64             `json:"memoryMB"`
	DiskSizeMB          int64             `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	VolumeMounts        []any             `json:"volumeMounts"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Network             *network          `json:"network,omitempty"`
	Lifecycle           *lifecycle        `json:"lifecycle,omitempty"`
	Domain              string            `json:"domain,omitempty"`
}

type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

type metricOut struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	CPUCount      int       `json:"cpuCount"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

type snapshotOut struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// errorOut is every error's body: the SDKs branch on the integer code.
type errorOut struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// templateKey is the metadata key a sandbox's E2B template id is kept
// under; keys with metaPrefix are the front's and refused in requests.
const (
	metaPrefix  = "e2b."
	templateKey = metaPrefix + "template"
	// timeoutKey is the timeout (seconds) a create asked: an automatic
	// resume gives the sandbox that long again.
	timeoutKey = metaPrefix + "timeout"
	// autoResumeKey marks a sandbox its own traffic resumes when paused.
	autoResumeKey = metaPrefix + "auto_resume"
)

// allTraffic is E2B's "everything" (the SDK's ALL_TRAFFIC).
const allTraffic = "0.0.0.0/0"

// createOf maps an E2B create onto airlock's request. Defaults: the
// template named "base", ttl the given default. The network is airlock's
// default-deny policy: E2B's default "internet on" is never honoured; an
// explicit allow of everything gets the operator's list (allowAll) or is
// refused.
func createOf(in *newSandbox, templates map[string]string, allowAll []string, defTimeout time.Duration) (*api.CreateSandbox, error) {
	switch {
	case in.IAM != nil:
		return nil, errdefs.Invalid("iam: not supported by airlock (grants: docs/credentials.md)")
	case in.MCP != nil:
		return nil, errdefs.Invalid("mcp: not supported by airlock")
	case len(in.VolumeMounts) > 0:
		return nil, errdefs.Invalid("volumeMounts: not supported by airlock")
	case in.AutoResume != nil && in.AutoResume.Enabled && (in.AutoPause == nil || !*in.AutoPause):
		return nil, errdefs.Invalid("lifecycle.autoResume needs lifecycle.onTimeout 'pause'")
	}
	tpl := in.TemplateID
	if tpl == "" {
		tpl = "base"
	}
	image, err := imageOf(tpl, templates)
	if err != nil {
		return nil, err
	}
	req := &api.CreateSandbox{Image: image, Env: in.EnvVars, Metadata: map[string]string{}}
	for k, v := range in.Metadata {
		if strings.HasPrefix(k, metaPrefix) {
			return nil, errdefs.Invalid(fmt.Sprintf("metadata key %q: keys starting with %q are airlock's", k, metaPrefix))
		}
		req.Metadata[k] = v
	}
	req.Metadata[templateKey] = tpl
	ttl := defTimeout
	if in.Timeout != nil {
		if *in.Timeout <= 0 || *in.Timeout > math.MaxInt32 {
			return nil, errdefs.Invalid(fmt.Sprintf("timeout %d: want seconds, at least 1", *in.Timeout))
		}
		ttl = time.Duration(*in.Timeout) * time.Second
	}
	req.TTL = ttl.String()
	req.Metadata[timeoutKey] = strconv.FormatInt(int64(ttl/time.Second), 10)
	if in.AutoPause != nil && *in.AutoPause {
		req.OnTTL = "pause"
	}
	if in.AutoResume != nil && in.AutoResume.Enabled {
		req.Metadata[autoResumeKey] = "true"
	}
	if req.Network, err = networkOf(in.AllowInternetAccess, in.Network, allowAll); err != nil {
		return nil, err
	}
	return req, nil
}

// imageOf is the airlock image of an E2B template id: a name the operator
// mapped (--e2b-template NAME=IMAGE), or a snapshot id as is.
func imageOf(tpl string, templates map[string]string) (string, error) {
	if strings.HasPrefix(tpl, "snapshot:") {
		return tpl, nil
	}
	if img, ok := templates[tpl]; ok {
		return img, nil
	}
	return "", errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found: this daemon maps %s", tpl, names(templates)))
}

func names(m map[string]string) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	if len(out) == 0 {
		return "no templates"
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// networkOf maps E2B's egress fields onto airlock's policy:
//
//	allowOut names, *.wildcards, single IPs   → allow (mode proxy)
//	allowOut 0.0.0.0/0, allow_internet_access → the operator's list, else refused
//	allowOut other CIDRs                      → refused
//	denyOut names and single IPs              → deny
//	denyOut CIDRs                             → nothing to do (unlisted is denied)
//	rules, egressProxy                        → refused
//	nothing said                              → the operator's list, else none
func networkOf(internet *bool, n *network, allowAll []string) (api.Network, error) {
	if n == nil {
		n = &network{}
	}
	switch {
	case n.Rules != nil:
		return api.Network{}, errdefs.Invalid("network.rules: not supported by airlock (header transforms are grants: docs/credentials.md)")
	case n.EgressProxy != nil:
		return api.Network{}, errdefs.Invalid("network.egressProxy: not supported by airlock")
	}
	var allow, deny []string
	everything := internet != nil && *internet
	for _, a := range n.AllowOut {
		switch host, ok := hostOf(a); {
		case a == allTraffic:
			everything = true
		case !ok:
			return api.Network{}, errdefs.Invalid(fmt.Sprintf("network.allowOut %q: airlock allows host names, *.wildcards and single addresses, not address ranges", a))
		default:
			allow = append(allow, host)
		}
	}
	for _, d := range n.DenyOut {
		if host, ok := hostOf(d); ok {
			deny = append(deny, host)
		}
	}
	if everything {
		if len(allowAll) == 0 {
			return api.Network{}, errdefs.Invalid("network: airlock denies egress by default and never allows the whole internet; name the hosts in network.allowOut (the operator may set a list for allow_internet_access: --e2b-allow-internet)")
		}
		allow = append(allow, allowAll...)
	}
	if len(allow) == 0 && internet == nil && len(n.AllowOut) == 0 {
		allow = append(allow, allowAll...)
	}
	if len(allow) == 0 {
		return api.Network{Mode: "none"}, nil
	}
	return api.Network{Mode: "proxy", Allow: allow, Deny: deny}, nil
}

// hostOf is an allow/deny entry as an airlock host: a name, a *.wildcard,
// an address, or an address with a full-length prefix; false for a range.
func hostOf(s string) (string, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Bits() == p.Addr().BitLen() {
			return p.Addr().String(), true
		}
		return "", false
	}
	return s, s != ""
}

// cpuCount is E2B's whole number of CPUs for airlock's fraction.
func cpuCount(cpus float64) int {
	if cpus <= 0 {
		return 1
	}
	return int(math.Ceil(cpus))
}
