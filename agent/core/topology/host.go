package topology

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// This node's own facts, decided from what the agent observed on the host
// (Self): its private IP and the interface carrying it, the endpoint it
// advertises, the WireGuard MTU, the endpoints its device learned. Kilo
// decides them in kg at start; here they are part of every plan (the
// first stage: DecideHost), so they follow the host.

// HostAddress is one address of the host and the interface carrying it.
type HostAddress struct {
	Interface string
	Prefix    netip.Prefix
}

// DevicePeer is one peer of the WireGuard device as the agent read it.
type DevicePeer struct {
	PublicKey Key
	// Endpoint is where the peer is now (learned or configured); zero = none.
	Endpoint            netip.AddrPort
	Handshake           bool // a handshake completed at some point
	AllowedIPs          []netip.Prefix
	PersistentKeepalive int // seconds
}

// Kilo's constants for the WireGuard link.
const (
	// wireGuardOverhead is what WireGuard adds to a packet (IPv6 outer
	// header, UDP, WireGuard header): the interface MTU is the underlay's
	// minus this.
	wireGuardOverhead = 80
	// defaultMTU is used when the underlay's MTU is unknown.
	defaultMTU = 1420
)

// hostIPs is Kilo's choice of a node's private and public IP (kg's getIP):
// the private IP is the first non-public address to which the hostname
// resolves, else of the default route's interface, else of any interface
// (only inside allowed, when set — kg's --internal-cidr); the public IP the
// first public one in the same order, else the private IP. Within each
// source IPv4 comes first. ok is false when the host has no address at all.
func hostIPs(self Self, allowed []netip.Prefix) (priv, pub HostAddress, ok bool) {
	var byHostname, byDefault []HostAddress
	for _, a := range self.Addresses {
		if slices.Contains(self.HostnameAddrs, a.Prefix.Addr()) {
			byHostname = append(byHostname, a)
		}
		if a.Interface == self.DefaultInterface {
			byDefault = append(byDefault, a)
		}
	}
	var privs, pubs []HostAddress
	for _, source := range [][]HostAddress{byHostname, byDefault, self.Addresses} {
		var sp, su []HostAddress
		for _, a := range source {
			ip := a.Prefix.Addr()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
				continue
			}
			if isPublic(ip) {
				su = append(su, a)
			} else if len(allowed) == 0 || slices.ContainsFunc(allowed, func(c netip.Prefix) bool { return c.Contains(ip) }) {
				sp = append(sp, a)
			}
		}
		sortHostAddresses(sp)
		sortHostAddresses(su)
		privs, pubs = append(privs, sp...), append(pubs, su...)
	}
	if len(privs) == 0 && len(pubs) == 0 {
		return priv, pub, false
	}
	if len(privs) > 0 {
		priv = privs[0]
	}
	pub = priv
	if len(pubs) > 0 {
		pub = pubs[0]
	}
	return priv, pub, true
}

// sortHostAddresses is Kilo's order: IPv4 first, then by the CIDR's text.
func sortHostAddresses(as []HostAddress) {
	slices.SortStableFunc(as, func(a, b HostAddress) int {
		a4, b4 := a.Prefix.Addr().Is4(), b.Prefix.Addr().Is4()
		switch {
		case a4 && !b4:
			return -1
		case b4 && !a4:
			return 1
		}
		return strings.Compare(a.Prefix.String(), b.Prefix.String())
	})
}

// Host is this node's own facts, decided from what the agent observed.
type Host struct {
	// Private is the private IP and the interface carrying it.
	Private HostAddress
	// DualStackPrivate is the private IP of the dual-stack family and its
	// interface (secondFamilyPrivate; zero in a single-stack mesh).
	DualStackPrivate HostAddress
	// Endpoint is what the node advertises ("" = none).
	Endpoint string
	// MTU is the WireGuard interface's.
	MTU int
}

