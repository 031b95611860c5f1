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

// TestDecideHost: the private IP is force-internal-ip, else --private-ip,
// else discovered; the endpoint is force-endpoint, else the one kept
// advertised, else the discovered private IP with
// --prioritise-private-addresses, else the public IP, with the listen port;
// the MTU is --mtu, else the default route interface's minus WireGuard's
// 80, else Kilo's 1420.
func TestDecideHost(t *testing.T) {
	ha := func(iface, p string) HostAddress { return HostAddress{Interface: iface, Prefix: pfx(p)} }
	lan := Self{DefaultInterface: "eth0", DefaultMTU: 1500, Addresses: []HostAddress{ha("eth0", "10.0.0.5/24")}}
	mtu := func(s Self, m int) Self { s.DefaultMTU = m; return s }
	public := Self{DefaultInterface: "eth0", DefaultMTU: 1500, Addresses: []HostAddress{ha("eth0", "203.0.113.9/32"), ha("eth0", "10.0.0.5/24")}}
	advertised := public
	advertised.Advertised = "198.51.100.8:51820" // kept from what the node published
	for _, tc := range []struct {
		name string
		self Self
		set  Settings
		pub  *Node // the node as published
		want Host
		bug  string // a known bug: the case shows the right behaviour and is skipped
	}{
		{name: "public IP: the endpoint, with the listen port", self: public,
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "203.0.113.9:51820", MTU: 1420}},
		{name: "private IP only: it is the endpoint", self: lan,
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "10.0.0.5:51820", MTU: 1420}},
		{name: "the listen port is --port", self: lan, set: Settings{Port: 4000},
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "10.0.0.5:4000", MTU: 1420}},
		{name: "an IPv6 public IP is bracketed",
			self: Self{DefaultInterface: "eth0", DefaultMTU: 1500, Addresses: []HostAddress{ha("eth0", "10.0.0.5/24"), ha("eth0", "2001:db8::5/64")}},
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "[2001:db8::5]:51820", MTU: 1420}},
		{name: "force-endpoint wins over the public IP", self: public, pub: &Node{ForceEndpoint: "vpn.example.com:4000"},
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "vpn.example.com:4000", MTU: 1420}},
		{name: "--private-ip wins over discovery, with the interface that carries it",
			self: Self{DefaultInterface: "eth0", DefaultMTU: 1500, Addresses: []HostAddress{ha("eth0", "203.0.113.9/32"), ha("eth0", "10.0.0.5/24"), ha("eth1", "10.1.0.5/16")}},
			set:  Settings{PrivateIP: pfx("10.1.0.5/16")},
			want: Host{Private: ha("eth1", "10.1.0.5/16"), Endpoint: "203.0.113.9:51820", MTU: 1420}},
		{name: "--private-ip and no public IP: the private IP set is the endpoint",
			self: Self{DefaultInterface: "eth0", DefaultMTU: 1500, Addresses: []HostAddress{ha("eth0", "10.0.0.5/24"), ha("eth1", "10.1.0.5/16")}},
			set:  Settings{PrivateIP: pfx("10.1.0.5/16")},
			want: Host{Private: ha("eth1", "10.1.0.5/16"), Endpoint: "10.1.0.5:51820", MTU: 1420}},
		{name: "--private-ip on no interface of the host", self: public, set: Settings{PrivateIP: pfx("10.9.0.5/16")},
			want: Host{Private: HostAddress{Prefix: pfx("10.9.0.5/16")}, Endpoint: "203.0.113.9:51820", MTU: 1420}},
		{name: "--private-ip on a host without addresses: it is the endpoint too", self: Self{}, set: Settings{PrivateIP: pfx("10.9.0.5/16")},
			want: Host{Private: HostAddress{Prefix: pfx("10.9.0.5/16")}, Endpoint: "10.9.0.5:51820", MTU: 1420}},
		{name: "force-internal-ip wins over --private-ip and discovery", self: public, set: Settings{PrivateIP: pfx("10.9.0.5/16")},
			pub:  &Node{InternalIP: pfx("10.0.0.5/24"), InternalIPForced: true},
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "203.0.113.9:51820", MTU: 1420}},
		{name: "force-internal-ip \"-\": no private IP", self: public, pub: &Node{InternalIPForced: true},
			want: Host{Endpoint: "203.0.113.9:51820", MTU: 1420}},
		{name: "a force-endpoint wins over the endpoint kept advertised", self: advertised,
			pub: &Node{ForceEndpoint: "vpn.example.com:4000"}, want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "vpn.example.com:4000", MTU: 1420}},
		{name: "the endpoint kept advertised wins over discovery", self: advertised,
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "198.51.100.8:51820", MTU: 1420}},
		{name: "--prioritise-private-addresses: the discovered private IP", self: public, set: Settings{PrivateEndpoint: true},
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "10.0.0.5:51820", MTU: 1420}},
		{name: "--internal-cidr limits the private IP",
			self: Self{DefaultInterface: "eth0", DefaultMTU: 1500, Addresses: []HostAddress{ha("eth0", "10.0.0.5/24"), ha("eth1", "172.16.0.5/16")}},
			set:  Settings{InternalCIDRs: pfxs("172.16.0.0/12")},
			want: Host{Private: ha("eth1", "172.16.0.5/16"), Endpoint: "172.16.0.5:51820", MTU: 1420}},
		{name: "no address: no private IP, no endpoint", self: Self{DefaultMTU: 1500}, want: Host{MTU: 1420}},
		{name: "no address, force-endpoint: it is the endpoint", self: Self{}, pub: &Node{ForceEndpoint: "198.51.100.7:51820"},
			want: Host{Endpoint: "198.51.100.7:51820", MTU: defaultMTU}},
		{name: "MTU: --mtu wins", self: lan, set: Settings{MTU: 1380},
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "10.0.0.5:51820", MTU: 1380}},
		{name: "MTU: jumbo frames minus WireGuard's overhead", self: mtu(lan, 9000),
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "10.0.0.5:51820", MTU: 8920}},
		{name: "MTU: the underlay's unknown, Kilo's default", self: mtu(lan, 0),
			want: Host{Private: ha("eth0", "10.0.0.5/24"), Endpoint: "10.0.0.5:51820", MTU: 1420}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.bug != "" {
				t.Skip("BUG: " + tc.bug)
			}
			set := Defaults(tc.set)
			check(t, "host", DecideHost(tc.self, set, tc.pub), tc.want)
		})
	}
}
