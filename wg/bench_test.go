package wg

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// benchPeers returns n peers with distinct keys and allowed IPs, no
// endpoints (so the device sends nothing while being measured).
func benchPeers(n int) []PeerSpec {
	peers := make([]PeerSpec, n)
	for i := range peers {
		var k wgtypes.Key
		k[0], k[1], k[2] = byte(i>>16), byte(i>>8), byte(i)
		k[31] = 0x42
		a := netip.AddrFrom4([4]byte{10, 100 + byte(i>>16), byte(i >> 8), byte(i)})
		peers[i] = PeerSpec{Name: fmt.Sprintf("p%d", i), PublicKey: k, AllowedIPs: []netip.Prefix{netip.PrefixFrom(a, 32)}, Roaming: true}
	}
	return peers
}

// BenchmarkApply compares, on the same userspace device of 1,000 and 5,000
// peers, a one-peer change applied against meshlet's memory (what Apply
// does), the same with a device read before the diff (what Apply did until
// December 2026, and still does after drift), and Kilo's full replace
// (ReplacePeers with every peer); device-read is one read alone, the cost
// of a drift check. peers-touched/op is what the device had to process.
func BenchmarkApply(b *testing.B) {
	requireRoot(b)
	// p50At1000 holds each one-peer case's median at 1,000 peers, so the
	// 5,000-peer case reports its ratio to it from the same run.
	p50At1000 := map[bool]time.Duration{}
	for _, n := range []int{1000, 5000} {
		ns := newNetns(b)
		node := startNode(b, ns, "10.4.0.1/16")
		plan := DeviceSpec{ListenPort: 51820, Peers: benchPeers(n)}
		if rep, err := node.mgr.Apply(context.Background(), plan); err != nil || len(rep.Added) != n {
			b.Fatalf("initial apply: %v (%d added)", err, len(rep.Added))
		}
		onePeer := func(b *testing.B, read bool) {
			alt := []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")}
			orig := plan.Peers[0].AllowedIPs
			touched := 0
			i := 0
			var took []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				if i%2 == 0 {
					plan.Peers[0].AllowedIPs = alt
				} else {
					plan.Peers[0].AllowedIPs = orig
				}
				i++
				if read {
					node.mgr.mu.Lock()
					node.mgr.stale = true
					node.mgr.mu.Unlock()
				}
				t0 := time.Now()
				rep, err := node.mgr.Apply(context.Background(), plan)
				took = append(took, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				touched = rep.PeersTouched()
				if touched != 1 {
					b.Fatalf("one-peer change touched %d peers", touched)
				}
			}
			// Leave the device as the plan was, whatever the number of
			// iterations, so the next case starts from orig too.
			plan.Peers[0].AllowedIPs = orig
			if _, err := node.mgr.Apply(context.Background(), plan); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(touched), "peers-touched/op")
			p50 := reportSpread(b, took)
			switch base, ok := p50At1000[read]; {
			case n == 1000:
				p50At1000[read] = p50
			case ok && base > 0:
				b.ReportMetric(float64(p50)/float64(base), "p50-vs-1000-peers")
			}
		}
		b.Run(fmt.Sprintf("incremental/peers=%d", n), func(b *testing.B) { onePeer(b, false) })
		b.Run(fmt.Sprintf("read+incremental/peers=%d", n), func(b *testing.B) { onePeer(b, true) })
		// The device's share of a one-peer apply: the same change written
		// straight through wgctrl, nothing of meshlet's diff around it.
		b.Run(fmt.Sprintf("configure-one/peers=%d", n), func(b *testing.B) {
			p := plan.Peers[0]
			set := func(ips []netip.Prefix) {
				if err := node.client.ConfigureDevice(node.dev, wgtypes.Config{Peers: []wgtypes.PeerConfig{{
					PublicKey: wgtypes.Key(p.PublicKey), UpdateOnly: true, ReplaceAllowedIPs: true, AllowedIPs: toIPNets(ips)}}}); err != nil {
					b.Fatal(err)
				}
			}
			alt := []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")}
			i := 0
			var took []time.Duration
			for b.Loop() {
				ips := p.AllowedIPs
				if i%2 == 0 {
					ips = alt
				}
				i++
				t0 := time.Now()
				set(ips)
				took = append(took, time.Since(t0))
			}
			set(p.AllowedIPs) // as the plan has it, for the next case
			reportSpread(b, took)
		})
		b.Run(fmt.Sprintf("device-read/peers=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := node.client.Device(node.dev); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("full-replace/peers=%d", n), func(b *testing.B) {
			cfg := wgtypes.Config{ReplacePeers: true, Peers: make([]wgtypes.PeerConfig, n)}
			for i, p := range plan.Peers {
				cfg.Peers[i] = wgtypes.PeerConfig{PublicKey: wgtypes.Key(p.PublicKey), ReplaceAllowedIPs: true, AllowedIPs: toIPNets(p.AllowedIPs)}
			}
			for b.Loop() {
				if err := node.client.ConfigureDevice(node.dev, cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n), "peers-touched/op")
		})
	}
}

// reportSpread reports the minimum and the median of one case's timed
// operations and returns the median. The mean (ns/op) moves with whatever
// else the machine does; the minimum and the median of the same run are
// what a 1,000 vs 5,000-peer comparison can rest on.
func reportSpread(b *testing.B, took []time.Duration) time.Duration {
	slices.Sort(took)
	p50 := took[len(took)/2]
	b.ReportMetric(float64(took[0])/1e6, "ms-min/op")
	b.ReportMetric(float64(p50)/1e6, "ms-p50/op")
	return p50
}

// BenchmarkDiff is the pure diff alone, without the device round trips.
func BenchmarkDiff(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			peers := benchPeers(n)
			dev := &wgtypes.Device{Peers: make([]wgtypes.Peer, n)}
			in := DiffInput{Peers: make([]ResolvedPeer, n)}
			for i, p := range peers {
				dev.Peers[i] = wgtypes.Peer{PublicKey: wgtypes.Key(p.PublicKey), AllowedIPs: toIPNets(p.AllowedIPs)}
				in.Peers[i] = ResolvedPeer{PeerSpec: p}
			}
			in.Peers[0].AllowedIPs = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")}
			for b.Loop() {
				_, rep := Diff(in, dev)
				if rep.PeersTouched() != 1 {
					b.Fatal("diff touched more than one peer")
				}
			}
		})
	}
}
