// Package blueprint maps agent-sandbox's pod templates to airlock create
// bodies (docs/kubernetes.md, "PodSpec fields"): containers[0]'s image, env
// and cpu/memory/ephemeral-storage limits, the hostname, the runtime class
// as the wall, and the pod template annotation airlock.dev/network-allow as
// a proxy egress allow-list, and airlock.dev/grants as grants whose secrets
// are keys of labelled Kubernetes Secrets (grants.go). Every other PodSpec
// and Container field is
// either ignored, because it means nothing for a sandbox and ignoring it
// weakens nothing (podSpecFields, containerFields), or refused when set:
// the Sandbox is then Ready=False with reason Unsupported naming the field.
//
// The placement request is the limits; unset, they default to 0.25 CPU and
// 256 MiB, and those defaults are sent as the limits so that the daemon's
// accounting and the controller's agree. Hash identifies a blueprint's
// create body.
package blueprint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
)

// Defaults of the limits (and so of the placement request).
const (
	DefaultCPUs        = 0.25
	DefaultMemoryBytes = 256 << 20
	// MaxTTL is the daemon's cap on a sandbox's TTL.
	MaxTTL = 168 * time.Hour
)

// AnnotationNetworkAllow on the pod template lists the hosts a sandbox may
// reach (comma-separated) through the daemon's egress proxy.
const AnnotationNetworkAllow = "airlock.dev/network-allow"

// Blueprint is what a pod template asks of airlock.
type Blueprint struct {
	// RuntimeClass is the template's runtimeClassName.
	RuntimeClass string
	// Create is the create body, without the per-object fields (external
	// id, metadata, TTL, env of a claim): see Body.
	Create api.CreateSandbox
	// Hash identifies Create (lowercase hex SHA-256 of its JSON).
	Hash string
	// Secrets are the Secret keys Create's grants use (AnnotationGrants):
	// the controller pushes each to the node before a create.
	Secrets []SecretRef
}

// CPUs and MemoryBytes are the placement request: the limits.
func (b *Blueprint) CPUs() float64      { return b.Create.Limits.CPUs }
func (b *Blueprint) MemoryBytes() int64 { return b.Create.Limits.MemoryBytes }

// Body is a create body for one object: Create with these fields.
func (b *Blueprint) Body(externalID string, metadata map[string]string, ttl string) *api.CreateSandbox {
	c := b.Create
	c.Env = copyMap(b.Create.Env)
	c.Network.Allow = append([]string(nil), b.Create.Network.Allow...)
	c.Grants = copyGrants(b.Create.Grants)
	c.ExternalID, c.Metadata, c.TTL = externalID, metadata, ttl
	return &c
}

// Field is one refused field and why.
type Field struct {
	Path string
	Why  string
}

// Unsupported is a template that asks for what airlock does not do.
type Unsupported struct{ Fields []Field }

func (u *Unsupported) Error() string {
	parts := make([]string, len(u.Fields))
	for i, f := range u.Fields {
		parts[i] = f.Path + ": " + f.Why
	}
	return strings.Join(parts, "; ")
}

// RuntimeClass is a pod template's runtimeClassName ("" if none).
func RuntimeClass(pt *sandboxv1.PodTemplate) string {
	if pt.Spec.RuntimeClassName == nil {
		return ""
	}
	return *pt.Spec.RuntimeClassName
}

// Isolation is the wall of a runtime class: gvisor for a class whose name
// ends in "gvisor" (airlock-gvisor), container otherwise.
func Isolation(class string) string {
	if strings.HasSuffix(class, "gvisor") {
		return "gvisor"
	}
	return "container"
}

// ForSandbox maps a Sandbox's blueprint.
func ForSandbox(s *sandboxv1.Sandbox) (*Blueprint, error) {
	var bad []Field
	if len(s.Spec.VolumeClaimTemplates) > 0 {
		bad = append(bad, Field{"spec.volumeClaimTemplates", "volumes are not supported by airlock"})
	}
	if s.Spec.OperatingMode == sandboxv1.SandboxOperatingModeSuspended {
		bad = append(bad, Field{"spec.operatingMode", "Suspended is not supported by airlock yet"})
	}
	return build(&s.Spec.PodTemplate, bad)
}

