package e2e

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// waitTimeout bounds every wait for an event: a test that waits longer has
// failed (the controller never got there), it is not a timing assertion.
const waitTimeout = 2 * time.Minute

func objMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}

// waitList watches the objects list's kind names (with opts: a namespace,
// labels) until cond holds of all of them at once; it returns them. It
// lists first, then follows the watch from that list's version, and lists
// again whenever the server ends the watch.
func waitList(t testing.TB, list client.ObjectList, what string, cond func([]client.Object) bool, opts ...client.ListOption) []client.Object {
	t.Helper()
	objs, err := waitListErr(list, cond, waitTimeout, opts...)
	if err != nil {
		t.Fatalf("waiting for %s: %v; last seen:\n%s", what, err, describe(objs))
	}
	return objs
}

func waitListErr(list client.ObjectList, cond func([]client.Object) bool, timeout time.Duration, opts ...client.ListOption) ([]client.Object, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last []client.Object
	for {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := env.c.List(ctx, l, opts...); err != nil {
			return last, err
		}
		seen := map[string]client.Object{}
		var order []string
		items, err := meta.ExtractList(l)
		if err != nil {
			return last, err
		}
		for _, it := range items {
			o := it.(client.Object)
			k := o.GetNamespace() + "/" + o.GetName()
			seen[k] = o
			order = append(order, k)
		}
		snapshot := func() []client.Object {
			out := make([]client.Object, 0, len(seen))
			for _, k := range order {
				if o, ok := seen[k]; ok {
					out = append(out, o)
				}
			}
			return out
		}
		last = snapshot()
		if cond(last) {
			return last, nil
		}
		w, err := env.c.Watch(ctx, list.DeepCopyObject().(client.ObjectList), append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: l.GetResourceVersion()}})...)
		if err != nil {
			return last, err
		}
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(client.Object)
			if !ok || ev.Type == watch.Error {
				break
			}
			k := o.GetNamespace() + "/" + o.GetName()
			switch ev.Type {
			case watch.Deleted:
				delete(seen, k)
			default:
				if _, had := seen[k]; !had {
					order = append(order, k)
				}
				seen[k] = o
			}
			last = snapshot()
			if cond(last) {
				w.Stop()
				return last, nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return last, ctx.Err()
		}
	}
}

// waitObj waits until cond holds of the object ns/name of list's kind
// (cond gets nil while there is none) and returns its last state.
func waitObj[T client.Object](t testing.TB, list client.ObjectList, ns, name, what string, cond func(T) bool) T {
	t.Helper()
	var last T
	waitList(t, list, what, func(objs []client.Object) bool {
		var zero T
		last = zero
		for _, o := range objs {
			if o.GetName() == name {
				last = o.(T)
			}
		}
		return cond(last)
	}, client.InNamespace(ns), client.MatchingFields{"metadata.name": name})
	return last
}

// condition is the condition of type typ in conds, nil without one.
func condition(conds []metav1.Condition, typ string) *metav1.Condition {
	return meta.FindStatusCondition(conds, typ)
}

func conditionIs(conds []metav1.Condition, typ string, status metav1.ConditionStatus) bool {
	c := condition(conds, typ)
	return c != nil && c.Status == status
}

// describe is one line an object: its name, node and conditions.
func describe(objs []client.Object) string {
	var b strings.Builder
	for _, o := range objs {
		fmt.Fprintf(&b, "  %s/%s node=%s", o.GetNamespace(), o.GetName(), o.GetAnnotations()["airlock.dev/node"])
		if o.GetDeletionTimestamp() != nil {
			b.WriteString(" deleting")
		}
		if v := reflect.ValueOf(o).Elem().FieldByName("Status"); v.IsValid() {
			if cs := v.FieldByName("Conditions"); cs.IsValid() {
				for _, c := range cs.Interface().([]metav1.Condition) {
					fmt.Fprintf(&b, " %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
				}
			}
			for _, f := range []string{"Replicas", "ReadyReplicas"} {
				if fv := v.FieldByName(f); fv.IsValid() {
					fmt.Fprintf(&b, " %s=%v", f, fv.Interface())
				}
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
