package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 11: meshlet on a leader is killed with SIGKILL every few seconds
// for two minutes while a non-leader's pod pings a remote pod through it.
// The device lives in a process of its own and each new agent adopts it,
// renews the Lease it held at once and plans with the same result, so
// nothing is removed from the data plane and nobody else takes over.
func TestLeaderKilledRepeatedly(t *testing.T) {
	ctx, _, x1, x2, z1 := ledLocation(t)
	_, err := x2.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	mon := harness.WatchLeadership(ctx, x1, x2)
	ping := startPinging(t, ctx, x2, z1)
	dp := harness.WatchDataPlane(ctx, 100*time.Millisecond, x1, z1)

	const period = 4 * time.Second
	kills := 0
	var restarts []time.Duration
	end := time.Now().Add(2 * time.Minute)
	for time.Now().Before(end) {
		at := time.Now()
		must(t, x1.Stop(syscall.SIGKILL))
		kills++
		must(t, x1.Start(ctx))
		restarts = append(restarts, time.Since(at))
		// The rhythm of the kills, not a synchronisation.
		pace(ctx, period-time.Since(at))
	}
	tl := ping.Stop()
	res := dp.Stop(nil)
	mon.Stop()
	lead := mon.Result()
	m, err := x2.Metrics(ctx)
	must(t, err)
	took, _ := m.Value("meshlet_leader_changes_total")
	report(t, "meshlet on leader a-x1 killed (SIGKILL) %d times in 2 min, back ready in median %v / max %v each: %d of %d pings lost (longest gap %v), %d sessions re-created over %d peers (rekeys included), %d data plane items removed in %d samples, %d leader changes by a-x2; %s",
		kills, percentile(restarts, 0.5).Round(10*time.Millisecond), percentile(restarts, 1).Round(10*time.Millisecond),
		tl.Lost, tl.Sent, tl.LongestGap().Round(10*time.Millisecond), res.SessionsRecreated(), len(res.Handshakes), len(res.Removed), res.Samples, int(took), lead)
	if len(res.Removed) > 0 {
		t.Errorf("removed from the data plane: %s", strings.Join(res.Removed, "; "))
	}
	if took != 0 {
		t.Errorf("a-x2 took the Lease %v times: a restarted holder should keep it", took)
	}
	must(t, lead.Check())
}

// Scenario 12: the local API server is cut off from every agent, changes
// are made meanwhile (a Peer added, one deleted, a node added), etcd's
// history is compacted and the API server restarted, so the agents' watches
// resume from a resourceVersion that no longer exists (410 Gone) and they
// list again. Nothing is removed from the data plane during the gap (no
// Lease changes hands: no agent could see it), and every change made during
// the gap arrives after it.
func TestAPIServerRestartCompacted(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(2, "z")))
	a := env.Cluster("cluster-a")
	x1, x2, z1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("b-z1")
	if l := leaderOf(t, ctx, x1, x2); l != x1 {
		t.Fatalf("leader %s, want a-x1", l.Name)
	}
	awaitMark(t, ctx, x1, x2)
	oldKey, err := a.ApplyPeer(ctx, "p-old", "10.1.240.1/32", "")
	must(t, err)
	awaitPeer(t, ctx, x1, oldKey, true)
	_, err = x2.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	mon := harness.WatchLeadership(ctx, x1, x2)
	ping := startPinging(t, ctx, x2, z1)
	dp := harness.WatchDataPlane(ctx, 100*time.Millisecond, x1, x2, z1)
	nodes, err := a.Admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	must(t, err)
	rvBefore := nodes.ResourceVersion

	gap := time.Now()
	env.CutAPI(a)
	newKey, err := a.ApplyPeer(ctx, "p-new", "10.1.241.1/32", "")
	must(t, err)
	must(t, a.DeletePeer(ctx, "p-old"))
	// A location that sorts after x, so x keeps its WireGuard IP (Kilo
	// numbers segments in order).
	y9, err := a.AddFakeNode(ctx, harness.FakeNode{Name: "a-y9", Location: "y", Endpoint: "172.20.0.200:51820", WireGuardIP: "100.66.0.2/24"})
	must(t, err)
	rev, err := a.Server.CompactEtcd(ctx)
	must(t, err)
	a.Server.Stop()
	a.Server.Start()
	// Resuming a watch from before the gap is now refused: the agents'
	// watches get the same answer and list again.
	_, werr := a.Admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: rvBefore})
	gone := apierrors.IsResourceExpired(werr) || apierrors.IsGone(werr)
	if werr == nil {
		gone = watchExpired(ctx, a, rvBefore)
	}
	// Longer than the Lease: a candidate that cannot see the Lease never
	// takes it.
	pace(ctx, 8*time.Second-time.Since(gap))
	env.RestoreAPI(a)
	restored := time.Now()
	awaitPeer(t, ctx, x1, newKey, true)
	awaitPeer(t, ctx, x1, y9.PublicKey, true)
	awaitPeer(t, ctx, x1, oldKey, false)
	arrived := time.Since(restored)
	tl := ping.Stop()
	// p-old's peer and routes go, as asked.
	res := dp.Stop(func(node, item string) bool { return item == "peer "+oldKey || strings.Contains(item, "10.1.240.1") })
	mon.Stop()
	lead := mon.Result()
	if l := leaderOf(t, ctx, x1, x2); l != x1 {
		t.Errorf("leader %s after the gap, want a-x1 still", l.Name)
	}
	report(t, "cluster-a's API cut from every agent for %v, etcd compacted at revision %d and the API server restarted (watch from before the gap: 410 Gone %v): %d data plane items removed, %d of %d pings lost, the 3 changes made during the gap applied %v after the API came back; %s",
		restored.Sub(gap).Round(100*time.Millisecond), rev, gone, len(res.Removed), tl.Lost, tl.Sent, arrived.Round(10*time.Millisecond), lead)
	if !gone {
		t.Errorf("a watch from before the gap was not refused (%v): the scenario did not compact the history", werr)
	}
	if len(res.Removed) > 0 {
		t.Errorf("removed from the data plane: %s", strings.Join(res.Removed, "; "))
	}
	must(t, lead.Check())
}

// watchExpired reads a watch opened at rv: the API server may accept it and
// send a 410 as its first event instead of refusing it.
func watchExpired(ctx context.Context, c *harness.Cluster, rv string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, err := c.Admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == "ERROR" {
			return apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) || apierrors.IsGone(apierrors.FromObject(ev.Object))
		}
	}
	return false
}

// awaitPeer waits until key is (or is no longer) a peer of n's device.
func awaitPeer(t *testing.T, ctx context.Context, n *harness.Node, key string, present bool) {
	t.Helper()
	must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, fmt.Sprintf("%s peer %s present=%v", n.Name, key, present), func() (bool, error) {
		d, err := n.Device()
		if err != nil || d == nil {
			return false, err
		}
		_, ok := d.Peers[key]
		return ok == present, nil
	}))
}
