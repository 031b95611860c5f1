package netlinkx

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// DefaultGateway returns the gateway of the IPv4 default route (invalid
// when there is none or it is on-link): the underlay's next hop, which a
// node's health probe pings (docs/failover.md#health).
func (h *Host) DefaultGateway() (netip.Addr, error) {
	routes, err := h.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: nil}, 0)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("netlinkx: listing routes: %w", err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.Gw != nil {
			if a, ok := netip.AddrFromSlice(r.Gw); ok {
				return a.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, nil
}
