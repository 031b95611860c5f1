package wg

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ProbeICMP sends one ICMP echo request to addr and returns at once: the
// answer is not read here, it shows as bytes received on the WireGuard peer
// that routes addr (session.go). It needs CAP_NET_RAW, which the agent has.
func ProbeICMP(ctx context.Context, addr netip.Addr) error {
	network, listen := "ip4:icmp", "0.0.0.0"
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if addr.Is6() && !addr.Is4In6() {
		network, listen, typ = "ip6:ipv6-icmp", "::", ipv6.ICMPTypeEchoRequest
	}
	c, err := icmp.ListenPacket(network, listen)
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	defer c.Close()
	deadline := time.Now().Add(time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.SetWriteDeadline(deadline); err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("meshlet session probe")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: net.IP(addr.Unmap().AsSlice())}); err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	return nil
}
