//go:build tools

// Package tools pins the kube-apiserver and kubectl commands so that `go
// mod tidy` keeps k8s.io/kubernetes, and what kubectl needs, in this
// module's requirements.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
