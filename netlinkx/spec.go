package netlinkx

import "net/netip"

// Spec is the desired host network state: the WireGuard link, the tunnel,
// meshlet's routes and rules, and its iptables chains.
type Spec struct {
	Link     LinkSpec
	Tunnel   Tunnel
	Routes   []Route
	Rules    []Rule
	Firewall Firewall
	// IPv6Forwarding: the host forwards IPv6 too (the mesh carries it).
	IPv6Forwarding bool
}

// Route is one desired route. Table 0 means main.
type Route struct {
	Dst    netip.Prefix
	Gw     netip.Addr
	Dev    string
	Src    netip.Addr
	Table  int
	OnLink bool
}

// Rule is one desired policy rule (lookup Table for traffic matching all of
// Iif, Src and Dst that are set).
type Rule struct {
	Iif   string
	Src   netip.Prefix
	Dst   netip.Prefix
	Table int
}

// Tunnel is the IPIP device routes go through.
type Tunnel struct {
	// Name is the device ("cilium_tunl" or "tunl0"); "" when none is needed.
	Name string
	// Create allows creating tunl0 when it does not exist.
	Create bool
}

// NAT is the desired MASQUERADE setup: traffic from Sources (and to
// Destinations) is masqueraded unless it goes to one of Exceptions.
type NAT struct {
	Sources      []netip.Prefix
	Destinations []netip.Prefix
	Exceptions   []netip.Prefix
}
