package blueprint

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/airlock-sandbox/airlock/api"
)

func ptr[T any](v T) *T { return &v }

func pod(class string, c corev1.Container, edit func(*corev1.PodSpec)) sandboxv1.PodTemplate {
	pt := sandboxv1.PodTemplate{Spec: corev1.PodSpec{RuntimeClassName: ptr(class), Containers: []corev1.Container{c}}}
	if edit != nil {
		edit(&pt.Spec)
	}
	return pt
}

func TestMapping(t *testing.T) {
	limits := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("1500m"),
		corev1.ResourceMemory:           resource.MustParse("1Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("2Gi"),
	}
	for _, tc := range []struct {
		name string
		pt   sandboxv1.PodTemplate
		want api.CreateSandbox
	}{
		{"defaults", pod("airlock", corev1.Container{Name: "main"}, nil),
			api.CreateSandbox{Isolation: "container", Image: "host", Limits: api.Limits{CPUs: 0.25, MemoryBytes: 256 << 20}}},
		{"full", pod("airlock-gvisor", corev1.Container{
			Name: "main", Image: "python:3.12", Env: []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B"}},
			Resources: corev1.ResourceRequirements{Limits: limits, Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
			Ports:     []corev1.ContainerPort{{ContainerPort: 8080}},
		}, func(ps *corev1.PodSpec) { ps.Hostname = "box"; ps.RestartPolicy = corev1.RestartPolicyNever }),
			api.CreateSandbox{Isolation: "gvisor", Image: "python:3.12", Hostname: "box", Env: map[string]string{"A": "1", "B": ""},
				Limits: api.Limits{CPUs: 1.5, MemoryBytes: 1 << 30, DiskBytes: 2 << 30}}},
		{"host image", pod("airlock", corev1.Container{Image: "host"}, nil),
			api.CreateSandbox{Isolation: "container", Image: "host", Limits: api.Limits{CPUs: 0.25, MemoryBytes: 256 << 20}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ForPodTemplate(&tc.pt)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b.Create, tc.want) {
				t.Fatalf("create body\n got %+v\nwant %+v", b.Create, tc.want)
			}
			if b.CPUs() != tc.want.Limits.CPUs || b.MemoryBytes() != tc.want.Limits.MemoryBytes {
				t.Fatalf("request %v/%v, want the limits", b.CPUs(), b.MemoryBytes())
			}
		})
	}
}

func TestNetworkAnnotation(t *testing.T) {
	pt := pod("airlock", corev1.Container{}, nil)
	pt.ObjectMeta.Annotations = map[string]string{AnnotationNetworkAllow: " pypi.org, ,files.pythonhosted.org "}
	b, err := ForPodTemplate(&pt)
	if err != nil {
		t.Fatal(err)
	}
	want := api.Network{Mode: "proxy", Allow: []string{"pypi.org", "files.pythonhosted.org"}}
	if !reflect.DeepEqual(b.Create.Network, want) {
		t.Fatalf("network %+v, want %+v", b.Create.Network, want)
	}
	pt.ObjectMeta.Annotations[AnnotationNetworkAllow] = " , "
	if _, err := ForPodTemplate(&pt); err == nil || !strings.Contains(err.Error(), "names no host") {
		t.Fatalf("an empty allow-list: %v", err)
	}
}

func TestUnsupported(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pt    sandboxv1.PodTemplate
		field string
	}{
		{"volumes", pod("airlock", corev1.Container{}, func(ps *corev1.PodSpec) { ps.Volumes = []corev1.Volume{{Name: "v"}} }), "spec.podTemplate.spec.volumes"},
		{"two containers", pod("airlock", corev1.Container{}, func(ps *corev1.PodSpec) { ps.Containers = append(ps.Containers, corev1.Container{}) }), "spec.podTemplate.spec.containers"},
		{"no container", pod("airlock", corev1.Container{}, func(ps *corev1.PodSpec) { ps.Containers = nil }), "spec.podTemplate.spec.containers"},
		{"init", pod("airlock", corev1.Container{}, func(ps *corev1.PodSpec) { ps.InitContainers = []corev1.Container{{}} }), "spec.podTemplate.spec.initContainers"},
		{"service account", pod("airlock", corev1.Container{}, func(ps *corev1.PodSpec) { ps.ServiceAccountName = "x" }), "spec.podTemplate.spec.serviceAccountName"},
		{"host network", pod("airlock", corev1.Container{}, func(ps *corev1.PodSpec) { ps.HostNetwork = true }), "spec.podTemplate.spec.hostNetwork"},
		{"probe", pod("airlock", corev1.Container{ReadinessProbe: &corev1.Probe{}}, nil), "spec.podTemplate.spec.containers[0].readinessProbe"},
		{"command", pod("airlock", corev1.Container{Command: []string{"sleep"}}, nil), "spec.podTemplate.spec.containers[0].command"},
		{"privileged", pod("airlock", corev1.Container{SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)}}, nil), "spec.podTemplate.spec.containers[0].securityContext"},
		{"valueFrom", pod("airlock", corev1.Container{Env: []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "S", ValueFrom: &corev1.EnvVarSource{}}}}, nil), "spec.podTemplate.spec.containers[0].env[1].valueFrom"},
		{"gpu", pod("airlock", corev1.Container{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}, nil), "spec.podTemplate.spec.containers[0].resources.limits[nvidia.com/gpu]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ForPodTemplate(&tc.pt)
			u, ok := err.(*Unsupported)
			if !ok {
				t.Fatalf("got %v, want *Unsupported", err)
			}
			found := false
			for _, f := range u.Fields {
				found = found || f.Path == tc.field
			}
			if !found {
				t.Fatalf("%v does not name %s", err, tc.field)
			}
		})
	}
}

