//go:build tools

// Package containerd pins containerd v2 (the daemon, ctr and the runc shim) for the test node
// (build-node.sh), in its own module: its dependency graph has nothing to share with k8s's pins.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
