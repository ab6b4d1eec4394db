package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/kit"
)

// printProxmoxKit writes kit.VendorData to out, for VMs that power off
// when their job ends, as every claim's VM does (internal/vmspec). The
// operator cannot place it itself (Proxmox's API writes no snippets), so
// the platform team copies what this prints onto a storage with snippets
// content and names it in spec.cloudInit.proxmox.vendorSnippet
// (docs/cloud-init.md, "Delivery").
func printProxmoxKit(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("proxmox-kit", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	_, err := out.Write(kit.VendorData(true))
	return err
}
