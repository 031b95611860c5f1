package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 6: a remote API outage leaves the data plane alone and flips
// meshlet_remote_cluster_ready; a deleted meshlet route and a peer removed
// with `wg` come back.
func TestFaults(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(1, "z")))
	a1, z1 := env.Node("a-x1"), env.Node("b-z1")
	b := env.Cluster("cluster-b")
	_, err := a1.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	ready := func() float64 {
		m, err := a1.Metrics(ctx)
		if err != nil {
			return -1
		}
		v, ok := m.Value("meshlet_remote_cluster_ready", "cluster", "cluster-b")
		if !ok {
			return -1
		}
		return v
	}
	if v := ready(); v != 1 {
		t.Fatalf("meshlet_remote_cluster_ready{cluster-b} = %v before the outage", v)
	}
	devBefore, err := a1.Device()
	must(t, err)
	routesBefore, err := a1.Routes(ctx)
	must(t, err)

	t.Run("remote API down 30s", func(t *testing.T) {
		stop := time.Now()
		b.Server.Stop()
		must(t, harness.Poll(ctx, 30*time.Second, 100*time.Millisecond, "remote_cluster_ready 0", func() (bool, error) {
			return ready() == 0, nil
		}))
		noticed := time.Since(stop)
		// For the rest of the 30 s, traffic flows and nothing changes.
		pings, lost := 0, 0
		for time.Since(stop) < 30*time.Second {
			r, err := a1.Ping(ctx, z1.PodIP, 5, 200*time.Millisecond, time.Second)
			must(t, err)
			pings, lost = pings+r.Sent, lost+r.Lost()
			d, err := a1.Device()
			must(t, err)
			if diff := peersDiff(devBefore, d); diff != "" {
				t.Fatalf("device changed during the outage: %s", diff)
			}
			rs, err := a1.Routes(ctx)
			must(t, err)
			if strings.Join(rs, "\n") != strings.Join(routesBefore, "\n") {
				t.Fatalf("routes changed during the outage:\n%s\nwant\n%s", strings.Join(rs, "\n"), strings.Join(routesBefore, "\n"))
			}
		}
		back := time.Now()
		b.Server.Start()
		must(t, harness.Poll(ctx, 60*time.Second, 100*time.Millisecond, "remote_cluster_ready 1", func() (bool, error) {
			return ready() == 1, nil
		}))
		report(t, "outage noticed (ready 0) after %v; %d/%d pings answered during the 30s outage, device and %d routes unchanged; ready 1 again %v after the API came back",
			noticed.Round(time.Millisecond), pings-lost, pings, len(routesBefore), time.Since(back).Round(time.Millisecond))
		if lost > 0 {
			t.Errorf("%d pings lost during the remote API outage", lost)
		}
	})

	t.Run("deleted route restored", func(t *testing.T) {
		routes, err := a1.Routes(ctx)
		must(t, err)
		var victim string
		for _, r := range routes {
			if strings.HasPrefix(r, z1.PodCIDR.String()+" ") || strings.HasPrefix(r, "10.2.") {
				victim = r
				break
			}
		}
		if victim == "" {
			t.Fatalf("no meshlet route to cluster-b on a-x1: %v", routes)
		}
		dst := strings.Fields(victim)[0]
		var took []time.Duration
		for i := 0; i < 3; i++ {
			start := time.Now()
			_, err := a1.Exec(ctx, "ip", "route", "del", dst)
			must(t, err)
			must(t, harness.Poll(ctx, 10*time.Second, 5*time.Millisecond, "route "+dst+" back", func() (bool, error) {
				rs, err := a1.Routes(ctx)
				return err == nil && contains(rs, victim), err
			}))
			took = append(took, time.Since(start))
		}
		report(t, "route %q deleted with `ip route del` 3×: restored after %v", victim, took)
		if percentile(took, 0.5) > time.Second {
			t.Errorf("route restore median %v, want ≤ 1s", percentile(took, 0.5))
		}
	})

	t.Run("removed peer restored", func(t *testing.T) {
		key, err := z1.PublicKey(ctx)
		must(t, err)
		var took []time.Duration
		for i := 0; i < 3; i++ {
			start := time.Now()
			must(t, a1.RemovePeer(key))
			must(t, harness.Poll(ctx, 30*time.Second, 5*time.Millisecond, "peer b-z1 back", func() (bool, error) {
				d, err := a1.Device()
				if err != nil || d == nil {
					return false, err
				}
				_, ok := d.Peers[key]
				return ok, nil
			}))
			took = append(took, time.Since(start))
		}
		_, err = a1.WaitReachable(ctx, z1.PodIP, 10*time.Second)
		must(t, err)
		report(t, "peer b-z1 removed behind meshlet's back (UAPI remove, as `wg set ... remove`) 3×: restored after %v (resync period %v)", took, 5*time.Second)
		if percentile(took, 0.5) > time.Second {
			t.Errorf("peer restore median %v, want ≤ 1s", percentile(took, 0.5))
		}
	})
}

// peersDiff describes how two device reads differ in configuration (not
// counters or handshakes); "" when they agree.
func peersDiff(a, b *harness.WGDevice) string {
	var d []string
	for k, p := range a.Peers {
		q, ok := b.Peers[k]
		if !ok {
			d = append(d, "removed "+k)
			continue
		}
		if strings.Join(p.AllowedIPs, ",") != strings.Join(q.AllowedIPs, ",") || p.Endpoint != q.Endpoint || p.Keepalive != q.Keepalive {
			d = append(d, fmt.Sprintf("%s: %+v → %+v", k, p, q))
		}
	}
	for k := range b.Peers {
		if _, ok := a.Peers[k]; !ok {
			d = append(d, "added "+k)
		}
	}
	return strings.Join(d, "; ")
}