// ForTemplate maps a SandboxTemplate.
func ForTemplate(t *extv1.SandboxTemplate) (*Blueprint, error) {
	var bad []Field
	if len(t.Spec.VolumeClaimTemplates) > 0 {
		bad = append(bad, Field{"spec.volumeClaimTemplates", "volumes are not supported by airlock"})
	}
	if t.Spec.NetworkPolicy != nil && t.Spec.NetworkPolicyManagement != extv1.NetworkPolicyManagementUnmanaged {
		bad = append(bad, Field{"spec.networkPolicy", "NetworkPolicy rules are not applied by airlock: use the pod template annotation " + AnnotationNetworkAllow})
	}
	return build(&t.Spec.PodTemplate, bad)
}

// ForPodTemplate maps a pod template alone.
func ForPodTemplate(pt *sandboxv1.PodTemplate) (*Blueprint, error) { return build(pt, nil) }

const specPath = "spec.podTemplate.spec"

func build(pt *sandboxv1.PodTemplate, bad []Field) (*Blueprint, error) {
	ps := &pt.Spec
	bad = append(bad, refused(reflect.ValueOf(ps).Elem(), specPath, podSpecFields)...)
	b := &Blueprint{RuntimeClass: RuntimeClass(pt)}
	c := &b.Create
	c.Isolation = Isolation(b.RuntimeClass)
	c.Hostname = ps.Hostname
	switch n := len(ps.Containers); {
	case n == 0:
		bad = append(bad, Field{specPath + ".containers", "one container is required"})
	case n > 1:
		bad = append(bad, Field{specPath + ".containers", fmt.Sprintf("%d containers: airlock runs one", n)})
	}
	if len(ps.Containers) > 0 {
		bad = append(bad, container(&ps.Containers[0], specPath+".containers[0]", c)...)
	}
	if c.Limits.CPUs == 0 {
		c.Limits.CPUs = DefaultCPUs
	}
	if c.Limits.MemoryBytes == 0 {
		c.Limits.MemoryBytes = DefaultMemoryBytes
	}
	if v, ok := pt.ObjectMeta.Annotations[AnnotationNetworkAllow]; ok {
		var allow []string
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h != "" {
				allow = append(allow, h)
			}
		}
		if len(allow) == 0 {
			bad = append(bad, Field{"spec.podTemplate.metadata.annotations[" + AnnotationNetworkAllow + "]", "names no host"})
		}
		c.Network = api.Network{Mode: "proxy", Allow: allow}
	}
	if v, ok := pt.ObjectMeta.Annotations[AnnotationGrants]; ok {
		grants, refs, why := parseGrants(v)
		bad = append(bad, why...)
		c.Grants, b.Secrets = grants, refs
	}
	if len(bad) > 0 {
		return nil, &Unsupported{Fields: bad}
	}
	j, err := json.Marshal(struct {
		Class  string             `json:"class"`
		Create *api.CreateSandbox `json:"create"`
	}{b.RuntimeClass, c})
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(j)
	b.Hash = hex.EncodeToString(sum[:])
	return b, nil
}

func container(ct *corev1.Container, path string, c *api.CreateSandbox) []Field {
	bad := refused(reflect.ValueOf(ct).Elem(), path, containerFields)
	c.Image = ct.Image
	if c.Image == "" {
		c.Image = "host"
	}
	for i, e := range ct.Env {
		if e.ValueFrom != nil {
			bad = append(bad, Field{fmt.Sprintf("%s.env[%d].valueFrom", path, i), "only literal values are supported"})
			continue
		}
		if c.Env == nil {
			c.Env = map[string]string{}
		}
		c.Env[e.Name] = e.Value
	}
	if len(ct.Resources.Claims) > 0 {
		bad = append(bad, Field{path + ".resources.claims", "dynamic resources are not supported by airlock"})
	}
	names := make([]string, 0, len(ct.Resources.Limits))
	for name := range ct.Resources.Limits {
		names = append(names, string(name))
	}
	sort.Strings(names)
	for _, name := range names {
		q := ct.Resources.Limits[corev1.ResourceName(name)]
		switch corev1.ResourceName(name) {
		case corev1.ResourceCPU:
			c.Limits.CPUs = q.AsApproximateFloat64()
		case corev1.ResourceMemory:
			c.Limits.MemoryBytes = q.Value()
		case corev1.ResourceEphemeralStorage:
			c.Limits.DiskBytes = q.Value()
		default:
			bad = append(bad, Field{path + ".resources.limits[" + name + "]", "airlock limits cpu, memory and ephemeral-storage only"})
		}
	}
	return bad
}

// disposition says what the mapping does with one field.
type disposition int

