//go:build tools

// Package tools pins the kube-apiserver command so that `go mod tidy` keeps
// k8s.io/kubernetes in this module's requirements.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
