//go:build tools

// Package kube pins the Kubernetes control plane the k8s module's
// real-cluster tests (k8s/e2e) run against: kube-apiserver from
// k8s.io/kubernetes and etcd from the etcd server module that release
// requires. scripts/kube.sh builds both from this module; it is a module of
// its own so that no other build in the repository builds Kubernetes. Its
// go.mod replaces every k8s.io staging module with the release of the same
// minor (k8s.io/kubernetes names them as ./staging paths, which a module
// dependency cannot resolve).
package kube

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
