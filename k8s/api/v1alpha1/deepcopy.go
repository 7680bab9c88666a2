package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies s into out.
func (s *AirlockNodeSpec) DeepCopyInto(out *AirlockNodeSpec) {
	*out = *s
	if s.CABundle != nil {
		out.CABundle = append([]byte(nil), s.CABundle...)
	}
	if s.RuntimeClasses != nil {
		out.RuntimeClasses = append([]string(nil), s.RuntimeClasses...)
	}
}

// DeepCopyInto copies s into out.
func (s *AirlockNodeStatus) DeepCopyInto(out *AirlockNodeStatus) {
	*out = *s
	if s.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(s.Conditions))
		for i := range s.Conditions {
			s.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
	if s.Pools != nil {
		out.Pools = append([]NodePool(nil), s.Pools...)
	}
	if s.AuditHead != nil {
		h := *s.AuditHead
		s.AuditHead.ObservedAt.DeepCopyInto(&h.ObservedAt)
		out.AuditHead = &h
	}
	if s.LastHeartbeatTime != nil {
		out.LastHeartbeatTime = s.LastHeartbeatTime.DeepCopy()
	}
}

// DeepCopyInto copies n into out.
func (n *AirlockNode) DeepCopyInto(out *AirlockNode) {
	*out = *n
	out.TypeMeta = n.TypeMeta
	n.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	n.Spec.DeepCopyInto(&out.Spec)
	n.Status.DeepCopyInto(&out.Status)
}

// DeepCopy copies n.
func (n *AirlockNode) DeepCopy() *AirlockNode {
	if n == nil {
		return nil
	}
	out := new(AirlockNode)
	n.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies n.
func (n *AirlockNode) DeepCopyObject() runtime.Object { return n.DeepCopy() }

// DeepCopyInto copies l into out.
func (l *AirlockNodeList) DeepCopyInto(out *AirlockNodeList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]AirlockNode, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy copies l.
func (l *AirlockNodeList) DeepCopy() *AirlockNodeList {
	if l == nil {
		return nil
	}
	out := new(AirlockNodeList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies l.
func (l *AirlockNodeList) DeepCopyObject() runtime.Object { return l.DeepCopy() }

// DeepCopy copies s.
func (s *AirlockNodeSpec) DeepCopy() *AirlockNodeSpec {
	if s == nil {
		return nil
	}
	out := new(AirlockNodeSpec)
	s.DeepCopyInto(out)
	return out
}
