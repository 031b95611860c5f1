// Package node connects the planner to this node. Facts reads what the
// planner decides from — the host's addresses, its default route, cilium_host,
// the tunnel device, the WireGuard device's peers — and decides nothing;
// WireGuard and Host apply a plan through the actuators (wg/, netlinkx/),
// translated once (spec.go).
package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cni"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
	"golang.org/x/sys/unix"
)

// WireGuard applies the plan's device through wg.Manager.
type WireGuard struct {
	Manager *wg.Manager
}

// Apply implements reconcile.WireGuard.
func (w *WireGuard) Apply(ctx context.Context, dev topology.Device) (reconcile.Changes, error) {
	r, err := w.Manager.Apply(ctx, WireGuardSpec(dev))
	return r.Counts(), err
}

// InitiateHandshakes implements reconcile.WireGuard.
func (w *WireGuard) InitiateHandshakes(ctx context.Context) (int, error) {
	return w.Manager.InitiateHandshakes(ctx)
}

// ActOnSessions implements reconcile.WireGuard: the plan's session
// actions (nil: none, and no reading awaited).
func (w *WireGuard) ActOnSessions(ctx context.Context, acts *topology.SessionActions) error {
	return w.Manager.ActOnSessions(ctx, SessionActs(acts))
}

// Stats reads the device (metrics at scrape time).
func (w *WireGuard) Stats(ctx context.Context) (wg.DeviceStats, error) { return w.Manager.Stats(ctx) }

// Unresolved are the endpoints the last apply could not resolve.
func (w *WireGuard) Unresolved() []wg.UnresolvedEndpoint { return w.Manager.Unresolved() }

// Host applies links, routes, rules, tunnel and iptables through netlinkx,
// and where Kilo is the CNI the CNI configuration list's range.
type Host struct {
	Host *netlinkx.Host
	CNI  *cni.File // nil without --cni
	// Interface is the WireGuard interface, left out of EndpointRoutes.
	Interface string
	// firewall is handed each apply's iptables changes (ObserveFirewall).
	firewall func(changes []string)
}

// ObserveFirewall hands f the iptables changes of every apply from now on
// (netlinkx.FirewallReport.Changes), for kg's kilo_iptables_operations_total
// (--metrics-compat=kilo). Call it before the first Apply.
func (h *Host) ObserveFirewall(f func(changes []string)) { h.firewall = f }

// Apply implements reconcile.Host.
func (h *Host) Apply(ctx context.Context, plan topology.Plan) (reconcile.Changes, error) {
	r, err := h.Host.Apply(ctx, HostSpec(plan))
	counts := r.Counts()
	if h.firewall != nil && len(r.Firewall.Changes) > 0 {
		h.firewall(r.Firewall.Changes)
	}
	if err != nil {
		if errors.Is(err, netlinkx.ErrTunnelMissing) && plan.Tunnel.Name == topology.TunnelFlannel {
			err = fmt.Errorf("%w (flannel creates flannel.1 with its vxlan backend: is flannel running on this node?)", err)
		}
		return counts, fmt.Errorf("host network: %w", err)
	}
	if h.CNI != nil && plan.CNISubnet.IsValid() {
		changed, err := h.CNI.Write(plan.CNISubnet)
		if err != nil {
			return counts, fmt.Errorf("CNI configuration: %w", err)
		}
		if changed {
			counts["cni"]++
		}
	}
	return counts, nil
}

// Facts observes this node for the planner.
type Facts struct {
	Host      *netlinkx.Host
	WireGuard *wg.Manager
	Version   string // meshlet's, published in meshlet.io/version
	// HostnameAddrs are the addresses the node's hostname resolves to
	// (resolved once at start, as kg does).
	HostnameAddrs []netip.Addr
	// CNI is Kilo's CNI configuration list (nil without --cni).
	CNI *cni.File

	// host is what was last read of the host's addresses and routes, at
	// the Host's event count events (hostFacts).
	host   *hostFacts
	events uint64
}

// hostFacts are the facts read from the host's links, addresses and
// routes: they change only with a netlink event.
type hostFacts struct {
	addrs        []netlinkx.HostAddress
	iface        string
	mtu          int
	tunnel       string
	gateway      netip.Addr
	ciliumHostIP netip.Prefix
	hostRoutes   []topology.HostRoute
}

