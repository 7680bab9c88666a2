package controller

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// Claim condition reasons of this controller's own besides the Sandbox
// ones (ReasonUnsupported, ReasonUnschedulable: no node has a ready pool
// entry or room for a cold create) and upstream's (ClaimExpired).
const (
	// ReasonEnvNotAllowed: the claim's env is refused by the template's
	// envVarsInjectionPolicy.
	ReasonEnvNotAllowed = "EnvNotAllowed"
	// ReasonInvalidMetadata: additionalPodMetadata is refused.
	ReasonInvalidMetadata = "InvalidMetadata"
	// ReasonSandboxNameTaken: a Sandbox of the claim's name exists that is
	// not the claim's.
	ReasonSandboxNameTaken = "SandboxNameTaken"
)

// errEnv, errMetadata and errUnsupported classify what claimSpec refuses.
var (
	errEnv         = errors.New("env refused")
	errMetadata    = errors.New("additionalPodMetadata refused")
	errUnsupported = errors.New("unsupported")
)

// claimReason is the Ready=False reason of an error of claimSpec.
func claimReason(err error) string {
	switch {
	case errors.Is(err, errEnv):
		return ReasonEnvNotAllowed
	case errors.Is(err, errMetadata):
		return ReasonInvalidMetadata
	default:
		return ReasonUnsupported
	}
}

// claimSpec is the Sandbox blueprint of a claim of template tmpl: the
// template's, with the claim's env applied to the pod's first container
// (airlock runs that one) as the template's envVarsInjectionPolicy says,
// and its additionalPodMetadata merged into the pod template's metadata.
// Each value here is the claim author's, so each is checked: env names are
// plain names, metadata keys qualified names outside the system domains,
// labels of the allowed domain, and nothing overrides the template's.
func claimSpec(tmpl *extv1.SandboxTemplate, claim *extv1.SandboxClaim) (*sandboxv1.SandboxBlueprint, error) {
	if len(claim.Spec.VolumeClaimTemplates) > 0 {
		return nil, fmt.Errorf("%w: volumeClaimTemplates: airlock sandboxes have no persistent volumes", errUnsupported)
	}
	bp := tmpl.Spec.SandboxBlueprint.DeepCopy()
	if err := applyEnv(&bp.PodTemplate.Spec, claim.Spec.Env, tmpl.Spec.EnvVarsInjectionPolicy); err != nil {
		return nil, err
	}
	if err := mergePodMetadata(&bp.PodTemplate.ObjectMeta, &claim.Spec.AdditionalPodMetadata); err != nil {
		return nil, err
	}
	return bp, nil
}

