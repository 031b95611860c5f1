package netlinkx

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkReconcileRoutesHostile: what a hostile input's routes cost one
// node (docs/security.md#hostile-input): the first reconcile (every route
// written) and one that changes nothing (ns/op). Run with -benchtime=1x.
func BenchmarkReconcileRoutesHostile(b *testing.B) {
	requireRoot(b)
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("routes=%d", n), func(b *testing.B) {
			ns := newTestNS(b)
			ctx := context.Background()
			if _, err := ns.host.EnsureLink(ctx, LinkSpec{Name: "kilo0", Up: true, MTU: 1420, Addresses: pfx("10.4.0.1/16")}); err != nil {
				b.Fatal(err)
			}
			routes := make([]Route, n)
			for i := range routes {
				routes[i] = Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)}), 32), Dev: "kilo0"}
			}
			t0 := time.Now()
			if rep, err := ns.host.ReconcileRoutes(ctx, routes, ""); err != nil || len(rep.Replaced) != n {
				b.Fatalf("first: %d replaced, %v", len(rep.Replaced), err)
			}
			first := time.Since(t0)
			for b.Loop() {
				if rep, err := ns.host.ReconcileRoutes(ctx, routes, ""); err != nil || len(rep.Replaced)+len(rep.Deleted) != 0 {
					b.Fatalf("no-op: %d changed, %v", len(rep.Replaced)+len(rep.Deleted), err)
				}
			}
			b.ReportMetric(first.Seconds()*1000, "first-ms")
		})
	}
}
