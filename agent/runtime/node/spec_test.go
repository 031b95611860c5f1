package node

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
)

// TestSpecs: a plan reaches the actuators field for field (keys, keepalive
// in seconds, preshared key, session probe; routes, rules, tunnel, NAT).
func TestSpecs(t *testing.T) {
	p := netip.MustParsePrefix
	var k, psk topology.Key
	k[0], psk[0] = 1, 2
	plan := topology.Plan{
		WireGuard: topology.Device{Interface: "kilo0", ListenPort: 51821, MTU: 1420, Up: true, Addresses: []netip.Prefix{p("10.4.0.1/16")},
			Peers: []topology.WireGuardPeer{{Name: "b", PublicKey: k, Endpoint: "192.0.2.1:51820", AllowedIPs: []netip.Prefix{p("10.2.0.0/24")},
				PersistentKeepalive: 25, PresharedKey: &psk, Roaming: true, SessionProbe: netip.MustParseAddr("10.4.0.2")}}},
		Routes: []topology.Route{{Dst: p("10.2.0.0/24"), Gw: netip.MustParseAddr("10.4.0.2"), Dev: "kilo0", OnLink: true}},
		Rules:  []topology.Rule{{Iif: "kilo0", Dst: p("192.168.0.2/32"), Table: 1107}},
		Tunnel: topology.Tunnel{Name: "tunl0", Create: true},
		NAT:    topology.NAT{Sources: []netip.Prefix{p("10.5.0.1/32")}, Exceptions: []netip.Prefix{p("10.2.0.0/24")}},
	}
	wpsk := wgtypes.Key(psk)
	wantWG := wg.DeviceSpec{ListenPort: 51821, Peers: []wg.PeerSpec{{Name: "b", PublicKey: wgtypes.Key(k), Endpoint: "192.0.2.1:51820",
		AllowedIPs: []netip.Prefix{p("10.2.0.0/24")}, PersistentKeepalive: 25 * time.Second, PresharedKey: &wpsk, Roaming: true,
		SessionProbe: netip.MustParseAddr("10.4.0.2")}}}
	if got := WireGuardSpec(plan.WireGuard); !reflect.DeepEqual(got, wantWG) {
		t.Errorf("WireGuardSpec:\n got %+v\nwant %+v", got, wantWG)
	}
	wantHost := netlinkx.Spec{
		Link:     netlinkx.LinkSpec{Name: "kilo0", MTU: 1420, Up: true, Addresses: []netip.Prefix{p("10.4.0.1/16")}},
		Tunnel:   netlinkx.Tunnel{Name: "tunl0", Create: true},
		Routes:   []netlinkx.Route{{Dst: p("10.2.0.0/24"), Gw: netip.MustParseAddr("10.4.0.2"), Dev: "kilo0", OnLink: true}},
		Rules:    []netlinkx.Rule{{Iif: "kilo0", Dst: p("192.168.0.2/32"), Table: 1107}},
		Firewall: netlinkx.Firewall{NAT: netlinkx.NAT{Sources: []netip.Prefix{p("10.5.0.1/32")}, Exceptions: []netip.Prefix{p("10.2.0.0/24")}}},
	}
	if got := HostSpec(plan); !reflect.DeepEqual(got, wantHost) {
		t.Errorf("HostSpec:\n got %+v\nwant %+v", got, wantHost)
	}
}