// DecideHost decides this node's private IP, private interface, endpoint
// and MTU from what the agent observed and what the node publishes
// (published: nil when its Node is not known yet). The private IP is the
// node's force-internal-ip when it has one ("" or "-": none), else
// --private-ip, else the one discovered (hostIPs, within --internal-cidr).
// The endpoint is the node's force-endpoint when valid, else its private
// IP with --prioritise-private-addresses, else its public IP, with the
// listen port. The MTU is --mtu, else Kilo's auto rule (the default route
// interface's MTU minus WireGuard's overhead).
func DecideHost(self Self, set Settings, published *Node) Host {
	var h Host
	discovered, pub, ok := hostIPs(self, set.InternalCIDRs)
	priv := discovered
	pinned := func(want netip.Prefix) HostAddress {
		a := HostAddress{Prefix: want}
		for _, x := range self.Addresses {
			if want.IsValid() && x.Prefix.Addr() == want.Addr() {
				a.Interface = x.Interface
			}
		}
		return a
	}
	switch {
	case published != nil && published.InternalIPForced:
		priv = pinned(published.InternalIP)
	case set.PrivateIP.IsValid():
		priv = pinned(set.PrivateIP)
		if !ok || pub.Prefix == discovered.Prefix {
			// No public IP: the endpoint falls back to the private IP, the
			// one set.
			pub, ok = priv, true
		}
	}
	h.Private = priv
	h.DualStackPrivate = secondFamilyPrivate(self, set)
	force := ""
	if published != nil {
		force = published.ForceEndpoint
	}
	switch {
	case force != "":
		h.Endpoint = force
	case self.Advertised != "":
		h.Endpoint = self.Advertised
	case set.PrivateEndpoint && discovered.Prefix.IsValid():
		// kg advertises the private IP it discovered.
		h.Endpoint = net.JoinHostPort(discovered.Prefix.Addr().String(), strconv.Itoa(set.Port))
	case ok && pub.Prefix.IsValid():
		h.Endpoint = net.JoinHostPort(pub.Prefix.Addr().String(), strconv.Itoa(set.Port))
	}
	switch {
	case set.MTU > 0:
		h.MTU = set.MTU
	case self.DefaultMTU > 0:
		h.MTU = self.DefaultMTU - wireGuardOverhead
	default:
		h.MTU = defaultMTU
	}
	return h
}

// deviceEndpoints are the endpoints this node's device learned: peers that
// completed a handshake (Kilo's discoverNATEndpoints reads the same).
func deviceEndpoints(self Self) map[Key]netip.AddrPort {
	out := map[Key]netip.AddrPort{}
	for _, d := range self.Device {
		if d.Handshake && d.Endpoint.IsValid() {
			out[d.PublicKey] = d.Endpoint
		}
	}
	return out
}

// preserved returns the device's peers that are not planned and whose
// allowed IPs all lie inside networks whose peers are unknown right now (a
// remote cluster not synced yet, e.g. just after a restart): they are kept
// exactly as they are, so their sessions survive until the watcher knows
// better.
func preserved(device []DevicePeer, planned []WireGuardPeer, networks []netip.Prefix) []WireGuardPeer {
	if len(networks) == 0 {
		return nil
	}
	isPlanned := map[Key]bool{}
	for _, wp := range planned {
		isPlanned[wp.PublicKey] = true
	}
	set := newPrefixSet(networks)
	var out []WireGuardPeer
	for _, d := range device {
		if isPlanned[d.PublicKey] || len(d.AllowedIPs) == 0 || !allCovered(set, d.AllowedIPs) {
			continue
		}
		wp := WireGuardPeer{
			Name: "preserved", Kind: KindRemote, PublicKey: d.PublicKey, AllowedIPs: sortedUnique(d.AllowedIPs),
			PersistentKeepalive: d.PersistentKeepalive, Roaming: true, EndpointSource: "device",
		}
		if d.Endpoint.IsValid() {
			wp.Endpoint = d.Endpoint.String()
		}
		out = append(out, wp)
	}
	return out
}

func allCovered(set *prefixSet, ps []netip.Prefix) bool {
	for _, x := range ps {
		if _, in := set.covering(x); !in {
			return false
		}
	}
	return true
}
