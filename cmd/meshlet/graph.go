package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshlet/meshlet/agent/core/graph"
	"github.com/meshlet/meshlet/agent/runtime/config"
)

// newGraphCmd is `meshlet graph`: the mesh as Graphviz dot, in the spirit
// of `kgctl graph` (`meshlet graph | dot -Tsvg > mesh.svg`).
func newGraphCmd() *cobra.Command {
	var src meshSource
	cfg := config.Config{Local: true}
	c := &cobra.Command{
		Use:   "graph",
		Short: "Print the mesh (clusters, locations, leaders, peers) as Graphviz dot",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return usage(fmt.Errorf("invalid flags: %w", err))
			}
			local, remotes, remoteErrs, err := src.read(c.Context(), cfg.ClusterName)
			if err != nil {
				return err
			}
			// The topology flags not given: what the nodes publish, the
			// agents' own settings (not meshlet's defaults).
			if set := publishedSettings(c.Flags(), &cfg, local.Nodes); len(set) > 0 {
				if err := cfg.Validate(); err != nil {
					return fmt.Errorf("the settings the nodes publish (%s): %w", strings.Join(set, " "), err)
				}
			}
			for name, err := range remoteErrs {
				fmt.Fprintf(c.ErrOrStderr(), "meshlet graph: remote cluster %s left out: %v\n", name, err)
			}
			snap := snapshot(local, remotes, cfg.Settings())
			plan, err := aLeader(snap)
			if err != nil {
				return err
			}
			dot, err := graph.Dot(plan, snap)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(c.OutOrStdout(), dot)
			return err
		},
	}
	src.register(c.Flags(), &cfg.Local)
	cfg.RegisterTopology(c.Flags())
	return c
}
