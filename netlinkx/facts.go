package netlinkx

import (
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// HostAddress is one address of the host and the interface carrying it.
type HostAddress struct {
	Interface string
	Prefix    netip.Prefix
}

// DefaultRoute returns the interface of the IPv4 default route and its MTU
// ("" and 0 when there is none).
func (h *Host) DefaultRoute() (string, int, error) {
	routes, err := h.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: nil}, 0)
	if err != nil {
		return "", 0, fmt.Errorf("netlinkx: listing routes: %w", err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.LinkIndex > 0 {
			l, err := h.nl.LinkByIndex(r.LinkIndex)
			if err != nil {
				return "", 0, fmt.Errorf("netlinkx: default route interface: %w", err)
			}
			return l.Attrs().Name, l.Attrs().MTU, nil
		}
	}
	return "", 0, nil
}

// HostAddresses lists the global unicast addresses of every interface
// except loopback and the named ones, sorted by interface then address.
func (h *Host) HostAddresses(skip ...string) ([]HostAddress, error) {
	links, err := h.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netlinkx: listing links: %w", err)
	}
	skipped := map[string]bool{}
	for _, s := range skip {
		skipped[s] = true
	}
	var out []HostAddress
	for _, l := range links {
		name := l.Attrs().Name
		if skipped[name] || l.Attrs().Flags&net.FlagLoopback != 0 {
			continue
		}
		as, err := h.nl.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("netlinkx: addresses of %s: %w", name, err)
		}
		for _, a := range as {
			p, ok := prefixOf(a.IPNet)
			if !ok || !p.Addr().IsGlobalUnicast() {
				continue
			}
			out = append(out, HostAddress{Interface: name, Prefix: p})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Interface != out[j].Interface {
			return out[i].Interface < out[j].Interface
		}
		return out[i].Prefix.Addr().Less(out[j].Prefix.Addr())
	})
	return out, nil
}

// InterfaceIPv4 returns the first IPv4 address of an interface as a /32
// (e.g. cilium_host), or the zero prefix when it does not exist or has none.
func (h *Host) InterfaceIPv4(name string) netip.Prefix {
	ps, err := h.Addresses(name)
	if err != nil {
		return netip.Prefix{}
	}
	for _, p := range ps {
		if p.Addr().Is4() {
			return netip.PrefixFrom(p.Addr(), 32)
		}
	}
	return netip.Prefix{}
}

// UnderlayRoute is the route the host's main table takes to an address.
type UnderlayRoute struct {
	// Prefix is the route's destination (0.0.0.0/0: the default route).
	Prefix netip.Prefix
	// Gateway is its next hop (invalid: on-link).
	Gateway   netip.Addr
	Interface string
}

// UnderlayRoutes finds, for each IPv4 address, the main table's most
// specific route to it, leaving out meshlet's own routes and any on skip
// (the WireGuard interface): the way the underlay reaches it. Addresses
// no route covers are absent from the result. One route dump per call.
func (h *Host) UnderlayRoutes(addrs []netip.Addr, skip string) (map[netip.Addr]UnderlayRoute, error) {
	out := map[netip.Addr]UnderlayRoute{}
	if len(addrs) == 0 {
		return out, nil
	}
	routes, err := h.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("netlinkx: listing routes: %w", err)
	}
	names := map[int]string{}
	for _, r := range routes {
		if r.Protocol == Protocol || r.Type != unix.RTN_UNICAST {
			continue
		}
		dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if r.Dst != nil {
			a, ok := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			if !ok {
				continue
			}
			dst = netip.PrefixFrom(a.Unmap(), ones)
		}
		name, ok := names[r.LinkIndex]
		if !ok {
			if l, err := h.nl.LinkByIndex(r.LinkIndex); err == nil {
				name = l.Attrs().Name
			}
			names[r.LinkIndex] = name
		}
		if name == skip {
			continue
		}
		gw, _ := netip.AddrFromSlice(r.Gw)
		for _, a := range addrs {
			if cur, have := out[a]; dst.Contains(a) && (!have || dst.Bits() > cur.Prefix.Bits()) {
				out[a] = UnderlayRoute{Prefix: dst, Gateway: gw.Unmap(), Interface: name}
			}
		}
	}
	return out, nil
}
