package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario 9: a mixed cluster. Location x runs meshlet (a-x1 leads, a-x2
// follows); location kg is one node run by kg, played by the harness's
// stand-in (harness.KgNode), which computes its configuration with Kilo's
// rules and rewrites its whole device on every change, as kg does. Both
// sides must agree on the topology (traffic flows, also from the
// non-leader), and a one-Peer change — which makes kg forget its session
// with a-x1 — must cost the meshlet↔kg link well under WireGuard's 15 s:
// a-x1 notices the half-dead session and re-establishes it. The control
// repeats the change with --repair-sessions=false.
func TestMixedClusterWithKg(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.OneCluster(2)))
	a := env.Cluster("cluster-a")
	kg, err := a.AddKgNode(ctx, "a-kg1", "kg")
	must(t, err)
	x1, x2 := env.Node("a-x1"), env.Node("a-x2")
	for _, n := range []*harness.Node{x1, x2} {
		_, err := n.WaitReachable(ctx, kg.PodIP, 30*time.Second)
		must(t, err)
	}
	must(t, kg.Err())

	laptop := func(i int) string {
		_, pub := harness.NewKeyPair()
		return fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop-%d"},
"spec":{"allowedIPs":["10.9.9.%d/32"],"publicKey":"%s","endpoint":{"dnsOrIP":{"ip":"192.0.2.%d"},"port":51820}}}`, i, i, pub, i)
	}
	// across pings a-x1's pod → kg's pod at 5/s for 20 s and makes one
	// Peer change 3 s in; it returns the pings lost and kg's rewrites.
	across := func(peer string) (harness.PingResult, int) {
		t.Helper()
		before := kg.Rewrites()
		done := make(chan harness.PingResult, 1)
		go func() {
			r, err := x1.Ping(ctx, kg.PodIP, 100, 200*time.Millisecond, time.Second)
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		pace(ctx, 3*time.Second)
		must(t, a.Apply(ctx, peer))
		must(t, harness.Poll(ctx, 10*time.Second, 20*time.Millisecond, "kg rewrote its device", func() (bool, error) {
			return kg.Rewrites() > before, kg.Err()
		}))
		r := <-done
		return r, kg.Rewrites() - before
	}

	on, rewritesOn := across(laptop(1))
	m, err := x1.Metrics(ctx)
	must(t, err)
	repairs, _ := m.Value("meshlet_session_repairs_total", "peer", kg.Name)
	if repairs < 1 {
		t.Errorf("meshlet_session_repairs_total{peer=%q} = %v after kg rewrote its device: the half-dead session was not re-established", kg.Name, repairs)
	}
	// Well under WireGuard's own 15 s (75 pings at 5/s); 2 s allows for a
	// loaded machine. The figure itself is reported.
	if on.Lost() > 10 {
		t.Errorf("a one-Peer change cost the meshlet↔kg link %d of %d pings (%.1f s)", on.Lost(), on.Sent, float64(on.Lost())/5)
	}

	// Control: the same kind of change without the session rule.
	must(t, x1.Stop(syscall.SIGTERM))
	x1.ExtraArgs = append(x1.ExtraArgs, "--repair-sessions=false")
	must(t, x1.Start(ctx))
	_, err = x1.WaitReachable(ctx, kg.PodIP, 30*time.Second)
	must(t, err)
	off, rewritesOff := across(laptop(2))
	if off.Lost() <= 25 {
		t.Errorf("control (--repair-sessions=false): only %d pings lost; the stand-in did not reproduce kg's half-dead session", off.Lost())
	}
	report(t, "mixed location with a kg node (device rewritten on every change): one-Peer change cost meshlet→kg %d/%d pings at 5/s (%.1f s), %v session re-established, %d kg rewrite(s); control without the rule: %d/%d lost (%.1f s), %d rewrite(s)",
		on.Lost(), on.Sent, float64(on.Lost())/5, repairs, rewritesOn, off.Lost(), off.Sent, float64(off.Lost())/5, rewritesOff)
}
