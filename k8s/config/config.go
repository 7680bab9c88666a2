// Package config holds airlock's Kubernetes manifests (docs/kubernetes.md)
// and decodes them, so that a test can check them against a real
// apiserver (server-side dry-run) and against the code that relies on
// them. The AirlockNode CRD lives in crd/; agent-sandbox's CRDs are
// installed from its release, never copied here.
package config

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
)

//go:embed *.yaml crd/*.yaml
var manifests embed.FS

// Objects returns every object of the manifests but the CRD, in the order
// to apply them: files by name (00-namespace.yaml first), documents in
// file order. None of them is an AirlockNode, so they may be applied
// before the CRD is established.
func Objects() ([]*unstructured.Unstructured, error) {
	return decodeAll(manifests, "*.yaml")
}

// CRDs returns airlock's own CustomResourceDefinitions (AirlockNode).
func CRDs() ([]*unstructured.Unstructured, error) {
	return decodeAll(manifests, "crd/*.yaml")
}

func decodeAll(fsys fs.FS, pattern string) ([]*unstructured.Unstructured, error) {
	names, err := fs.Glob(fsys, pattern)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for i := 0; ; i++ {
			var obj map[string]any
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
			}
			if obj == nil {
				continue // an empty document
			}
			u := &unstructured.Unstructured{Object: obj}
			if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
				return nil, fmt.Errorf("%s: document %d: no apiVersion, kind or name", name, i)
			}
			out = append(out, u)
		}
	}
	return out, nil
}
