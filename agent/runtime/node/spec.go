package node

import (
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
)

// WireGuardSpec is the plan's device in the WireGuard actuator's terms.
func WireGuardSpec(d topology.Device) wg.DeviceSpec {
	out := wg.DeviceSpec{ListenPort: d.ListenPort, Peers: make([]wg.PeerSpec, len(d.Peers))}
	for i, p := range d.Peers {
		ps := wg.PeerSpec{
			Name: p.Name, PublicKey: wgtypes.Key(p.PublicKey), Endpoint: p.Endpoint, AllowedIPs: p.AllowedIPs,
			PersistentKeepalive: time.Duration(p.PersistentKeepalive) * time.Second, Roaming: p.Roaming,
			SessionProbe: p.SessionProbe,
		}
		if p.PresharedKey != nil {
			k := wgtypes.Key(*p.PresharedKey)
			ps.PresharedKey = &k
		}
		out.Peers[i] = ps
	}
	return out
}

// HostSpec is the host part of a plan in the host actuator's terms.
func HostSpec(p topology.Plan) netlinkx.Spec {
	s := netlinkx.Spec{
		Link: netlinkx.LinkSpec{
			Name: p.WireGuard.Interface, MTU: p.WireGuard.MTU, Up: p.WireGuard.Up,
			Addresses: p.WireGuard.Addresses,
		},
		Tunnel:   netlinkx.Tunnel(p.Tunnel),
		Routes:   make([]netlinkx.Route, len(p.Routes)),
		Rules:    make([]netlinkx.Rule, len(p.Rules)),
		Firewall: netlinkx.Firewall{NAT: netlinkx.NAT(p.NAT), Forward: p.Forward},
	}
	for i, r := range p.Routes {
		s.Routes[i] = netlinkx.Route(r)
	}
	for i, r := range p.Rules {
		s.Rules[i] = netlinkx.Rule(r)
	}
	return s
}
