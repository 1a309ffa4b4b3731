//go:build tools

// Package kubelet pins the kubelet for the test node (build-node.sh): the same k8s.io/kubernetes
// version as ../../k8s, in its own module so its extra dependencies (cadvisor, the CRI client)
// never touch the control plane's go.sum and cache key.
package kubelet

import _ "k8s.io/kubernetes/cmd/kubelet"
