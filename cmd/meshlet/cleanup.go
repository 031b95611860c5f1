package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
	"github.com/meshlet/meshlet/xtables"
)

// newCleanupCmd is `meshlet cleanup`: it removes what meshlet installed —
// its routes and rules (by protocol number), its iptables chains, the
// interface, and the userspace device process if meshlet started one. It is
// for uninstall; a normal shutdown leaves everything in place.
func newCleanupCmd() *cobra.Command {
	var iface, iptBackend string
	var keepIface bool
	c := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove meshlet's interface, routes, rules and iptables chains (uninstall)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runCleanup(c.Context(), c.OutOrStdout(), iface, keepIface, iptBackend)
		},
	}
	c.Flags().StringVar(&iface, "interface", "kilo0", "WireGuard interface to delete")
	c.Flags().BoolVar(&keepIface, "keep-interface", false, "keep the interface (only remove routes, rules and chains)")
	registerIptablesBackend(c.Flags(), &iptBackend)
	return c
}

func runCleanup(ctx context.Context, out io.Writer, iface string, keepIface bool, iptBackend string) error {
	if _, err := xtables.Select(ctx, iptBackend, xtables.DefaultDir, xtables.Exec, newLogger("info")); err != nil {
		return err
	}
	host, err := netlinkx.New(netlinkx.Options{Logger: newLogger("info")})
	if err != nil {
		return err
	}
	defer host.Close()
	if err := host.Cleanup(ctx, netlinkx.CleanupOptions{Interface: iface, DeleteInterface: !keepIface}); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	if !keepIface {
		if err := wg.StopSpawned(iface); err != nil {
			return fmt.Errorf("stopping the userspace device: %w", err)
		}
	}
	what := "routes, rules and iptables chains"
	if !keepIface {
		what += " and " + iface
	}
	fmt.Fprintln(out, "meshlet: removed "+what)
	return nil
}
