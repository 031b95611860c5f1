package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// awaitReachable polls, with one ping of up to wait each, until from
// reaches dst; it returns when it first did.
func awaitReachable(t *testing.T, ctx context.Context, from *harness.Node, dst *harness.Node, timeout, wait time.Duration, what string) time.Time {
	t.Helper()
	var at time.Time
	must(t, harness.Poll(ctx, timeout, 0, what, func() (bool, error) {
		if from.Reachable(ctx, dst.PodIP, wait) {
			at = time.Now()
			return true, nil
		}
		return false, nil
	}))
	return at
}

// leaderEvents are the LeaderChanged and LeaderSteppedAside Events of a
// cluster, oldest first.
func leaderEvents(t *testing.T, ctx context.Context, c *harness.Cluster) []corev1.Event {
	t.Helper()
	l, err := c.Admin.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	must(t, err)
	var out []corev1.Event
	for _, e := range l.Items {
		if e.Reason == "LeaderChanged" || e.Reason == "LeaderSteppedAside" {
			out = append(out, e)
		}
	}
	return out
}

// marked reports whether a node carries meshlet's leader mark.
func marked(t *testing.T, ctx context.Context, n *harness.Node) bool {
	t.Helper()
	a, err := n.Cluster.Annotations(ctx, n.Name)
	must(t, err)
	return a[topology.AnnotationLeader] == topology.LeaderLeaseValue
}

// awaitMark waits until leader carries meshlet's leader mark and none of
// others does (the holder writes it once it has the Lease).
func awaitMark(t *testing.T, ctx context.Context, leader *harness.Node, others ...*harness.Node) {
	t.Helper()
	must(t, harness.Poll(ctx, 15*time.Second, 100*time.Millisecond, leader.Name+" marked as the leader", func() (bool, error) {
		if !marked(t, ctx, leader) {
			return false, fmt.Errorf("%s not marked", leader.Name)
		}
		for _, o := range others {
			if marked(t, ctx, o) {
				return false, fmt.Errorf("%s still marked", o.Name)
			}
		}
		return true, nil
	}))
}

// checkFollows checks the remote leader's device peers with the new local
// leader and not the old one.
func checkFollows(t *testing.T, ctx context.Context, remote, leader, old *harness.Node) {
	t.Helper()
	lk, err := leader.PublicKey(ctx)
	must(t, err)
	ok, err := old.PublicKey(ctx)
	must(t, err)
	must(t, harness.Poll(ctx, 10*time.Second, 100*time.Millisecond, remote.Name+" following "+leader.Name, func() (bool, error) {
		d, err := remote.Device()
		if err != nil || d == nil {
			return false, err
		}
		_, hasNew := d.Peers[lk]
		_, hasOld := d.Peers[ok]
		return hasNew && !hasOld, fmt.Errorf("peer of %s %v, of %s %v", leader.Name, hasNew, old.Name, hasOld)
	}))
}

// Scenario 8: the leader of a location loses power (meshlet and its device
// killed, underlay down). Its Lease stops being renewed; once a candidate
// has seen no renewal for the Lease's 3 s, the next node in Kilo's order
// takes it, marks itself with Kilo's leader annotation and removes the
// dead leader's mark, so every node, kgctl and the remote cluster see the
// new leader (Kilo's rule alone would wait for the 60 s last-seen window).
// The production 30 s resync: nothing depends on it.
func TestLeaderFailover(t *testing.T) {
	env, ctx := newEnv(t, func(o *harness.Options) { o.ResyncPeriod = 30 * time.Second })
	must(t, env.Build(ctx, harness.Small(2, "z")))
	x1, x2, z1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("b-z1")
	if l := leaderOf(t, ctx, x1, x2); l != x1 {
		t.Fatalf("leader %s, want a-x1 (first in Kilo's order)", l.Name)
	}
	awaitMark(t, ctx, x1, x2)
	_, err := x2.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	mon := harness.WatchLeadership(ctx, x1, x2)
	ping, err := x2.StartPinger(ctx, z1.PodIP, 100*time.Millisecond)
	must(t, err)
	must(t, harness.Poll(ctx, 10*time.Second, 50*time.Millisecond, "pings answered", func() (bool, error) {
		return ping.Replied(time.Now().Add(-time.Second)), nil
	}))

	off := time.Now()
	x1.PowerOff()
	mon.PoweredOff(x1, off)
	must(t, harness.Poll(ctx, 90*time.Second, 50*time.Millisecond, "a-x2 reaching b-z1 again", func() (bool, error) {
		return ping.Replied(off), nil
	}))
	tl := ping.Stop()
	took := tl.FirstReplyAfter(off).Sub(off)
	if l := leaderOf(t, ctx, x2); l != x2 {
		t.Fatalf("a-x2 is not leading")
	}
	awaitMark(t, ctx, x2, x1)
	checkFollows(t, ctx, z1, x2, x1)
	m, err := x2.Metrics(ctx)
	must(t, err)
	if v, _ := m.Value("meshlet_leader_changes_total", "reason", "Expired"); v != 1 {
		t.Errorf("a-x2 meshlet_leader_changes_total{reason=Expired} = %v, want 1", v)
	}
	evs := leaderEvents(t, ctx, x2.Cluster)
	found := false
	for _, e := range evs {
		found = found || e.InvolvedObject.Name == "a-x2" && e.Reason == "LeaderChanged" && strings.Contains(e.Message, "a-x1 stopped renewing")
	}
	if !found {
		t.Errorf("no LeaderChanged Event on a-x2 naming a-x1's expiry: %v", evs)
	}
	mon.Stop()
	res := mon.Result()
	report(t, "a-x1 powered off: cross-cluster ping from a-x2 (10/s) resumed %v after power-off, %d pings lost (goal < 5 s; Kilo's rule: when last-seen leaves its 60 s window); %s",
		took.Round(100*time.Millisecond), tl.Lost, res)
	must(t, res.Check())
	if took > 10*time.Second {
		t.Errorf("traffic resumed %v after the power-off; the Lease expires after 3 s", took)
	}
}
