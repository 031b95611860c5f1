// Package node adapts meshlet's actuators (wg/, netlinkx/) to the
// reconcile loop, and reads this node's live facts: its private address,
// cilium_host, the tunnel device, and the endpoints its device learned.
package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
)

// WireGuard applies the device through wg.Manager. Peers that the plan asks
// to preserve (networks of a remote cluster not synced yet) are carried
// over from the device as they are.
type WireGuard struct {
	Manager *wg.Manager
}

// Apply implements reconcile.WireGuard.
func (w *WireGuard) Apply(ctx context.Context, dev topology.Device) (reconcile.Changes, error) {
	if len(dev.Preserve) > 0 {
		st, err := w.Manager.Stats(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading device to preserve peers: %w", err)
		}
		dev.Peers = append(dev.Peers, Preserved(dev, st.Peers)...)
	}
	r, err := w.Manager.Apply(ctx, WireGuardSpec(dev))
	return r.Counts(), err
}

// Preserved returns the device peers that are not in dev.Peers and whose
// allowed IPs all lie inside dev.Preserve, as desired peers that match the
// device exactly (so the diff leaves them alone).
func Preserved(dev topology.Device, current []wg.PeerStats) []topology.WireGuardPeer {
	planned := map[topology.Key]bool{}
	for _, p := range dev.Peers {
		planned[p.PublicKey] = true
	}
	var out []topology.WireGuardPeer
	for _, s := range current {
		if planned[topology.Key(s.PublicKey)] || len(s.AllowedIPs) == 0 || !allInside(s.AllowedIPs, dev.Preserve) {
			continue
		}
		p := topology.WireGuardPeer{
			Name: "preserved", Kind: topology.KindRemote, PublicKey: topology.Key(s.PublicKey), AllowedIPs: s.AllowedIPs,
			PersistentKeepalive: int(s.PersistentKeepalive.Seconds()), Roaming: true,
		}
		if s.Endpoint.IsValid() {
			p.Endpoint = s.Endpoint.String()
		}
		out = append(out, p)
	}
	return out
}

func allInside(ps, nets []netip.Prefix) bool {
	for _, p := range ps {
		in := false
		for _, n := range nets {
			if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	return true
}

// PeerStats implements metrics.StatsSource.
func (w *WireGuard) PeerStats(ctx context.Context) ([]metrics.PeerStat, error) {
	st, err := w.Manager.Stats(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]metrics.PeerStat, len(st.Peers))
	for i, p := range st.Peers {
		out[i] = metrics.PeerStat{PublicKey: topology.Key(p.PublicKey), Endpoint: p.Endpoint, LastHandshake: p.LastHandshake,
			ReceiveBytes: p.ReceiveBytes, TransmitBytes: p.TransmitBytes, PersistentKeepalive: p.PersistentKeepalive, AllowedIPs: p.AllowedIPs}
	}
	return out, nil
}

// Host applies links, routes, rules, tunnel and iptables through netlinkx.
type Host struct {
	Host *netlinkx.Host
	// Underlay returns the interface the auto MTU derives from.
	Underlay func() string
}

// Apply implements reconcile.Host.
func (h *Host) Apply(ctx context.Context, plan topology.Plan) (reconcile.Changes, error) {
	underlay := ""
	if h.Underlay != nil {
		underlay = h.Underlay()
	}
	r, err := h.Host.Apply(ctx, HostSpec(plan, underlay))
	if err != nil {
		return r.Counts(), fmt.Errorf("host network: %w", err)
	}
	return r.Counts(), nil
}

// Facts reads this node's live facts for the planner.
type Facts struct {
	Host      *netlinkx.Host
	WireGuard *WireGuard
	PublicKey topology.Key
	Interface string       // kilo0: never taken as the private interface
	Internal  netip.Prefix // --internal-cidr, zero = discover
	Port      int
	Version   string // meshlet's, published in meshlet.io/version
	// SelfNode returns this node's Node annotations (force-endpoint).
	Annotations func() map[string]string

	mu       sync.Mutex
	underlay string
}

// Underlay returns the private interface found by the last Self call.
func (f *Facts) Underlay() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.underlay
}

// Self implements reconcile.SelfSource.
func (f *Facts) Self(ctx context.Context) (topology.Self, error) {
	// One read of the host's addresses serves the private IP and the
	// endpoint: this runs at every reconcile.
	addrs, err := f.Host.HostAddresses(f.Interface, netlinkx.TunnelCilium, netlinkx.TunnelDefault, "cilium_host", "cilium_net")
	if err != nil {
		return topology.Self{}, err
	}
	priv, err := f.Host.PrivateAddressIn(addrs, f.Internal)
	if err != nil {
		return topology.Self{}, err
	}
	f.mu.Lock()
	f.underlay = priv.Interface
	f.mu.Unlock()
	tunnel, err := f.Host.FindTunnel()
	if err != nil {
		return topology.Self{}, fmt.Errorf("looking for the tunnel device: %w", err)
	}
	self := topology.Self{
		PrivateIP: priv.Prefix, PrivateInterface: priv.Interface, PublicKey: f.PublicKey,
		CiliumHostIP: f.Host.InterfaceIPv4("cilium_host"), TunnelDevice: tunnel, Version: f.Version,
	}
	self.Endpoint = f.endpoint(priv.Prefix, addrs)
	if f.WireGuard != nil {
		if st, err := f.WireGuard.Manager.Stats(ctx); err == nil {
			self.DeviceEndpoints = map[topology.Key]netip.AddrPort{}
			for _, p := range st.Peers {
				if !p.LastHandshake.IsZero() && p.Endpoint.IsValid() {
					self.DeviceEndpoints[topology.Key(p.PublicKey)] = p.Endpoint
				}
			}
		}
	}
	return self, nil
}

// endpoint is what this node advertises: force-endpoint when set and
// valid, else the first public address of the host, else the private IP —
// Kilo's order — with the WireGuard port.
func (f *Facts) endpoint(priv netip.Prefix, addrs []netlinkx.HostAddress) string {
	if f.Annotations != nil {
		if fe := f.Annotations()[topology.AnnotationForceEndpoint]; fe != "" {
			if e, err := kilo.ParseEndpoint(fe); err == nil {
				return e.String()
			}
		}
	}
	port := strconv.Itoa(f.Port)
	for _, a := range addrs {
		if ip := a.Prefix.Addr(); ip.Is4() && !ip.IsPrivate() && !isCGNAT(ip) {
			return net.JoinHostPort(ip.String(), port)
		}
	}
	if priv.IsValid() {
		return net.JoinHostPort(priv.Addr().String(), port)
	}
	return ""
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

func isCGNAT(a netip.Addr) bool { return cgnat.Contains(a) }
