package netlinkx

import (
	"net/netip"
	"testing"
)

// TestUnderlayRoutes: the most specific main-table route to each address,
// not meshlet's own routes nor those on the WireGuard interface.
func TestUnderlayRoutes(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ns.ip(t, "link", "set", "kilo0", "up")
	ns.ip(t, "route", "add", "10.20.0.0/16", "via", "192.168.50.2", "dev", "ul0")
	ns.ip(t, "route", "add", "10.20.5.0/24", "dev", "kilo0", "proto", "109")
	ns.ip(t, "route", "add", "10.30.0.0/16", "dev", "kilo0", "proto", "static")
	addr := netip.MustParseAddr
	got, err := ns.host.UnderlayRoutes([]netip.Addr{addr("192.168.50.7"), addr("10.20.5.5"), addr("10.30.1.1"), addr("8.8.8.8")}, "kilo0")
	if err != nil {
		t.Fatal(err)
	}
	def := UnderlayRoute{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Gateway: addr("192.168.50.254"), Interface: "ul0"}
	want := map[netip.Addr]UnderlayRoute{
		addr("192.168.50.7"): {Prefix: netip.MustParsePrefix("192.168.50.0/24"), Interface: "ul0"},
		addr("10.20.5.5"):    {Prefix: netip.MustParsePrefix("10.20.0.0/16"), Gateway: addr("192.168.50.2"), Interface: "ul0"},
		addr("10.30.1.1"):    def,
		addr("8.8.8.8"):      def,
	}
	for a, w := range want {
		if got[a] != w {
			t.Errorf("%s: %+v, want %+v", a, got[a], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d routes, want %d: %+v", len(got), len(want), got)
	}
}
