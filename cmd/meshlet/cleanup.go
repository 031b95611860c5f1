package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/spf13/cobra"

	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
	"github.com/meshlet/meshlet/xtables"
)

// newCleanupCmd is `meshlet cleanup`: it removes what meshlet installed —
// its routes and rules (by protocol number), its iptables chains, the
// interface, and the userspace device process if meshlet started one. It is
// for uninstall; a normal shutdown leaves everything in place.
func newCleanupCmd() *cobra.Command {
	var iface, iptBackend, kubeconfig, name string
	var keepIface bool
	c := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove meshlet's interface, routes, rules, chains and annotations (uninstall; the way back to kg)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := runCleanup(c.Context(), c.OutOrStdout(), iface, keepIface, iptBackend); err != nil {
				return err
			}
			return unpublish(c, kubeconfig, name)
		},
	}
	c.Flags().StringVar(&iface, "interface", "kilo0", "WireGuard interface to delete")
	c.Flags().BoolVar(&keepIface, "keep-interface", false, "keep the interface (only remove routes, rules and chains)")
	c.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig to remove this node's annotations with (default: $KUBECONFIG, else in-cluster; none: annotations are left)")
	c.Flags().StringVar(&name, "hostname", "", "this node's name (default: $NODE_NAME, else the host name)")
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

// unpublish removes this node's meshlet annotations (version, marks, and
// what kg also writes) when the API can be reached, so a node given back to
// kg carries nothing of meshlet's.
func unpublish(c *cobra.Command, kubeconfig, name string) error {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		fmt.Fprintln(c.OutOrStdout(), "meshlet: no API access ("+err.Error()+"): this node's annotations are left; remove them with --kubeconfig")
		return nil
	}
	node, err := hostname(name)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context(), 15*time.Second)
	defer cancel()
	if err := cluster.Unpublish(ctx, client, node, false); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	fmt.Fprintln(c.OutOrStdout(), "meshlet: removed node "+node+"'s annotations")
	return nil
}
