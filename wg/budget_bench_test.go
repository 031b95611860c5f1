package wg

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkApplyHostile: what a hostile input costs the WireGuard device
// of one leader (docs/security.md#hostile-input): the first apply of a plan
// (every peer added) and a re-apply that changes nothing (ns/op), on a
// userspace device. Run with -benchtime=1x.
func BenchmarkApplyHostile(b *testing.B) {
	requireRoot(b)
	cases := []struct {
		name  string
		peers func() []PeerSpec
	}{
		{"ordinary/peers=20", func() []PeerSpec { return benchPeers(20) }},
		{"peer-allowedIPs=100000", func() []PeerSpec {
			ps := benchPeers(20)
			for j := 0; j < 100000; j++ {
				a := netip.AddrFrom4([4]byte{172, 16 + byte(j>>16), byte(j >> 8), byte(j)})
				ps[0].AllowedIPs = append(ps[0].AllowedIPs, netip.PrefixFrom(a, 32))
			}
			return ps
		}},
		{"peers=5000", func() []PeerSpec { return benchPeers(5000) }},
		{"peers=10000", func() []PeerSpec { return benchPeers(10000) }},
		{"peers=50000", func() []PeerSpec { return benchPeers(50000) }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ns := newNetns(b)
			node := startNode(b, ns, "10.4.0.1/16")
			plan := DeviceSpec{ListenPort: 51820, Peers: c.peers()}
			t0 := time.Now()
			if _, err := node.mgr.Apply(context.Background(), plan); err != nil {
				b.Fatalf("first apply: %v", err)
			}
			first := time.Since(t0)
			dev, err := node.client.Device(node.dev)
			if err != nil || len(dev.Peers) != len(plan.Peers) {
				b.Fatalf("device has %d peers, want %d (%v)", len(dev.Peers), len(plan.Peers), err)
			}
			for b.Loop() {
				if rep, err := node.mgr.Apply(context.Background(), plan); err != nil || rep.PeersTouched() != 0 {
					b.Fatalf("no-op apply touched %d peers: %v", rep.PeersTouched(), err)
				}
			}
			b.ReportMetric(first.Seconds()*1000, "first-apply-ms")
			b.ReportMetric(float64(len(plan.Peers)), "peers")
			n := 0
			for _, p := range plan.Peers {
				n += len(p.AllowedIPs)
			}
			b.ReportMetric(float64(n), "allowedIPs")
		})
	}
}
