package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
	"github.com/meshlet/meshlet/xtables"
)

// runCleanup removes what meshlet installed: its routes and rules (by
// protocol number), its iptables chains, the interface, and the userspace
// device process if meshlet started one. It is for uninstall; a normal
// shutdown leaves everything in place.
func runCleanup(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	iface := fs.String("interface", "kilo0", "WireGuard interface to delete")
	keepIface := fs.Bool("keep-interface", false, "keep the interface (only remove routes, rules and chains)")
	iptBackend := registerIptablesBackend(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := xtables.Select(ctx, *iptBackend, xtables.DefaultDir, xtables.Exec, newLogger("info")); err != nil {
		return err
	}
	host, err := netlinkx.New(netlinkx.Options{Logger: newLogger("info")})
	if err != nil {
		return err
	}
	defer host.Close()
	if err := host.Cleanup(ctx, netlinkx.CleanupOptions{Interface: *iface, DeleteInterface: !*keepIface}); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	if !*keepIface {
		if err := wg.StopSpawned(*iface); err != nil {
			return fmt.Errorf("stopping the userspace device: %w", err)
		}
	}
	fmt.Println("meshlet: removed routes, rules and iptables chains" + map[bool]string{true: "", false: " and " + *iface}[*keepIface])
	return nil
}
