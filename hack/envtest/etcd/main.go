// Command etcd is etcd's server entry point, built from the
// go.etcd.io/etcd/server/v3 module so that tests run the real etcd.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
