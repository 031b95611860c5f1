package main

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/netlinkx"
)

// cleanupKiloWhenReady removes what Kilo's kg left in iptables on this node
// (docs/migration.md: the KILO-* chains and the jumps to them),
// once, after meshlet's first successful reconcile has put its own chains
// in place, so that no packet goes un-masqueraded in between.
func cleanupKiloWhenReady(ctx context.Context, clk clock.WithTicker, ready func() bool, host *netlinkx.Host, log *slog.Logger) {
	tick := clk.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !ready() {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
	}
	rep, err := host.CleanupKilo(ctx)
	if err != nil {
		log.Warn("removing kg's leftover iptables rules", "error", err, "removed", rep.Removed)
		return
	}
	if len(rep.Removed) > 0 {
		log.Info("removed kg's leftover iptables rules", "removed", rep.Removed)
	}
}
