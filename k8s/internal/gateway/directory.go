package gateway

import (
	"context"
	"fmt"
	"github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

const (
	sandboxGroup = "agents.x-k8s.io"
	// The annotations the controller puts on a Sandbox it placed.
	annotationNode      = "airlock.dev/node"
	annotationSandboxID = "airlock.dev/sandbox-id"
)

var (
	sandboxesGVR = schema.GroupVersionResource{Group: sandboxGroup, Version: "v1beta1", Resource: "sandboxes"}
	nodesGVR     = v1alpha1.GroupVersion.WithResource("airlocknodes")
)

// Sandbox is what the gateway knows of one Sandbox object.
type Sandbox struct {
	UID string
	// OwnerUIDs are the UIDs of its owners (a claim's, for a Sandbox a
	// claim made: the daemon sandbox then carries the claim's UID).
	OwnerUIDs []string
	// Node and ID are its annotations airlock.dev/node and
	// airlock.dev/sandbox-id: where the controller placed it. Anyone who
	// may edit the Sandbox may set them, so they are only a pointer: the
	// gateway checks that the daemon sandbox carries this object's UID.
	Node, ID string
}

// Node is one AirlockNode: where its daemon answers.
type Node struct {
	Name     string
	Endpoint string // unix:///path or https://host:port
	CABundle []byte // PEM, for https
}

// Directory is the gateway's view of the cluster.
type Directory interface {
	Sandbox(namespace, name string) (Sandbox, bool)
	Node(name string) (Node, bool)
	Nodes() []Node
}

// informerDirectory is a Directory over two informers: Sandboxes'
// metadata (the gateway needs only their annotations, UIDs and owners)
// and AirlockNodes.
type informerDirectory struct {
	sandboxes cache.GenericLister
	nodes     cache.GenericLister
}

// NewInformerDirectory starts watching Sandboxes and AirlockNodes and
// returns once both caches are filled (or ctx ends).
func NewInformerDirectory(ctx context.Context, cfg *rest.Config) (Directory, error) {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mf := metadatainformer.NewSharedInformerFactory(mc, 0)
	df := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	si := mf.ForResource(sandboxesGVR)
	ni := df.ForResource(nodesGVR)
	mf.Start(ctx.Done())
	df.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), si.Informer().HasSynced, ni.Informer().HasSynced) {
		return nil, fmt.Errorf("informers: %w", context.Cause(ctx))
	}
	return &informerDirectory{sandboxes: si.Lister(), nodes: ni.Lister()}, nil
}

func (d *informerDirectory) Sandbox(namespace, name string) (Sandbox, bool) {
	o, err := d.sandboxes.ByNamespace(namespace).Get(name)
	if err != nil {
		return Sandbox{}, false
	}
	m, ok := o.(*metav1.PartialObjectMetadata)
	if !ok || m.DeletionTimestamp != nil {
		return Sandbox{}, false
	}
	s := Sandbox{UID: string(m.UID), Node: m.Annotations[annotationNode], ID: m.Annotations[annotationSandboxID]}
	for _, ref := range m.OwnerReferences {
		s.OwnerUIDs = append(s.OwnerUIDs, string(ref.UID))
	}
	return s, true
}

func (d *informerDirectory) Node(name string) (Node, bool) {
	o, err := d.nodes.Get(name)
	if err != nil {
		return Node{}, false
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return Node{}, false
	}
	return nodeFrom(u)
}

func (d *informerDirectory) Nodes() []Node {
	list, _ := d.nodes.List(labels.Everything())
	var out []Node
	for _, o := range list {
		if u, ok := o.(*unstructured.Unstructured); ok {
			if n, ok := nodeFrom(u); ok {
				out = append(out, n)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// nodeFrom reads an AirlockNode's endpoint and CA.
func nodeFrom(u *unstructured.Unstructured) (Node, bool) {
	var an v1alpha1.AirlockNode
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &an); err != nil {
		return Node{}, false
	}
	if an.Spec.Endpoint == "" || an.DeletionTimestamp != nil {
		return Node{}, false
	}
	return Node{Name: an.Name, Endpoint: an.Spec.Endpoint, CABundle: an.Spec.CABundle}, true
}
