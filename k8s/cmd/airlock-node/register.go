package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
	"net/url"
	"reflect"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

var nodesGVR = v1alpha1.GroupVersion.WithResource("airlocknodes")

// adminKeyField is the Secret's key that holds the admin key.
const adminKeyField = "admin-key"

// registration is one daemon as the cluster should see it.
type registration struct {
	Name           string
	Endpoint       string
	CABundle       []byte
	Namespace      string
	AdminKey       string
	RuntimeClasses []string
}

// A node's name is a DNS-1123 subdomain (it names a cluster-scoped object
// and, with a prefix, a Secret).
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,229}[a-z0-9])?$`)

// validateFlags checks what the flags say; validate also what the files hold.
func (o *registration) validateFlags() error {
	if !nodeNameRE.MatchString(o.Name) {
		return fmt.Errorf("--name %q: want a DNS-1123 subdomain (lowercase letters, digits, '-', '.')", o.Name)
	}
	if len(o.RuntimeClasses) == 0 {
		return errors.New("--runtime-classes: name at least one")
	}
	switch {
	case strings.HasPrefix(o.Endpoint, "unix:///"):
	case strings.HasPrefix(o.Endpoint, "https://"):
		if u, err := url.Parse(o.Endpoint); err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("--endpoint %q: want https://host:port", o.Endpoint)
		}
	default:
		return fmt.Errorf("--endpoint %q: want unix:///path or https://host:port", o.Endpoint)
	}
	return nil
}

func (o *registration) validate() error {
	if err := o.validateFlags(); err != nil {
		return err
	}
	if o.AdminKey == "" {
		return errors.New("the admin key file is empty")
	}
	switch {
	case strings.HasPrefix(o.Endpoint, "unix:///"):
		if len(o.CABundle) > 0 {
			return errors.New("--ca-file goes with an https:// endpoint")
		}
	case len(o.CABundle) > 0:
		b, _ := pem.Decode(o.CABundle)
		if b == nil || b.Type != "CERTIFICATE" {
			return errors.New("--ca-file: no PEM certificate")
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
	}
	return nil
}

func (o *registration) secretName() string { return "airlock-node-" + o.Name }

// spec is the part of the AirlockNode this command owns, as the
// apiserver holds it; anything else in it (unschedulable, set by an
// operator) it leaves alone.
func (o *registration) spec() (map[string]any, error) {
	return runtime.DefaultUnstructuredConverter.ToUnstructured(&v1alpha1.AirlockNodeSpec{
		Endpoint: o.Endpoint,
		CABundle: o.CABundle,
		AdminKeySecretRef: v1alpha1.SecretKeyRef{
			Namespace: o.Namespace,
			Name:      o.secretName(),
			Key:       adminKeyField,
		},
		RuntimeClasses: o.RuntimeClasses,
	})
}

// apply makes the AirlockNode and its admin-key Secret match o, writing
// the node only when it differs. The Secret is owned by the AirlockNode, so deleting
// the node deletes its key.
func (o *registration) apply(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface) error {
	want, err := o.spec()
	if err != nil {
		return err
	}
	nodes := dyn.Resource(nodesGVR)
	node, err := nodes.Get(ctx, o.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "airlock.dev/v1alpha1",
			"kind":       "AirlockNode",
			"metadata":   map[string]any{"name": o.Name},
			"spec":       want,
		}}
		if node, err = nodes.Create(ctx, node, metav1.CreateOptions{FieldManager: "airlock-node"}); err != nil {
			return fmt.Errorf("create airlocknode %s: %w", o.Name, err)
		}
	case err != nil:
		return fmt.Errorf("get airlocknode %s: %w", o.Name, err)
	default:
		spec, _, _ := unstructured.NestedMap(node.Object, "spec")
		if spec == nil {
			spec = map[string]any{}
		}
		changed := false
		for k, v := range want {
			if !reflect.DeepEqual(spec[k], v) {
				spec[k], changed = v, true
			}
		}
		if _, ok := want["caBundle"]; !ok && spec["caBundle"] != nil {
			delete(spec, "caBundle")
			changed = true
		}
		if changed {
			if err := unstructured.SetNestedMap(node.Object, spec, "spec"); err != nil {
				return err
			}
			if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{FieldManager: "airlock-node"}); err != nil {
				return fmt.Errorf("update airlocknode %s: %w", o.Name, err)
			}
		}
	}
	owner := metav1.OwnerReference{
		APIVersion: v1alpha1.GroupVersion.String(),
		Kind:       "AirlockNode",
		Name:       node.GetName(),
		UID:        node.GetUID(),
	}
	// The Secret is written blind, every pass: airlock-node may create and
	// update Secrets (its own only, by admission policy) but not read them,
	// so that a node cannot read the tenant-key master beside them.
	secrets := kube.CoreV1().Secrets(o.Namespace)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:            o.secretName(),
			Namespace:       o.Namespace,
			Labels:          map[string]string{"app.kubernetes.io/managed-by": "airlock-node"},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{adminKeyField: []byte(o.AdminKey)},
	}
	_, err = secrets.Create(ctx, sec, metav1.CreateOptions{FieldManager: "airlock-node"})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{FieldManager: "airlock-node"})
	}
	if err != nil {
		return fmt.Errorf("write secret %s/%s: %w", o.Namespace, o.secretName(), err)
	}
	return nil
}
