package netlinkx

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestEchoAndPing: the one ICMP sender against the loopback, which
// answers; a context that has ended sends nothing; an address that never
// answers times out without error.
func TestEchoAndPing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: raw ICMP sockets (CI runs as root)")
	}
	ctx := context.Background()
	lo, nowhere := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.51.100.1") // TEST-NET-2: nothing answers an echo (an ICMP error is not a reply)
	if ok, err := Ping(ctx, lo, 2*time.Second, "test"); err != nil || !ok {
		t.Errorf("Ping(%s) = %v, %v; want an answer", lo, ok, err)
	}
	if ok, err := Ping(ctx, netip.MustParseAddr("::1"), 2*time.Second, "test"); err != nil || !ok {
		t.Errorf("Ping(::1) = %v, %v; want an answer", ok, err)
	}
	lo6 := netip.MustParseAddr("::1")
	if err := Echo(ctx, lo, []netip.Addr{lo, lo}, "test"); err != nil {
		t.Errorf("Echo from and to %s: %v", lo, err)
	}
	if err := Echo(ctx, netip.Addr{}, []netip.Addr{lo, lo6, lo}, "test"); err != nil {
		t.Errorf("Echo to both families: %v", err)
	}
	if err := Echo(ctx, lo6, []netip.Addr{lo, lo6}, "test"); err == nil {
		t.Error("Echo from an IPv6 source to an IPv4 address: no error")
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := Echo(done, netip.Addr{}, []netip.Addr{lo}, "test"); err == nil {
		t.Error("Echo with an ended context: no error")
	}
	if ok, err := Ping(ctx, nowhere, 200*time.Millisecond, "test"); ok {
		t.Errorf("Ping(%s) answered (%v)", nowhere, err)
	}
}
