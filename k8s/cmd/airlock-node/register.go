package main

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

var nodesGVR = schema.GroupVersionResource{Group: "airlock.dev", Version: "v1alpha1", Resource: "airlocknodes"}

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

func (o *registration) validate() error {
	if !nodeNameRE.MatchString(o.Name) {
		return fmt.Errorf("--name %q: want a DNS-1123 subdomain (lowercase letters, digits, '-', '.')", o.Name)
	}
	if o.AdminKey == "" {
		return errors.New("the admin key file is empty")
	}
	if len(o.RuntimeClasses) == 0 {
		return errors.New("--runtime-classes: name at least one")
	}
	switch {
	case strings.HasPrefix(o.Endpoint, "unix:///"):
		if len(o.CABundle) > 0 {
			return errors.New("--ca-file goes with an https:// endpoint")
		}
	case strings.HasPrefix(o.Endpoint, "https://"):
		if u, err := url.Parse(o.Endpoint); err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("--endpoint %q: want https://host:port", o.Endpoint)
		}
		if len(o.CABundle) > 0 {
			if b, _ := pem.Decode(o.CABundle); b == nil || b.Type != "CERTIFICATE" {
				return errors.New("--ca-file: no PEM certificate")
			} else if _, err := x509.ParseCertificate(b.Bytes); err != nil {
				return fmt.Errorf("--ca-file: %w", err)
			}
		}
	default:
		return fmt.Errorf("--endpoint %q: want unix:///path or https://host:port", o.Endpoint)
	}
	return nil
}

func (o *registration) secretName() string { return "airlock-node-" + o.Name }

// spec is the part of the AirlockNode this command owns; anything else in
// it (unschedulable, set by an operator) it leaves alone.
func (o *registration) spec() map[string]any {
	s := map[string]any{
		"endpoint": o.Endpoint,
		"adminKeySecretRef": map[string]any{
			"namespace": o.Namespace,
			"name":      o.secretName(),
			"key":       adminKeyField,
		},
	}
	classes := make([]any, len(o.RuntimeClasses))
	for i, c := range o.RuntimeClasses {
		classes[i] = c
	}
	s["runtimeClasses"] = classes
	if len(o.CABundle) > 0 {
		s["caBundle"] = base64.StdEncoding.EncodeToString(o.CABundle)
	}
	return s
}

// apply makes the AirlockNode and its admin-key Secret match o, writing
// only what differs. The Secret is owned by the AirlockNode, so deleting
// the node deletes its key.
func (o *registration) apply(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface) error {
	nodes := dyn.Resource(nodesGVR)
	node, err := nodes.Get(ctx, o.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "airlock.dev/v1alpha1",
			"kind":       "AirlockNode",
			"metadata":   map[string]any{"name": o.Name},
			"spec":       o.spec(),
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
		want := o.spec()
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
		APIVersion: "airlock.dev/v1alpha1",
		Kind:       "AirlockNode",
		Name:       node.GetName(),
		UID:        node.GetUID(),
	}
	secrets := kube.CoreV1().Secrets(o.Namespace)
	sec, err := secrets.Get(ctx, o.secretName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:            o.secretName(),
				Namespace:       o.Namespace,
				Labels:          map[string]string{"app.kubernetes.io/managed-by": "airlock-node"},
				OwnerReferences: []metav1.OwnerReference{owner},
			},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{adminKeyField: []byte(o.AdminKey)},
		}
		if _, err := secrets.Create(ctx, sec, metav1.CreateOptions{FieldManager: "airlock-node"}); err != nil {
			return fmt.Errorf("create secret %s/%s: %w", o.Namespace, o.secretName(), err)
		}
	case err != nil:
		return fmt.Errorf("get secret %s/%s: %w", o.Namespace, o.secretName(), err)
	default:
		if string(sec.Data[adminKeyField]) == o.AdminKey && reflect.DeepEqual(sec.OwnerReferences, []metav1.OwnerReference{owner}) {
			return nil
		}
		sec.Data = map[string][]byte{adminKeyField: []byte(o.AdminKey)}
		sec.OwnerReferences = []metav1.OwnerReference{owner}
		if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{FieldManager: "airlock-node"}); err != nil {
			return fmt.Errorf("update secret %s/%s: %w", o.Namespace, o.secretName(), err)
		}
	}
	return nil
}
