package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	xipv4 "golang.org/x/net/ipv4"
	xipv6 "golang.org/x/net/ipv6"
)

// The agent's one ICMP sender: the session probe (wg's repair rule), the
// tunnel probes and the underlay gateway probe (agent/runtime/health). It
// needs CAP_NET_RAW, which the agent has.

// Echo sends one ICMP echo request to each of dsts, from src when src is
// valid (the raw socket bound to src makes the probe leave from it, so a
// peer answers through the tunnel), with payload as its data, on one socket
// per address family. It returns once they are written: the answers are not
// read (where they show — a WireGuard peer's bytes received — is the
// caller's business). A destination that fails does not stop the others.
func Echo(ctx context.Context, src netip.Addr, dsts []netip.Addr, payload string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	socks := map[bool]*icmp.PacketConn{}
	failed := map[bool]error{}
	defer func() {
		for _, c := range socks {
			c.Close()
		}
	}()
	var errs []error
	for _, dst := range dsts {
		six := is6(dst)
		if err := failed[six]; err != nil {
			errs = append(errs, fmt.Errorf("probe %s: %w", dst, err))
			continue
		}
		c := socks[six]
		if c == nil {
			var err error
			if c, err = open(ctx, src, dst); err != nil {
				failed[six] = err
				errs = append(errs, err)
				continue
			}
			socks[six] = c
		}
		if _, _, err := write(ctx, c, dst, payload); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Ping sends one ICMP echo request to dst and reports whether its reply
// (matched by identifier, sequence and source) arrived within timeout.
func Ping(ctx context.Context, dst netip.Addr, timeout time.Duration, payload string) (bool, error) {
	return PingFrom(ctx, netip.Addr{}, dst, timeout, payload)
}

// PingFrom is Ping leaving from src when src is valid (as Echo): through
// the tunnel when src is this leader's WireGuard IP.
func PingFrom(ctx context.Context, src, dst netip.Addr, timeout time.Duration, payload string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, id, n, err := send(ctx, src, dst, payload)
	if err != nil {
		return false, err
	}
	defer c.Close()
	proto, reply := 1, icmp.Type(xipv4.ICMPTypeEchoReply)
	if is6(dst) {
		proto, reply = 58, xipv6.ICMPTypeEchoReply
	}
	buf := make([]byte, 1500)
	for {
		size, from, err := c.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return false, nil // timed out
			}
			return false, fmt.Errorf("ping %s: %w", dst, err)
		}
		ip, ok := from.(*net.IPAddr)
		if !ok {
			continue
		}
		if a, ok := netip.AddrFromSlice(ip.IP); !ok || a.Unmap() != dst.Unmap() {
			continue
		}
		m, err := icmp.ParseMessage(proto, buf[:size])
		if err != nil || m.Type != reply {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq == n {
			return true, nil
		}
	}
}

var echoSeq atomic.Uint32

func is6(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }

// send opens a raw ICMP socket and writes one echo request on it. The
// socket is interrupted (its reads and writes fail) when ctx ends; ctx must
// end (the callers' timeouts) so that its interrupt is released.
func send(ctx context.Context, src, dst netip.Addr, payload string) (*icmp.PacketConn, int, int, error) {
	c, err := open(ctx, src, dst)
	if err != nil {
		return nil, 0, 0, err
	}
	id, n, err := write(ctx, c, dst, payload)
	if err != nil {
		c.Close()
		return nil, 0, 0, err
	}
	return c, id, n, nil
}

// open opens a raw ICMP socket of dst's family, bound to src when valid,
// whose I/O fails once ctx ends.
func open(ctx context.Context, src, dst netip.Addr) (*icmp.PacketConn, error) {
	network, listen := "ip4:icmp", "0.0.0.0"
	if is6(dst) {
		network, listen = "ip6:ipv6-icmp", "::"
	}
	if src.IsValid() {
		if is6(src) != is6(dst) {
			return nil, fmt.Errorf("probe %s → %s: mixed address families", src, dst)
		}
		listen = src.Unmap().String()
	}
	c, err := icmp.ListenPacket(network, listen)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", dst, err)
	}
	// The context bounds the socket's I/O (no deadline computed here: the
	// agent's one clock is its reconcile loop's, docs/architecture.md#one-clock).
	context.AfterFunc(ctx, func() { _ = c.SetDeadline(aLongTimeAgo) })
	if ctx.Err() != nil {
		c.Close()
		return nil, fmt.Errorf("probe %s: %w", dst, ctx.Err())
	}
	return c, nil
}

// write writes one echo request to dst on c and returns its identifier and
// sequence number.
func write(ctx context.Context, c *icmp.PacketConn, dst netip.Addr, payload string) (int, int, error) {
	var typ icmp.Type = xipv4.ICMPTypeEcho
	if is6(dst) {
		typ = xipv6.ICMPTypeEchoRequest
	}
	id, n := os.Getpid()&0xffff, int(echoSeq.Add(1)&0xffff)
	b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: n, Data: []byte(payload)}}).Marshal(nil)
	if err != nil {
		return 0, 0, fmt.Errorf("probe %s: %w", dst, err)
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: net.IP(dst.Unmap().AsSlice())}); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = ctx.Err()
		}
		return 0, 0, fmt.Errorf("probe %s: %w", dst, err)
	}
	return id, n, nil
}

// aLongTimeAgo is a deadline in the past: setting it interrupts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)
