package netlinkx

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/vishvananda/netlink"
)

// HostAddress is one address of the host and the interface carrying it.
type HostAddress struct {
	Interface string
	Prefix    netip.Prefix
}

// PrivateAddress finds the node's private IP the way kg does without
// --internal-cidr: the first IPv4 address of the interface that holds the
// default route, else the first global unicast IPv4 address of any other
// interface (skipping loopback and skip). With want set (--internal-cidr),
// it returns the interface that carries want's address and want itself.
func (h *Host) PrivateAddress(want netip.Prefix, skip ...string) (HostAddress, error) {
	addrs, err := h.HostAddresses(skip...)
	if err != nil {
		return HostAddress{}, err
	}
	return h.PrivateAddressIn(addrs, want)
}

// PrivateAddressIn is PrivateAddress over addresses already read with
// HostAddresses (a caller that needs them for more than this reads once).
func (h *Host) PrivateAddressIn(addrs []HostAddress, want netip.Prefix) (HostAddress, error) {
	if want.IsValid() {
		for _, a := range addrs {
			if a.Prefix.Addr() == want.Addr() {
				return HostAddress{Interface: a.Interface, Prefix: want}, nil
			}
		}
		// The address may live on an interface we do not see (e.g. a
		// VIP); the prefix is still what the user asked for.
		return HostAddress{Prefix: want}, nil
	}
	routes, err := h.nl.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return HostAddress{}, fmt.Errorf("netlinkx: listing routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP != nil && !r.Dst.IP.IsUnspecified() {
			continue
		}
		l, err := h.nl.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if a.Interface == l.Attrs().Name && a.Prefix.Addr().Is4() {
				return a, nil
			}
		}
	}
	for _, a := range addrs {
		if a.Prefix.Addr().Is4() {
			return a, nil
		}
	}
	return HostAddress{}, errors.New("netlinkx: no private IPv4 address found; set --internal-cidr")
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
