package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshlet/meshlet/e2e/harness"
)

// TestIdleCost measures what an idle mesh costs each agent with
// production's timing (30 s resync, the Lease renewed every second, the
// health probes on): cluster-a's location x of a-x1 (leader under the
// Lease) and a-x2, cluster-b's b-z1, meshed. After a warm-up, over a
// window (MESHLET_IDLE_WINDOW, default 60 s) it reports per agent the CPU
// of the agent (the iptables it forks included) and of the other processes
// of its node (the WireGuard device), its runs and what they changed
// (docs/performance.md#idle). With MESHLET_IDLE_PROFILE=dir it also saves
// each agent's CPU profile of the window there. Figures are reported,
// never asserted; what is asserted is that an idle run changes nothing.
func TestIdleCost(t *testing.T) {
	window := 60 * time.Second
	if v := os.Getenv("MESHLET_IDLE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		must(t, err)
		window = d
	}
	ctx, _, x1, x2, z1 := ledLocation(t, func(o *harness.Options) { o.ResyncPeriod = 30 * time.Second })
	_, err := x2.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	_, err = z1.WaitReachable(ctx, x1.PodIP, 30*time.Second)
	must(t, err)
	// The warm-up: first handshakes, first probes, the first last-seen
	// refreshes after the start (a measurement window, not a
	// synchronisation).
	pace(ctx, 30*time.Second)

	nodes := []*harness.Node{x1, x2, z1}
	role := map[string]string{"a-x1": "leader of 2 (Lease holder)", "a-x2": "follower", "b-z1": "leader alone"}
	type sample struct {
		agent, others time.Duration
		m             harness.Metrics
	}
	read := func(n *harness.Node) sample {
		a, o, err := n.CPU(ctx)
		must(t, err)
		m, err := n.Metrics(ctx)
		must(t, err)
		return sample{a, o, m}
	}
	profiles := os.Getenv("MESHLET_IDLE_PROFILE")
	var wg sync.WaitGroup
	if profiles != "" {
		must(t, os.MkdirAll(profiles, 0o755))
		for _, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, err := n.CPUProfile(ctx, window)
				if err == nil {
					err = os.WriteFile(filepath.Join(profiles, n.Name+".pprof"), b, 0o644)
				}
				if err != nil {
					t.Errorf("profile of %s: %v", n.Name, err)
				}
			}()
		}
	}
	before := map[string]sample{}
	start := time.Now()
	for _, n := range nodes {
		before[n.Name] = read(n)
	}
	pace(ctx, window)
	took := time.Since(start)
	wg.Wait()
	lease, renew := leaseTiming(t)
	pct := func(d time.Duration) string { return fmt.Sprintf("%.3f %%", 100*d.Seconds()/took.Seconds()) }
	for _, n := range nodes {
		b, a := before[n.Name], read(n)
		delta := func(name string, labels ...string) float64 {
			v0, _ := b.m.Value(name, labels...)
			v1, _ := a.m.Value(name, labels...)
			return v1 - v0
		}
		runs := delta("meshlet_reconciles_total")
		failed := delta("meshlet_reconciles_total", "result", "error")
		changes := delta("meshlet_dataplane_changes_total")
		patches := delta("meshlet_annotation_patches_total")
		report(t, "%s, %s: agent %s of a core + its device %s over %s; %.0f runs (%.1f a minute), %.0f failed, %.0f data-plane changes, %.0f annotation patches; Lease %v renewed every %v",
			n.Name, role[n.Name], pct(a.agent-b.agent), pct(a.others-b.others), took.Round(time.Second),
			runs, runs/took.Minutes(), failed, changes, patches, lease, renew)
		if changes != 0 || failed != 0 {
			t.Errorf("%s: an idle mesh changed the data plane %v times (%v runs failed)", n.Name, changes, failed)
		}
	}
	if profiles != "" {
		t.Logf("profiles in %s (go tool pprof -top %s %s/<node>.pprof)", profiles, os.Getenv("MESHLET_BIN"), profiles)
	}
}
