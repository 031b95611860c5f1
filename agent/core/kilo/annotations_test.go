package kilo

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// testKey returns a distinct valid key per b.
func testKey(b byte) topology.Key {
	var k topology.Key
	for i := range k {
		k[i] = b
	}
	return k
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in      string
		want    Endpoint
		wantErr bool
		format  string // expected FormatEndpoint(parsed); "" = in
	}{
		{in: "", want: Endpoint{}},
		{in: "1.2.3.4:51820", want: Endpoint{IP: netip.MustParseAddr("1.2.3.4"), Port: 51820}},
		{in: "[2001:db8::1]:51820", want: Endpoint{IP: netip.MustParseAddr("2001:db8::1"), Port: 51820}},
		{in: "[::ffff:1.2.3.4]:1", want: Endpoint{IP: netip.MustParseAddr("1.2.3.4"), Port: 1}, format: "1.2.3.4:1"},
		{in: "vpn.example.com:65535", want: Endpoint{DNS: "vpn.example.com", Port: 65535}},
		{in: "node-1:51820", want: Endpoint{DNS: "node-1", Port: 51820}},
		{in: "1.2.3.4:051820", want: Endpoint{IP: netip.MustParseAddr("1.2.3.4"), Port: 51820}, format: "1.2.3.4:51820"},
		{in: "1.2.3.4", wantErr: true},
		{in: "1.2.3.4:0", wantErr: true},
		{in: "1.2.3.4:65536", wantErr: true},
		{in: "1.2.3.4:-1", wantErr: true},
		{in: "1.2.3.4:+1", wantErr: true},
		{in: "1.2.3.4:port", wantErr: true},
		{in: "2001:db8::1:51820", wantErr: true},
		{in: "[fe80::1%eth0]:51820", wantErr: true},
		{in: ":51820", wantErr: true},
		{in: "Upper.Example.com:51820", wantErr: true},
		{in: "under_score.example.com:51820", wantErr: true},
		{in: "-bad.example.com:51820", wantErr: true},
		{in: strings.Repeat("a", 254) + ":1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseEndpoint(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseEndpoint(%q) err = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("ParseEndpoint(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			if tt.wantErr {
				return
			}
			want := tt.format
			if want == "" {
				want = tt.in
			}
			if s := FormatEndpoint(got); s != want {
				t.Fatalf("FormatEndpoint = %q, want %q", s, want)
			}
		})
	}
}

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: "", want: ""},
		{in: "192.168.1.34/24", want: "192.168.1.34/24"}, // host bits kept, as Kilo
		{in: "10.4.0.1/16", want: "10.4.0.1/16"},
		{in: "fd00::1/64", want: "fd00::1/64"},
		{in: "192.168.1.34", wantErr: true},
		{in: "192.168.1.34/33", wantErr: true},
		{in: "::ffff:1.2.3.4/120", wantErr: true},
		{in: "-", wantErr: true},
		{in: "fe80::1%eth0/64", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParsePrefix(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParsePrefix(%q) err = %v, wantErr %v", tt.in, err, tt.wantErr)
			continue
		}
		if s := topology.FormatPrefix(got); s != tt.want {
			t.Errorf("ParsePrefix(%q) = %q, want %q", tt.in, s, tt.want)
		}
	}
}

func TestParseForceInternalIP(t *testing.T) {
	tests := []struct {
		in       string
		want     string
		wantNone bool
		wantErr  bool
	}{
		{in: "", wantNone: true},
		{in: "-", wantNone: true},
		{in: "10.0.0.5/24", want: "10.0.0.5/24"},
		{in: "10.0.0.5", wantErr: true},
	}
	for _, tt := range tests {
		p, none, err := ParseForceInternalIP(tt.in)
		if (err != nil) != tt.wantErr || none != tt.wantNone || topology.FormatPrefix(p) != tt.want {
			t.Errorf("ParseForceInternalIP(%q) = %v, %v, %v", tt.in, p, none, err)
		}
	}
}

