// Command etcd is the upstream etcd server. go.etcd.io/etcd/server/v3 ships the
// server as package etcdmain but no main package (that lives in etcd's root
// module), so kallot's test control plane builds it through this wrapper.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
