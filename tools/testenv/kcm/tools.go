//go:build tools

// Package kcm pins kube-controller-manager for the test control plane (build-kcm.sh). It is
// its own module so that its extra dependencies (kubelet, volume plugins) never touch the go.sum
// of ../k8s and with it the main control-plane cache key.
package kcm

import _ "k8s.io/kubernetes/cmd/kube-controller-manager"
