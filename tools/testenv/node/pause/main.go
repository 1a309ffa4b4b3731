// Command pause is the test node's sandbox image: the process that holds a pod's namespaces.
// It waits for SIGTERM/SIGINT and exits 0, like registry.k8s.io/pause, so no registry is needed.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