// readHost reads the host's facts, or returns the last ones while the Host
// has seen no netlink event since (netlinkx.Host.Events): an idle node's
// runs then cost no route dump (docs/performance.md#idle). Self is called
// by the loop alone, one run at a time.
func (f *Facts) readHost() (*hostFacts, error) {
	events, watched := f.Host.Events()
	if watched && f.host != nil && events == f.events {
		return f.host, nil
	}
	f.host = nil
	addrs, err := f.Host.HostAddresses(append([]string{f.WireGuard.Interface()}, notHost...)...)
	if err != nil {
		return nil, err
	}
	iface, mtu, err := f.Host.DefaultRoute()
	if err != nil {
		return nil, err
	}
	tunnel, err := f.Host.FindTunnel(topology.TunnelCilium, topology.TunnelIPIP)
	if err != nil {
		return nil, fmt.Errorf("looking for the tunnel device: %w", err)
	}
	gw, err := f.Host.DefaultGateway()
	if err != nil {
		return nil, err
	}
	routes, err := f.Host.HostRoutes(f.WireGuard.Interface(), unix.RT_TABLE_MAIN, topology.KiloTable)
	if err != nil {
		return nil, err
	}
	h := &hostFacts{addrs: addrs, iface: iface, mtu: mtu, tunnel: tunnel, gateway: gw, ciliumHostIP: f.Host.InterfaceIPv4("cilium_host"),
		hostRoutes: HostRoutes(routes)}
	if watched {
		f.host, f.events = h, events
	}
	return h, nil
}

// notHost are interfaces whose addresses are not the host's own: the
// tunnels, Cilium's devices and the bridge of Kilo as the CNI (kg ignores
// the same; the WireGuard interface is added to them).
var notHost = []string{topology.TunnelCilium, topology.TunnelIPIP, topology.TunnelFlannel, "cilium_host", "cilium_net", "kube-bridge"}

// Self implements reconcile.SelfSource.
func (f *Facts) Self(ctx context.Context) (topology.Self, error) {
	h, err := f.readHost()
	if err != nil {
		return topology.Self{}, err
	}
	st, err := f.WireGuard.Stats(ctx)
	if err != nil {
		return topology.Self{}, fmt.Errorf("reading the WireGuard device: %w", err)
	}
	self := topology.Self{
		PublicKey: topology.Key(f.WireGuard.PublicKey()), Version: f.Version, HostnameAddrs: f.HostnameAddrs,
		DefaultInterface: h.iface, DefaultMTU: h.mtu, DefaultGateway: h.gateway, CiliumHostIP: h.ciliumHostIP, TunnelDevice: h.tunnel,
		Addresses: make([]topology.HostAddress, len(h.addrs)), Device: make([]topology.DevicePeer, len(st.Peers)),
		HostRoutes: h.hostRoutes,
	}
	for i, a := range h.addrs {
		self.Addresses[i] = topology.HostAddress(a)
	}
	for i, p := range st.Peers {
		self.Device[i] = topology.DevicePeer{
			PublicKey: topology.Key(p.PublicKey), Endpoint: p.Endpoint, Handshake: !p.LastHandshake.IsZero(),
			AllowedIPs: p.AllowedIPs, PersistentKeepalive: int(p.PersistentKeepalive.Seconds()),
		}
	}
	self.Sessions = SessionObservations(f.WireGuard.SessionFacts())
	if f.CNI != nil {
		st, err := f.CNI.Read()
		self.CNI = topology.CNIState{Subnet: st.Subnet}
		if err != nil {
			self.CNI.Err = err.Error()
		}
	}
	return self, nil
}

// HostRoutes translates the host's own routes for the planner (the main
// table is the plan's table 0).
func HostRoutes(rs []netlinkx.HostRoute) []topology.HostRoute {
	out := make([]topology.HostRoute, 0, len(rs))
	for _, r := range rs {
		t := r.Table
		if t == unix.RT_TABLE_MAIN {
			t = 0
		}
		out = append(out, topology.HostRoute{Table: t, Dst: r.Dst, Desc: r.Desc})
	}
	return out
}

// Sysctl reads a sysctl of the node's network namespace (`meshlet
// status`: ip_forward on a leader).
func (h *Host) Sysctl(key string) (string, error) { return h.Host.ReadSysctl(key) }

// EndpointRoutes reads the underlay's routes to the peers' endpoint
// addresses (`meshlet status`: a private endpoint no route leads to).
func (h *Host) EndpointRoutes(addrs []netip.Addr) (map[netip.Addr]diagnose.EndpointRoute, error) {
	rs, err := h.Host.UnderlayRoutes(addrs, h.Interface)
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Addr]diagnose.EndpointRoute, len(rs))
	for a, r := range rs {
		out[a] = diagnose.EndpointRoute(r)
	}
	return out, nil
}

// Drift reports, without changing anything, how the host differs from the
// plan's link, routes and rules (`meshlet status`).
func (h *Host) Drift(ctx context.Context, plan topology.Plan) ([]string, error) {
	d, err := h.Host.Drift(ctx, HostSpec(plan))
	return d.Lines(), err
}
