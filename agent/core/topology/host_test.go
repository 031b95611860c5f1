package topology

import (
	"net/netip"
	"testing"
)

// TestHostIPs is kg's getIP: private and public IP from the hostname's
// addresses, then the default route's interface, then any interface; IPv4
// first; only RFC 1918 (and fd00::/16) is private, so CGNAT is public.
func TestHostIPs(t *testing.T) {
	ha := func(iface, p string) HostAddress {
		return HostAddress{Interface: iface, Prefix: netip.MustParsePrefix(p)}
	}
	tests := []struct {
		name     string
		self     Self
		allowed  []netip.Prefix
		priv     string
		pub      string
		disabled bool
	}{
		{name: "private only: it is also the public IP", priv: "192.168.1.5/24", pub: "192.168.1.5/24",
			self: Self{DefaultInterface: "eth0", Addresses: []HostAddress{ha("eth0", "192.168.1.5/24")}}},
		{name: "public on the default route's interface", priv: "10.0.0.5/16", pub: "203.0.113.9/32",
			self: Self{DefaultInterface: "eth0", Addresses: []HostAddress{ha("eth0", "203.0.113.9/32"), ha("eth0", "10.0.0.5/16")}}},
		{name: "default route's interface before others", priv: "10.1.0.5/24", pub: "10.1.0.5/24",
			self: Self{DefaultInterface: "eth1", Addresses: []HostAddress{ha("eth0", "10.0.0.5/24"), ha("eth1", "10.1.0.5/24")}}},
		{name: "hostname's address first", priv: "10.0.0.5/24", pub: "10.0.0.5/24",
			self: Self{DefaultInterface: "eth1", HostnameAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.5")},
				Addresses: []HostAddress{ha("eth0", "10.0.0.5/24"), ha("eth1", "10.1.0.5/24")}}},
		{name: "CGNAT is public (Kilo's rule)", priv: "192.168.1.5/24", pub: "100.64.3.4/10",
			self: Self{DefaultInterface: "eth0", Addresses: []HostAddress{ha("eth0", "192.168.1.5/24"), ha("eth0", "100.64.3.4/10")}}},
		{name: "IPv4 before IPv6", priv: "192.168.1.5/24", pub: "203.0.113.9/32",
			self: Self{DefaultInterface: "eth0", Addresses: []HostAddress{ha("eth0", "2001:db8::5/64"), ha("eth0", "203.0.113.9/32"), ha("eth0", "192.168.1.5/24")}}},
		{name: "--internal-cidr limits the private IP", allowed: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}, priv: "172.16.0.5/16", pub: "172.16.0.5/16",
			self: Self{DefaultInterface: "eth0", Addresses: []HostAddress{ha("eth0", "192.168.1.5/24"), ha("eth1", "172.16.0.5/16")}}},
		{name: "no address", disabled: true, self: Self{DefaultInterface: "eth0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			priv, pub, ok := hostIPs(tt.self, tt.allowed)
			if ok == tt.disabled {
				t.Fatalf("ok = %v", ok)
			}
			if tt.disabled {
				return
			}
			if priv.Prefix.String() != tt.priv || pub.Prefix.String() != tt.pub {
				t.Errorf("private %v public %v, want %s %s", priv.Prefix, pub.Prefix, tt.priv, tt.pub)
			}
		})
	}
}
