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
		Tunnel:         netlinkx.Tunnel(p.Tunnel),
		Routes:         make([]netlinkx.Route, len(p.Routes)),
		Rules:          make([]netlinkx.Rule, len(p.Rules)),
		Firewall:       netlinkx.Firewall{NAT: netlinkx.NAT(p.NAT), Forward: p.Forward},
		IPv6Forwarding: p.IPv6Forwarding,
	}
	for i, r := range p.Routes {
		s.Routes[i] = netlinkx.Route(r)
	}
	for i, r := range p.Rules {
		s.Rules[i] = netlinkx.Rule(r)
	}
	return s
}

// SessionObservations are the WireGuard actuator's session facts in the
// planner's terms (topology.Self.Sessions).
func SessionObservations(facts []wg.SessionFact) []topology.SessionObservation {
	if len(facts) == 0 {
		return nil
	}
	out := make([]topology.SessionObservation, len(facts))
	for i, f := range facts {
		out[i] = topology.SessionObservation{PublicKey: topology.Key(f.PublicKey), At: f.At, Rx: f.Rx, Tx: f.Tx, Handshake: f.Handshake,
			UnansweredFrom: f.UnansweredFrom, UnansweredSeen: f.UnansweredSeen, Probed: f.Probed, Recreated: f.Recreated,
			Unheard: f.Unheard, Retried: f.Retried}
	}
	return out
}

// SessionActs is the plan's session actions in the WireGuard actuator's
// terms (nil: none).
func SessionActs(a *topology.SessionActions) wg.SessionActs {
	if a == nil {
		return wg.SessionActs{}
	}
	keys := func(ks []topology.Key) []wgtypes.Key {
		out := make([]wgtypes.Key, len(ks))
		for i, k := range ks {
			out[i] = wgtypes.Key(k)
		}
		return out
	}
	return wg.SessionActs{Probe: keys(a.Probe), Recreate: keys(a.Recreate), Retry: keys(a.Retry), Recheck: a.Recheck}
}
