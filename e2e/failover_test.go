package e2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 8: the leader of a location loses power (meshlet and its device
// killed, underlay down, last-seen no longer refreshed). Once Kilo's 60 s
// Ready window passes, the next node by name takes over; cross-cluster
// traffic from the location resumes, within about a second of that moment
// (meshlet re-plans when a last-seen ages out, not at the next resync).
func TestLeaderFailover(t *testing.T) {
	// The production resync period: the failover must not depend on it.
	env, ctx := newEnv(t, func(o *harness.Options) { o.ResyncPeriod = 30 * time.Second })
	must(t, env.Build(ctx, harness.Small(2, "z")))
	x1, x2, z1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("b-z1")
	if l := leaderOf(t, ctx, x1, x2); l != x1 {
		t.Fatalf("leader %s, want a-x1", l.Name)
	}
	_, err := x2.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	x1Key, err := x1.PublicKey(ctx)
	must(t, err)
	ann, err := x1.Cluster.Annotations(ctx, x1.Name)
	must(t, err)
	lastSeen, err := strconv.ParseInt(ann[topology.AnnotationLastSeen], 10, 64)
	must(t, err)

	off := time.Now()
	x1.PowerOff()
	// Kilo: a node is Ready while last-seen is under 60 s old.
	stale := time.Unix(lastSeen, 0).Add(60 * time.Second)
	var recovered time.Time
	must(t, harness.Poll(ctx, 150*time.Second, 0, "a-x2 reaching b-z1 again", func() (bool, error) {
		if x2.Reachable(ctx, z1.PodIP, time.Second) {
			recovered = time.Now()
			return true, nil
		}
		return false, nil
	}))
	if l := leaderOf(t, ctx, x2); l != x2 {
		t.Fatalf("a-x2 is not leading")
	}
	ann2, err := x2.Cluster.Annotations(ctx, x2.Name)
	must(t, err)
	if ann2[topology.AnnotationWireGuardIP] == "" {
		t.Error("a-x2 leads but publishes no wireguard-ip")
	}
	x2Key, err := x2.PublicKey(ctx)
	must(t, err)
	d, err := z1.Device()
	must(t, err)
	if _, ok := d.Peers[x2Key]; !ok {
		t.Error("b-z1 has no peer for the new leader a-x2")
	}
	if _, ok := d.Peers[x1Key]; ok {
		t.Error("b-z1 still has the dead leader a-x1 as a peer")
	}
	report(t, "a-x1 powered off; its last-seen went stale %v after power-off; cross-cluster ping from a-x2 resumed %v after power-off = %v after the node stopped being Ready",
		stale.Sub(off).Round(time.Second), recovered.Sub(off).Round(100*time.Millisecond), recovered.Sub(stale).Round(100*time.Millisecond))
	if late := recovered.Sub(stale); late > 10*time.Second {
		t.Errorf("traffic resumed %v after a-x1 stopped being Ready; want a few seconds at most (resync is 30 s)", late)
	}
}