func TestParsePersistentKeepalive(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{in: "", want: 0},
		{in: "0", want: 0},
		{in: "25", want: 25},
		{in: "65535", want: 65535},
		{in: "65536", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "25s", wantErr: true},
		{in: "abc", wantErr: true},
		{in: "99999999999999999999", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParsePersistentKeepalive(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParsePersistentKeepalive(%q) = %d, %v; want %d, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseLastSeen(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Time
		wantErr bool
	}{
		{in: "", want: time.Time{}},
		{in: "1700000000", want: time.Unix(1700000000, 0).UTC()},
		{in: "0", want: time.Unix(0, 0).UTC()},
		{in: "1.5", wantErr: true},
		{in: "yesterday", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseLastSeen(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseLastSeen(%q) = %v, %v", tt.in, got, err)
		}
	}
}

func TestParseKeyAnnotation(t *testing.T) {
	k := testKey(7)
	tests := []struct {
		in      string
		want    topology.Key
		wantErr bool
	}{
		{in: "", want: topology.Key{}},
		{in: k.String(), want: k},
		{in: "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=", want: mustKey(t, "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=")},
		{in: "dG9vIHNob3J0", wantErr: true},
		{in: "not base64!", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseKeyAnnotation(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseKeyAnnotation(%q) = %v, %v", tt.in, got, err)
		}
	}
}

func mustKey(t testing.TB, s string) topology.Key {
	t.Helper()
	k, err := topology.ParseKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestParseAllowedLocationIPs(t *testing.T) {
	tests := []struct {
		in      string
		want    []netip.Prefix
		wantErr bool
	}{
		{in: "", want: nil},
		{in: "10.1.0.0/16", want: prefixes("10.1.0.0/16")},
		{in: "10.1.0.0/16,192.168.0.0/24,fd00::/8", want: prefixes("10.1.0.0/16", "192.168.0.0/24", "fd00::/8")},
		// Kilo does not trim: an entry with spaces is dropped (and reported).
		{in: "10.1.0.0/16, 192.168.0.0/24 ,fd00::/8", want: prefixes("10.1.0.0/16", "fd00::/8"), wantErr: true},
		{in: "10.1.2.3/16", want: prefixes("10.1.0.0/16")},
		{in: "10.1.0.0/16,,", want: prefixes("10.1.0.0/16")},
		// Non-CIDRs are dropped but the valid entries stay.
		{in: "10.1.0.0/16,10.2.0.1,bogus,10.3.0.0/16", want: prefixes("10.1.0.0/16", "10.3.0.0/16"), wantErr: true},
		{in: "bogus", want: nil, wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseAllowedLocationIPs(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseAllowedLocationIPs(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseGranularity(t *testing.T) {
	for _, in := range []string{"", "location", "full", "cross"} {
		if g, err := ParseGranularity(in); err != nil || string(g) != in {
			t.Errorf("ParseGranularity(%q) = %q, %v", in, g, err)
		}
	}
	for _, in := range []string{"Location", "logical", "mesh"} {
		if g, err := ParseGranularity(in); err == nil || g != "" {
			t.Errorf("ParseGranularity(%q) = %q, %v; want error", in, g, err)
		}
	}
}

func TestParseDiscoveredEndpoints(t *testing.T) {
	k1, k2 := testKey(1), testKey(2)
	tests := []struct {
		name    string
		in      string
		want    map[topology.Key]netip.AddrPort
		wantErr bool
	}{
		{name: "empty", in: ""},
		{name: "empty object", in: "{}"},
		{name: "kilo format", in: `{"` + k1.String() + `":{"IP":"203.0.113.7","Port":51820,"Zone":""}}`,
			want: map[topology.Key]netip.AddrPort{k1: netip.MustParseAddrPort("203.0.113.7:51820")}},
		{name: "ipv6", in: `{"` + k1.String() + `":{"IP":"2001:db8::7","Port":4000,"Zone":""}}`,
			want: map[topology.Key]netip.AddrPort{k1: netip.MustParseAddrPort("[2001:db8::7]:4000")}},
		{name: "null value skipped", in: `{"` + k1.String() + `":null}`},
		{name: "loopback and link-local dropped, others kept", in: `{"` + k1.String() + `":{"IP":"127.0.0.1","Port":1},"` +
			k2.String() + `":{"IP":"198.51.100.1","Port":2}, "` + testKey(3).String() + `":{"IP":"fe80::1","Port":3,"Zone":"eth0"},"` +
			testKey(4).String() + `":{"IP":"169.254.1.1","Port":4}}`,
			want: map[topology.Key]netip.AddrPort{k2: netip.MustParseAddrPort("198.51.100.1:2")}, wantErr: true},
		{name: "bad key", in: `{"nope":{"IP":"198.51.100.1","Port":2}}`, wantErr: true},
		{name: "bad port", in: `{"` + k1.String() + `":{"IP":"198.51.100.1","Port":0}}`, wantErr: true},
		{name: "bad ip", in: `{"` + k1.String() + `":{"IP":"x","Port":1}}`, wantErr: true},
		{name: "unspecified", in: `{"` + k1.String() + `":{"IP":"0.0.0.0","Port":1}}`, wantErr: true},
		{name: "not json", in: `{`, wantErr: true},
		{name: "wrong type", in: `[]`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseDiscoveredEndpoints(tt.in)
			if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, %v; want %v, err %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestAnnotationRoundTrip checks parse(format(x)) == x for every annotation.
func TestAnnotationRoundTrip(t *testing.T) {
	t.Run("endpoint", func(t *testing.T) {
		for _, e := range []Endpoint{{}, {IP: netip.MustParseAddr("1.2.3.4"), Port: 1}, {IP: netip.MustParseAddr("2001:db8::1"), Port: 65535},
			{DNS: "a.example.com", Port: 51820}} {
			if got, err := ParseEndpoint(FormatEndpoint(e)); err != nil || got != e {
				t.Errorf("round trip %+v = %+v, %v", e, got, err)
			}
		}
	})
	t.Run("prefix", func(t *testing.T) {
		for _, p := range []netip.Prefix{{}, netip.MustParsePrefix("192.168.1.34/24"), netip.MustParsePrefix("fd00::5/64")} {
			if got, err := ParsePrefix(topology.FormatPrefix(p)); err != nil || got != p {
				t.Errorf("round trip %v = %v, %v", p, got, err)
			}
		}
	})
	t.Run("force-internal-ip", func(t *testing.T) {
		for _, c := range []struct {
			p    netip.Prefix
			none bool
		}{{none: true}, {p: netip.MustParsePrefix("10.0.0.1/24")}} {
			p, none, err := ParseForceInternalIP(FormatForceInternalIP(c.p, c.none))
			if err != nil || p != c.p || none != c.none {
				t.Errorf("round trip %+v = %v %v %v", c, p, none, err)
			}
		}
	})
	t.Run("persistent-keepalive", func(t *testing.T) {
		for _, n := range []int{0, 1, 25, 65535} {
			if got, err := ParsePersistentKeepalive(FormatPersistentKeepalive(n)); err != nil || got != n {
				t.Errorf("round trip %d = %d, %v", n, got, err)
			}
		}
	})
	t.Run("last-seen", func(t *testing.T) {
		for _, ts := range []time.Time{time.Unix(0, 0).UTC(), time.Unix(1700000000, 0).UTC(), time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)} {
			if got, err := ParseLastSeen(topology.FormatLastSeen(ts)); err != nil || got != ts {
				t.Errorf("round trip %v = %v, %v", ts, got, err)
			}
		}
	})
	t.Run("key", func(t *testing.T) {
		for _, k := range []topology.Key{{}, testKey(9)} {
			if got, err := ParseKeyAnnotation(FormatKey(k)); err != nil || got != k {
				t.Errorf("round trip %v = %v, %v", k, got, err)
			}
		}
	})
	t.Run("allowed-location-ips", func(t *testing.T) {
		// FormatAllowedLocationIPs sorts, so a sorted masked list round-trips.
		for _, ps := range [][]netip.Prefix{nil, prefixes("10.1.0.0/16"), prefixes("10.1.0.0/16", "192.168.0.0/24", "fd00::/8")} {
			if got, err := ParseAllowedLocationIPs(topology.FormatAllowedLocationIPs(ps)); err != nil || !reflect.DeepEqual(got, ps) {
				t.Errorf("round trip %v = %v, %v", ps, got, err)
			}
		}
	})
	t.Run("discovered-endpoints", func(t *testing.T) {
		for _, m := range []map[topology.Key]netip.AddrPort{nil, {testKey(1): netip.MustParseAddrPort("203.0.113.1:51820"),
			testKey(2): netip.MustParseAddrPort("[2001:db8::2]:1")}} {
			got, err := ParseDiscoveredEndpoints(topology.FormatDiscoveredEndpoints(m))
			if err != nil || !reflect.DeepEqual(got, m) {
				t.Errorf("round trip %v = %v, %v", m, got, err)
			}
		}
	})
	t.Run("granularity", func(t *testing.T) {
		for _, g := range []topology.Granularity{"", topology.GranularityLocation, topology.GranularityFull, topology.GranularityCross} {
			if got, err := ParseGranularity(string(g)); err != nil || got != g {
				t.Errorf("round trip %q = %q, %v", g, got, err)
			}
		}
	})
	t.Run("keepalive-rules", func(t *testing.T) {
		for _, rules := range [][]topology.KeepaliveRule{
			{{Value: 25, Location: "nat"}},
			{{Value: 0, NodeSelector: map[string]string{"a": "b"}}, {Value: 10, NodeSelector: map[string]string{}}, {Value: 5, Location: "x"}},
		} {
			got, err := ParseKeepaliveRules(FormatKeepaliveRules(rules))
			if err != nil || !reflect.DeepEqual(got, rules) {
				t.Errorf("round trip %v = %v, %v", rules, got, err)
			}
		}
	})
}