func TestSandboxAndTemplateFields(t *testing.T) {
	s := &sandboxv1.Sandbox{}
	s.Spec.PodTemplate = pod("airlock", corev1.Container{}, nil)
	s.Spec.VolumeClaimTemplates = []sandboxv1.PersistentVolumeClaimTemplate{{}}
	if _, err := ForSandbox(s); err == nil || !strings.Contains(err.Error(), "spec.volumeClaimTemplates") {
		t.Fatalf("volumeClaimTemplates: %v", err)
	}
	tmpl := &extv1.SandboxTemplate{}
	tmpl.Spec.PodTemplate = pod("airlock", corev1.Container{}, nil)
	tmpl.Spec.NetworkPolicy = &extv1.NetworkPolicySpec{}
	if _, err := ForTemplate(tmpl); err == nil || !strings.Contains(err.Error(), "spec.networkPolicy") {
		t.Fatalf("managed networkPolicy: %v", err)
	}
	tmpl.Spec.NetworkPolicyManagement = extv1.NetworkPolicyManagementUnmanaged
	if _, err := ForTemplate(tmpl); err != nil {
		t.Fatalf("unmanaged networkPolicy: %v", err)
	}
}

// TestEveryFieldIsClassified: a PodSpec or Container field that a new
// Kubernetes release adds must be classed (mapped, ignored or refused) in
// podSpecFields/containerFields, so that none is silently ignored; and
// every field classed refused is refused when set.
func TestEveryFieldIsClassified(t *testing.T) {
	for _, tc := range []struct {
		typ   reflect.Type
		table map[string]disposition
	}{
		{reflect.TypeOf(corev1.PodSpec{}), podSpecFields},
		{reflect.TypeOf(corev1.Container{}), containerFields},
	} {
		seen := map[string]bool{}
		for i := 0; i < tc.typ.NumField(); i++ {
			name := jsonName(tc.typ.Field(i))
			seen[name] = true
			d, ok := tc.table[name]
			if !ok {
				t.Errorf("%s.%s is neither mapped, ignored nor refused", tc.typ.Name(), name)
				continue
			}
			if d != refuse {
				continue
			}
			// set the field to a non-zero value and expect it named.
			v := reflect.New(tc.typ).Elem()
			setNonZero(t, v.Field(i))
			got := refused(v, "x", tc.table)
			if len(got) != 1 || got[0].Path != "x."+name {
				t.Errorf("%s.%s set: refused %v", tc.typ.Name(), name, got)
			}
		}
		for name := range tc.table {
			if !seen[name] {
				t.Errorf("%s has no field %s (stale entry)", tc.typ.Name(), name)
			}
		}
	}
}

func setNonZero(t *testing.T, f reflect.Value) {
	switch f.Kind() {
	case reflect.Pointer:
		f.Set(reflect.New(f.Type().Elem()))
	case reflect.Slice:
		f.Set(reflect.MakeSlice(f.Type(), 1, 1))
	case reflect.Map:
		f.Set(reflect.MakeMap(f.Type()))
		f.SetMapIndex(reflect.New(f.Type().Key()).Elem(), reflect.New(f.Type().Elem()).Elem())
	case reflect.String:
		f.SetString("x")
	case reflect.Bool:
		f.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		f.SetInt(1)
	default:
		t.Fatalf("cannot set a %s", f.Kind())
	}
}

func TestHash(t *testing.T) {
	a := pod("airlock", corev1.Container{Image: "x"}, nil)
	b := pod("airlock", corev1.Container{Image: "y"}, nil)
	ba, _ := ForPodTemplate(&a)
	ba2, _ := ForPodTemplate(&a)
	bb, _ := ForPodTemplate(&b)
	if ba.Hash != ba2.Hash || ba.Hash == bb.Hash || len(ba.Hash) != 64 {
		t.Fatalf("hashes %s %s %s", ba.Hash, ba2.Hash, bb.Hash)
	}
	g := pod("airlock-gvisor", corev1.Container{Image: "x"}, nil)
	bg, _ := ForPodTemplate(&g)
	if bg.Hash == ba.Hash {
		t.Fatal("the class is not in the hash")
	}
}

func TestTTL(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		at      *metav1.Time
		ttl     string
		expired bool
	}{
		{nil, "168h0m0s", false},
		{&metav1.Time{Time: now.Add(90 * time.Second)}, "1m30s", false},
		{&metav1.Time{Time: now.Add(400 * time.Hour)}, "168h0m0s", false},
		{&metav1.Time{Time: now}, "", true},
		{&metav1.Time{Time: now.Add(-time.Hour)}, "", true},
	} {
		ttl, exp := TTL(tc.at, now)
		if ttl != tc.ttl || exp != tc.expired {
			t.Errorf("TTL(%v) = %q %v, want %q %v", tc.at, ttl, exp, tc.ttl, tc.expired)
		}
	}
}

func TestBodyCopies(t *testing.T) {
	pt := pod("airlock", corev1.Container{Env: []corev1.EnvVar{{Name: "A", Value: "1"}}}, nil)
	b, _ := ForPodTemplate(&pt)
	body := b.Body("uid-1", map[string]string{"k8s.name": "x"}, "1h")
	body.Env["A"] = "changed"
	if b.Create.Env["A"] != "1" || body.ExternalID != "uid-1" || body.TTL != "1h" {
		t.Fatalf("Body shares or loses fields: %+v %+v", b.Create, body)
	}
}
