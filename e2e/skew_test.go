package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 13: cluster-b's clocks run 90 s behind cluster-a's, as
// cluster-a sees them: cluster-a reads cluster-b through a view that
// shifts every Node's last-seen 90 s back (the input is faked, no clock
// is). By Kilo's rule against cluster-a's clock every cluster-b node would
// be stale at once; meshlet judges a remote node by when its last-seen
// changes arrive, so the mesh stays up, the skew is a metric and a
// warning, and a cluster-b node that really stops drops out after Kilo's
// 60 s window.
func TestRemoteClockBehind(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(1, "z", "w")))
	a, b := env.Cluster("cluster-a"), env.Cluster("cluster-b")
	x1, z1, w1 := env.Node("a-x1"), env.Node("b-z1"), env.Node("b-w1")
	for _, n := range []*harness.Node{z1, w1} {
		_, err := x1.WaitReachable(ctx, n.PodIP, 30*time.Second)
		must(t, err)
	}
	kc, err := b.SkewedView(ctx, -90*time.Second)
	must(t, err)
	switched := time.Now()
	must(t, a.SetKubeconfigSecret(ctx, "cluster-b", kc))
	var skew float64
	must(t, harness.Poll(ctx, 60*time.Second, 200*time.Millisecond, "a-x1 seeing cluster-b 90 s behind", func() (bool, error) {
		m, err := x1.Metrics(ctx)
		if err != nil {
			return false, err
		}
		skew, _ = m.Value("meshlet_remote_cluster_clock_skew_seconds", "cluster", "cluster-b")
		return skew < -85, nil
	}))
	ping, err := x1.StartPinger(ctx, z1.PodIP, 200*time.Millisecond)
	must(t, err)
	zKey, err := z1.PublicKey(ctx)
	must(t, err)
	wKey, err := w1.PublicKey(ctx)
	must(t, err)
	dp := harness.WatchDataPlane(ctx, 200*time.Millisecond, x1)

	// b-w1 really stops; b-z1 keeps running, 90 s behind.
	off := time.Now()
	w1.PowerOff()
	var dropped time.Time
	must(t, harness.Poll(ctx, 120*time.Second, 200*time.Millisecond, "a-x1 dropping the stopped b-w1", func() (bool, error) {
		d, err := x1.Device()
		if err != nil || d == nil {
			return false, err
		}
		if _, ok := d.Peers[wKey]; !ok && dropped.IsZero() {
			dropped = time.Now()
		}
		// And keep watching beyond Kilo's window since the switch.
		return !dropped.IsZero() && time.Since(switched) > 75*time.Second, nil
	}))
	tl := ping.Stop()
	res := dp.Stop(func(node, item string) bool {
		return item == "peer "+wKey || strings.Contains(item, w1.PodCIDR.String()) || strings.Contains(item, w1.IP.Addr().String())
	})
	d, err := x1.Device()
	must(t, err)
	if _, ok := d.Peers[zKey]; !ok {
		t.Error("a-x1 dropped b-z1, which runs (90 s behind)")
	}
	log, err := os.ReadFile(x1.LogPath)
	must(t, err)
	warned := strings.Contains(string(log), "remote cluster's clock is off this node's")
	report(t, "cluster-b seen 90 s behind (meshlet_remote_cluster_clock_skew_seconds %.0f, warning logged %v): a-x1 → b-z1 pinged for %v after the switch, %d of %d lost, %d data plane items removed besides b-w1's; b-w1 powered off: dropped by a-x1 after %v (Kilo's window: 60 s after its last last-seen change)",
		skew, warned, time.Since(switched).Round(time.Second), tl.Lost, tl.Sent, len(res.Removed), dropped.Sub(off).Round(100*time.Millisecond))
	if len(res.Removed) > 0 {
		t.Errorf("removed from the data plane: %s", strings.Join(res.Removed, "; "))
	}
	if tl.Lost > 2 {
		t.Errorf("%d pings lost to a cluster 90 s behind", tl.Lost)
	}
	if !warned {
		t.Error("no warning about cluster-b's clock in a-x1's log")
	}
	if late := dropped.Sub(off); late > 70*time.Second {
		t.Errorf("the stopped b-w1 dropped out %v after it stopped; want at most Kilo's 60 s", late)
	}
}
