package node

import (
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/wg"
)

func TestPreserved(t *testing.T) {
	k := func(i byte) topology.Key { var x topology.Key; x[0] = i; return x }
	p := netip.MustParsePrefix
	dev := topology.Device{
		Peers:    []topology.WireGuardPeer{{PublicKey: k(1), AllowedIPs: []netip.Prefix{p("10.2.0.0/24")}}},
		Preserve: []netip.Prefix{p("10.2.0.0/16"), p("100.66.1.0/24")},
	}
	kw := func(i byte) wgtypes.Key { return wgtypes.Key(k(i)) }
	cur := []wg.PeerStats{
		{PublicKey: kw(1), AllowedIPs: []netip.Prefix{p("10.2.0.0/24")}}, // planned
		{PublicKey: kw(2), AllowedIPs: []netip.Prefix{p("10.2.1.0/24"), p("100.66.1.1/32")}, PersistentKeepalive: 25 * time.Second,
			Endpoint: netip.MustParseAddrPort("198.51.100.1:40000")}, // unknown remote: kept
		{PublicKey: kw(3), AllowedIPs: []netip.Prefix{p("10.2.1.0/24"), p("10.9.0.0/24")}}, // partly outside: not kept
		{PublicKey: kw(4)}, // no allowed IPs: not kept
	}
	got := Preserved(dev, cur)
	if len(got) != 1 || got[0].PublicKey != k(2) || got[0].Endpoint != "198.51.100.1:40000" || got[0].PersistentKeepalive != 25 || !got[0].Roaming {
		t.Fatalf("preserved = %+v", got)
	}
}