// applyEnv applies a claim's env to spec's first container under policy:
// Disallowed (the default) refuses any; Allowed adds new names only;
// Overrides also replaces the template's values.
func applyEnv(spec *corev1.PodSpec, env []extv1.EnvVar, policy extv1.EnvVarsInjectionPolicy) error {
	if len(env) == 0 {
		return nil
	}
	if policy != extv1.EnvVarsInjectionPolicyAllowed && policy != extv1.EnvVarsInjectionPolicyOverrides {
		return fmt.Errorf("%w: the template's envVarsInjectionPolicy is Disallowed", errEnv)
	}
	if len(spec.Containers) == 0 {
		return fmt.Errorf("%w: the template has no container", errEnv)
	}
	c := &spec.Containers[0]
	if policy == extv1.EnvVarsInjectionPolicyAllowed && len(c.EnvFrom) > 0 {
		return fmt.Errorf("%w: container %q uses envFrom, which Allowed cannot keep from being overridden", errEnv, c.Name)
	}
	seen := map[string]bool{}
	for _, e := range env {
		if e.ContainerName != "" && e.ContainerName != c.Name {
			return fmt.Errorf("%w: %s: container %q: airlock runs the template's first container (%q) only", errEnv, e.Name, e.ContainerName, c.Name)
		}
		if errs := validation.IsEnvVarName(e.Name); len(errs) > 0 {
			return fmt.Errorf("%w: %q: %s", errEnv, e.Name, strings.Join(errs, "; "))
		}
		if strings.IndexByte(e.Value, 0) >= 0 {
			return fmt.Errorf("%w: %s: a value holds a NUL byte", errEnv, e.Name)
		}
		if seen[e.Name] {
			return fmt.Errorf("%w: %s is given twice", errEnv, e.Name)
		}
		seen[e.Name] = true
		i := envIndex(c.Env, e.Name)
		switch {
		case i < 0:
			c.Env = append(c.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
		case policy == extv1.EnvVarsInjectionPolicyOverrides:
			c.Env[i] = corev1.EnvVar{Name: e.Name, Value: e.Value}
		default:
			return fmt.Errorf("%w: %s is the template's, and its envVarsInjectionPolicy is Allowed, not Overrides", errEnv, e.Name)
		}
	}
	return nil
}

func envIndex(env []corev1.EnvVar, name string) int {
	for i := range env {
		if env[i].Name == name {
			return i
		}
	}
	return -1
}

// allowedLabelDomain is the domain of the labels a claim may add
// (upstream's default allowlist).
const allowedLabelDomain = "sandbox.users.io"

// systemDomains are the annotation domains a claim may not set: they
// carry the cluster's and this controller's own meaning (an
// airlock.dev/network-allow of a claim's would widen the template's
// egress).
var systemDomains = []string{"kubernetes.io", "k8s.io", "x-k8s.io", "airlock.dev"}

func inDomain(domain, d string) bool {
	return domain == d || strings.HasSuffix(domain, "."+d)
}

// mergePodMetadata merges a claim's additionalPodMetadata into the
// template's pod metadata; a key the template sets to another value is
// refused, as upstream does.
func mergePodMetadata(into, add *sandboxv1.PodMetadata) error {
	check := func(key string, label bool) error {
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return fmt.Errorf("%w: %q: %s", errMetadata, key, strings.Join(errs, "; "))
		}
		domain, _, found := strings.Cut(key, "/")
		domain = strings.ToLower(domain)
		if label {
			if !found || !inDomain(domain, allowedLabelDomain) {
				return fmt.Errorf("%w: label %q: a claim's labels are of the domain %s", errMetadata, key, allowedLabelDomain)
			}
			return nil
		}
		for _, d := range systemDomains {
			if found && inDomain(domain, d) {
				return fmt.Errorf("%w: annotation %q: the domain %s is the system's", errMetadata, key, d)
			}
		}
		return nil
	}
	for k, v := range add.Labels {
		if err := check(k, true); err != nil {
			return err
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("%w: label %q: %s", errMetadata, k, strings.Join(errs, "; "))
		}
		if tv, ok := into.Labels[k]; ok && tv != v {
			return fmt.Errorf("%w: label %q is the template's (%q)", errMetadata, k, tv)
		}
	}
	for k, v := range add.Annotations {
		if err := check(k, false); err != nil {
			return err
		}
		if tv, ok := into.Annotations[k]; ok && tv != v {
			return fmt.Errorf("%w: annotation %q is the template's (%q)", errMetadata, k, tv)
		}
	}
	if len(add.Labels) > 0 {
		if into.Labels == nil {
			into.Labels = map[string]string{}
		}
		maps.Copy(into.Labels, add.Labels)
	}
	if len(add.Annotations) > 0 {
		if into.Annotations == nil {
			into.Annotations = map[string]string{}
		}
		maps.Copy(into.Annotations, add.Annotations)
	}
	return nil
}

// claimExpiry is when a claim expires (upstream's rule: its shutdownTime,
// or ttlSecondsAfterFinished after its Finished=True condition, whichever
// is first), and whether it has.
func claimExpiry(claim *extv1.SandboxClaim, now time.Time) (at time.Time, expired bool) {
	lc := claim.Spec.Lifecycle
	if lc == nil {
		return time.Time{}, false
	}
	if lc.ShutdownTime != nil {
		at = lc.ShutdownTime.Time
	}
	if lc.TTLSecondsAfterFinished != nil {
		if c := meta.FindStatusCondition(claim.Status.Conditions, string(sandboxv1.SandboxConditionFinished)); c != nil && c.Status == metav1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			t := c.LastTransitionTime.Add(time.Duration(*lc.TTLSecondsAfterFinished) * time.Second)
			if at.IsZero() || t.Before(at) {
				at = t
			}
		}
	}
	if at.IsZero() {
		return at, false
	}
	return at, !now.Before(at)
}
