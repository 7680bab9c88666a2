// Package v1alpha1 is airlock's own Kubernetes kind, AirlockNode (group
// airlock.dev, cluster-scoped): one `airlock serve` daemon the controller
// places sandboxes on. airlock-node writes its spec; the controller writes
// its status. The CRD is k8s/config/crd/airlock.dev_airlocknodes.yaml.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is airlock.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "airlock.dev", Version: "v1alpha1"}

// AddToScheme registers AirlockNode and AirlockNodeList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &AirlockNode{}, &AirlockNodeList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// The Ready condition of an AirlockNode and its reasons.
const (
	ConditionReady = "Ready"

	ReasonDaemonReady       = "DaemonReady"
	ReasonDaemonUnreachable = "DaemonUnreachable"
	ReasonNodeLost          = "NodeLost"
	ReasonFencing           = "Fencing"
)

// DefaultRuntimeClass is the class a node serves when its spec names none.
const DefaultRuntimeClass = "airlock"

// SecretKeyRef names one key of a Secret.
type SecretKeyRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

// AirlockNodeSpec says how to reach a daemon and what it serves.
type AirlockNodeSpec struct {
	// Endpoint is unix:///path or https://host:port.
	Endpoint string `json:"endpoint"`
	// CABundle is the PEM of the CA that signed the daemon's certificate
	// (https only).
	CABundle []byte `json:"caBundle,omitempty"`
	// AdminKeySecretRef names the Secret key holding the daemon's admin key.
	AdminKeySecretRef SecretKeyRef `json:"adminKeySecretRef"`
	// RuntimeClasses are the runtimeClassNames the node serves (default
	// [airlock]).
	RuntimeClasses []string `json:"runtimeClasses,omitempty"`
	// Unschedulable keeps new sandboxes off the node (cordon).
	Unschedulable bool `json:"unschedulable,omitempty"`
}

// Resources are amounts of a node's capacity.
type Resources struct {
	CPUs        string `json:"cpus,omitempty"` // a decimal, e.g. "1.5"
	MemoryBytes int64  `json:"memoryBytes,omitempty"`
	Sandboxes   int    `json:"sandboxes,omitempty"`
}

// NodePool is one daemon pool on the node.
type NodePool struct {
	Tenant  string `json:"tenant"`
	Name    string `json:"name"`
	Size    int    `json:"size"`
	Ready   int    `json:"ready"`
	Filling int    `json:"filling,omitempty"`
}

// DaemonInfo identifies the running daemon.
type DaemonInfo struct {
	Version string `json:"version,omitempty"`
	BootID  string `json:"bootID,omitempty"`
}

// AuditHead anchors the daemon's audit chain in etcd.
type AuditHead struct {
	Seq        int64       `json:"seq"`
	Hash       string      `json:"hash"`
	ObservedAt metav1.Time `json:"observedAt"`
}

// AirlockNodeStatus is what the controller last saw of the daemon.
type AirlockNodeStatus struct {
	Conditions        []metav1.Condition `json:"conditions,omitempty"`
	Capacity          Resources          `json:"capacity,omitempty"`
	Allocated         Resources          `json:"allocated,omitempty"`
	Pools             []NodePool         `json:"pools,omitempty"`
	Daemon            DaemonInfo         `json:"daemon,omitempty"`
	AuditHead         *AuditHead         `json:"auditHead,omitempty"`
	LastHeartbeatTime *metav1.Time       `json:"lastHeartbeatTime,omitempty"`
}

// AirlockNode is one airlock daemon of the cluster.
type AirlockNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AirlockNodeSpec   `json:"spec"`
	Status AirlockNodeStatus `json:"status,omitempty"`
}

// AirlockNodeList is a list of AirlockNodes.
type AirlockNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AirlockNode `json:"items"`
}

// Classes is the node's runtime classes, the default when none are named.
func (s *AirlockNodeSpec) Classes() []string {
	if len(s.RuntimeClasses) == 0 {
		return []string{DefaultRuntimeClass}
	}
	return s.RuntimeClasses
}