const (
	mapped  disposition = iota // mapped (by build or container)
	ignored                    // means nothing for a sandbox; ignoring it weakens nothing
	refuse                     // Unsupported when set
)

// podSpecFields classes every PodSpec field by its JSON name; a field not
// listed is refused when set (and fails TestEveryFieldIsClassified).
var podSpecFields = map[string]disposition{
	"containers":                    mapped,
	"hostname":                      mapped,
	"runtimeClassName":              mapped,
	"restartPolicy":                 ignored, // a sandbox is not restarted
	"terminationGracePeriodSeconds": ignored,
	"dnsPolicy":                     ignored, // the daemon's egress proxy resolves names
	"schedulerName":                 ignored, // the controller places airlock sandboxes
	"priorityClassName":             ignored,
	"priority":                      ignored,
	"preemptionPolicy":              ignored,
	"enableServiceLinks":            ignored,
	"imagePullSecrets":              ignored, // images come from the registries the daemon's operator lists
	"automountServiceAccountToken":  ignored, // no token is ever mounted
	"readinessGates":                ignored,
	"schedulingGates":               ignored,
	"os":                            ignored, // linux
	"overhead":                      ignored,
	"evictionResponders":            ignored,
	"volumes":                       refuse,
	"initContainers":                refuse,
	"ephemeralContainers":           refuse,
	"activeDeadlineSeconds":         refuse, // use shutdownTime
	"nodeSelector":                  refuse,
	"serviceAccountName":            refuse,
	"serviceAccount":                refuse,
	"nodeName":                      refuse,
	"hostNetwork":                   refuse,
	"hostPID":                       refuse,
	"hostIPC":                       refuse,
	"shareProcessNamespace":         refuse,
	"securityContext":               refuse,
	"subdomain":                     refuse,
	"affinity":                      refuse,
	"tolerations":                   refuse,
	"hostAliases":                   refuse,
	"dnsConfig":                     refuse,
	"topologySpreadConstraints":     refuse,
	"setHostnameAsFQDN":             refuse,
	"hostUsers":                     refuse,
	"resourceClaims":                refuse,
	"resources":                     refuse, // pod-level resources: set the container's limits
	"hostnameOverride":              refuse,
	"schedulingGroup":               refuse,
}

// containerFields classes every Container field like podSpecFields.
var containerFields = map[string]disposition{
	"name":                     ignored,
	"image":                    mapped,
	"env":                      mapped,
	"resources":                mapped,  // limits; requests are ignored (the limits are the request)
	"ports":                    ignored, // ports are reached through the gateway
	"resizePolicy":             ignored,
	"terminationMessagePath":   ignored,
	"terminationMessagePolicy": ignored,
	"imagePullPolicy":          ignored,
	"stdin":                    ignored,
	"stdinOnce":                ignored,
	"tty":                      ignored,
	"command":                  refuse, // commands run through exec
	"args":                     refuse,
	"workingDir":               refuse,
	"envFrom":                  refuse,
	"restartPolicy":            refuse,
	"restartPolicyRules":       refuse,
	"volumeMounts":             refuse,
	"volumeDevices":            refuse,
	"livenessProbe":            refuse,
	"readinessProbe":           refuse,
	"startupProbe":             refuse,
	"lifecycle":                refuse,
	"securityContext":          refuse,
}

// refused lists the fields of struct v set although refused (or not
// classified).
func refused(v reflect.Value, path string, table map[string]disposition) []Field {
	var out []Field
	ty := v.Type()
	for i := 0; i < ty.NumField(); i++ {
		name := jsonName(ty.Field(i))
		d, known := table[name]
		if known && d != refuse {
			continue
		}
		if v.Field(i).IsZero() {
			continue
		}
		why := "not supported by airlock"
		if !known {
			why = "not known to airlock's controller"
		}
		out = append(out, Field{path + "." + name, why})
	}
	return out
}

func jsonName(f reflect.StructField) string {
	n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if n == "" {
		return f.Name
	}
	return n
}

// TTL is the create TTL for a shutdown time: what is left of it (at least a
// second), capped at MaxTTL; without one, MaxTTL. expired says the time has
// passed.
func TTL(shutdown *metav1.Time, now time.Time) (ttl string, expired bool) {
	if shutdown == nil {
		return MaxTTL.String(), false
	}
	left := shutdown.Sub(now)
	if left <= 0 {
		return "", true
	}
	left = min(max(left.Round(time.Second), time.Second), MaxTTL)
	return left.String(), false
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
