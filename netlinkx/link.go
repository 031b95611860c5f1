package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// LinkSpec is the desired state of the WireGuard link.
type LinkSpec struct {
	Name string
	// MTU is the link's MTU; 0 leaves it as it is.
	MTU       int
	Up        bool
	Addresses []netip.Prefix
}

// LinkReport says what EnsureLink changed.
type LinkReport struct {
	MTU          int            `json:"mtu"`
	MTUChanged   bool           `json:"mtuChanged,omitempty"`
	StateChanged bool           `json:"stateChanged,omitempty"`
	AddedAddrs   []netip.Prefix `json:"addedAddresses,omitempty"`
	RemovedAddrs []netip.Prefix `json:"removedAddresses,omitempty"`
}

// DiffAddrs returns the addresses to add and to remove on the link. IPv6
// link-local addresses are the kernel's and never removed.
func DiffAddrs(desired, current []netip.Prefix) (add, del []netip.Prefix) {
	for _, d := range desired {
		if !slices.Contains(current, d) {
			add = append(add, d)
		}
	}
	for _, c := range current {
		if c.Addr().IsLinkLocalUnicast() {
			continue
		}
		if !slices.Contains(desired, c) {
			del = append(del, c)
		}
	}
	return add, del
}

// addrDiff compares the link's addresses with the spec's.
func (h *Host) addrDiff(link netlink.Link, spec LinkSpec) (add, del []netip.Prefix, err error) {
	addrs, err := h.nl.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, fmt.Errorf("netlinkx: list addresses of %s: %w", spec.Name, err)
	}
	var current []netip.Prefix
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok {
			current = append(current, p)
		}
	}
	desired := make([]netip.Prefix, 0, len(spec.Addresses))
	for _, p := range spec.Addresses {
		desired = append(desired, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()))
	}
	add, del = DiffAddrs(desired, current)
	return add, del, nil
}

// EnsureLink sets MTU, addresses and up/down state of an existing link (the
// wg package creates it). Addresses are added before the link goes up so
// routes through it can be installed right after.
func (h *Host) EnsureLink(ctx context.Context, spec LinkSpec) (LinkReport, error) {
	var rep LinkReport
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	link, err := h.nl.LinkByName(spec.Name)
	if err != nil {
		return rep, fmt.Errorf("netlinkx: link %s: %w", spec.Name, err)
	}

	rep.MTU = link.Attrs().MTU
	if spec.MTU > 0 && link.Attrs().MTU != spec.MTU {
		if err := h.nl.LinkSetMTU(link, spec.MTU); err != nil {
			return rep, fmt.Errorf("netlinkx: set MTU %d on %s: %w", spec.MTU, spec.Name, err)
		}
		rep.MTU, rep.MTUChanged = spec.MTU, true
	}

	add, del, err := h.addrDiff(link, spec)
	if err != nil {
		return rep, err
	}
	var errs []error
	// Add before removing, so the link never loses its last IPv4 address
	// (the kernel would flush every route through it, kg's too). Deleting a
	// primary address normally deletes the secondaries of its subnet with
	// it, which would take a new WireGuard IP in the same subnet along:
	// promote_secondaries makes the kernel promote it instead.
	if len(del) > 0 {
		if _, err := h.EnsureSysctls(ctx, []Sysctl{{Key: "net.ipv4.conf." + spec.Name + ".promote_secondaries", Value: "1"}}); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range add {
		// AddrReplace: idempotent and also fixes an existing address whose
		// prefix length or flags differ.
		if err := h.nl.AddrReplace(link, &netlink.Addr{IPNet: ipNet(p)}); err != nil {
			errs = append(errs, fmt.Errorf("netlinkx: add address %s to %s: %w", p, spec.Name, err))
			continue
		}
		rep.AddedAddrs = append(rep.AddedAddrs, p)
	}
	for _, p := range del {
		if err := h.nl.AddrDel(link, &netlink.Addr{IPNet: ipNet(p)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("netlinkx: remove stale address %s from %s: %w", p, spec.Name, err))
			continue
		}
		rep.RemovedAddrs = append(rep.RemovedAddrs, p)
	}

	isUp := link.Attrs().Flags&net.FlagUp != 0
	switch {
	case spec.Up && !isUp:
		if err := h.nl.LinkSetUp(link); err != nil {
			errs = append(errs, fmt.Errorf("netlinkx: set %s up: %w", spec.Name, err))
		} else {
			rep.StateChanged = true
		}
	case !spec.Up && isUp:
		if err := h.nl.LinkSetDown(link); err != nil {
			errs = append(errs, fmt.Errorf("netlinkx: set %s down: %w", spec.Name, err))
		} else {
			rep.StateChanged = true
		}
	}
	return rep, errors.Join(errs...)
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	ip := n.IP
	if bits == 32 {
		ip = ip.To4()
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok || (bits != 32 && bits != 128) {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones), true
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := 128
	if p.Addr().Is4() {
		bits = 32
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func ipOf(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return net.IP(a.Unmap().AsSlice())
}

func addrOf(ip net.IP) netip.Addr {
	if ip == nil {
		return netip.Addr{}
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}
