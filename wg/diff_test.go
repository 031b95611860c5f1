package wg

import (
	"errors"
	"net"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func testKey(b byte) wgtypes.Key {
	var k wgtypes.Key
	k[0] = b
	k[31] = b
	return k
}

func udp(s string) *net.UDPAddr { return net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func ipnets(ss ...string) []net.IPNet {
	var out []net.IPNet
	for _, s := range ss {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			panic(err)
		}
		out = append(out, *n)
	}
	return out
}

func dur(s int) *time.Duration { d := time.Duration(s) * time.Second; return &d }

func TestDiff(t *testing.T) {
	priv := wgtypes.Key{1, 2, 3}
	a, b, c := testKey(0xa), testKey(0xb), testKey(0xc)
	psk := testKey(0xee)

	// devPeer is peer a as a device holds it after a previous apply.
	devPeer := func(k wgtypes.Key, ep string, keep int, ips ...string) wgtypes.Peer {
		p := wgtypes.Peer{PublicKey: wgtypes.Key(k), PersistentKeepaliveInterval: time.Duration(keep) * time.Second, AllowedIPs: ipnets(ips...)}
		if ep != "" {
			p.Endpoint = udp(ep)
		}
		return p
	}
	want := func(k wgtypes.Key, ep string, keep int, roaming bool, ips ...string) ResolvedPeer {
		p := ResolvedPeer{PeerSpec: PeerSpec{Name: "peer-" + k.String()[:2], PublicKey: k, Endpoint: ep, PersistentKeepalive: time.Duration(keep) * time.Second, Roaming: roaming, AllowedIPs: pfx(ips...)}}
		if ep != "" {
			p.Addr = udp(ep)
		}
		return p
	}
	base := wgtypes.Device{Name: "kilo0", PrivateKey: priv, ListenPort: 51820}
	withPeers := func(ps ...wgtypes.Peer) *wgtypes.Device { d := base; d.Peers = ps; return &d }

	tests := []struct {
		name     string
		in       DiffInput
		cur      *wgtypes.Device
		wantCfg  wgtypes.Config
		wantAdd  int
		wantUpd  []string // fields of the single updated peer
		wantRem  int
		wantKept int
	}{
		{
			name: "nothing to do",
			in:   DiffInput{PrivateKey: priv, ListenPort: 51820, Peers: []ResolvedPeer{want(a, "192.0.2.1:51820", 0, false, "10.4.0.1/32")}},
			cur:  withPeers(devPeer(a, "192.0.2.1:51820", 0, "10.4.0.1/32")),
		},
		{
			name: "allowed IPs equal in another order and IPv4 as 16 bytes",
			in:   DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(a, "", 0, true, "10.4.0.1/32", "10.2.0.0/24")}},
			cur: withPeers(wgtypes.Peer{PublicKey: wgtypes.Key(a), AllowedIPs: []net.IPNet{
				{IP: net.ParseIP("10.2.0.0"), Mask: net.CIDRMask(24, 32)}, {IP: net.ParseIP("10.4.0.1").To4(), Mask: net.CIDRMask(32, 32)},
			}}),
		},
		{
			name: "new device: key, port and peer",
			in:   DiffInput{PrivateKey: priv, ListenPort: 51820, Peers: []ResolvedPeer{want(a, "192.0.2.1:51820", 25, true, "10.4.0.1/32")}},
			cur:  &wgtypes.Device{Name: "kilo0"},
			wantCfg: wgtypes.Config{PrivateKey: &priv, ListenPort: ptr(51820), Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(a), Endpoint: udp("192.0.2.1:51820"), PersistentKeepaliveInterval: dur(25),
				ReplaceAllowedIPs: true, AllowedIPs: ipnets("10.4.0.1/32"),
			}}},
			wantAdd: 1,
		},
		{
			name: "only the third peer's allowed IPs change",
			in: DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{
				want(a, "192.0.2.1:51820", 0, false, "10.4.0.1/32"),
				want(c, "", 0, true, "10.4.0.3/32", "10.3.0.0/24"),
			}},
			cur: withPeers(devPeer(a, "192.0.2.1:51820", 0, "10.4.0.1/32"), devPeer(c, "", 0, "10.4.0.3/32")),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(c), UpdateOnly: true, ReplaceAllowedIPs: true, AllowedIPs: ipnets("10.4.0.3/32", "10.3.0.0/24"),
			}}},
			wantUpd: []string{FieldAllowedIPs},
		},
		{
			name: "keepalive change only: allowed IPs not replaced",
			in:   DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(c, "", 10, true, "10.4.0.3/32")}},
			cur:  withPeers(devPeer(c, "", 0, "10.4.0.3/32")),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(c), UpdateOnly: true, PersistentKeepaliveInterval: dur(10),
			}}},
			wantUpd: []string{FieldKeepalive},
		},
		{
			name:    "absent peer removed, never ReplacePeers",
			in:      DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(a, "", 0, true, "10.4.0.1/32")}, Names: map[wgtypes.Key]string{c: "old"}},
			cur:     withPeers(devPeer(a, "", 0, "10.4.0.1/32"), devPeer(c, "", 0, "10.4.0.3/32")),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: wgtypes.Key(c), Remove: true}}},
			wantRem: 1,
		},
		{
			name: "non-roaming endpoint overwritten",
			in:   DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(a, "192.0.2.1:51820", 0, false, "10.4.0.1/32")}},
			cur:  withPeers(devPeer(a, "198.51.100.7:40000", 0, "10.4.0.1/32")),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(a), UpdateOnly: true, Endpoint: udp("192.0.2.1:51820"),
			}}},
			wantUpd: []string{FieldEndpoint},
		},
		{
			name:     "roaming peer keeps learned endpoint after restart (no memory)",
			in:       DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(a, "192.0.2.1:51820", 25, true, "10.4.0.1/32")}},
			cur:      withPeers(devPeer(a, "198.51.100.7:40000", 25, "10.4.0.1/32")),
			wantKept: 1,
		},
		{
			name: "roaming peer keeps learned endpoint when configured endpoint unchanged",
			in: DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(a, "192.0.2.1:51820", 25, true, "10.4.0.1/32")},
				LastEndpoints: map[wgtypes.Key]string{a: "192.0.2.1:51820"}},
			cur:      withPeers(devPeer(a, "198.51.100.7:40000", 25, "10.4.0.1/32")),
			wantKept: 1,
		},
		{
			name: "roaming peer endpoint overwritten when configured endpoint changed",
			in: DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(a, "192.0.2.9:51820", 25, true, "10.4.0.1/32")},
				LastEndpoints: map[wgtypes.Key]string{a: "192.0.2.1:51820"}},
			cur: withPeers(devPeer(a, "198.51.100.7:40000", 25, "10.4.0.1/32")),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(a), UpdateOnly: true, Endpoint: udp("192.0.2.9:51820"),
			}}},
			wantUpd: []string{FieldEndpoint},
		},
		{
			name: "roaming peer without device endpoint gets the configured one",
			in:   DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{want(a, "192.0.2.1:51820", 25, true, "10.4.0.1/32")}},
			cur:  withPeers(devPeer(a, "", 25, "10.4.0.1/32")),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(a), UpdateOnly: true, Endpoint: udp("192.0.2.1:51820"),
			}}},
			wantUpd: []string{FieldEndpoint},
		},
		{
			name: "preshared key set and removed",
			in: DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{
				func() ResolvedPeer { p := want(a, "", 0, true, "10.4.0.1/32"); p.PresharedKey = &psk; return p }(),
			}},
			cur: withPeers(devPeer(a, "", 0, "10.4.0.1/32")),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(a), UpdateOnly: true, PresharedKey: ptr(wgtypes.Key(psk)),
			}}},
			wantUpd: []string{FieldPresharedKey},
		},
		{
			name: "unresolved endpoint: peer still added without endpoint",
			in: DiffInput{PrivateKey: priv, Peers: []ResolvedPeer{
				{PeerSpec: PeerSpec{PublicKey: b, Endpoint: "nowhere.invalid:1", AllowedIPs: pfx("10.4.0.2/32")}, ResolveErr: errors.New("no such host")},
			}},
			cur: withPeers(),
			wantCfg: wgtypes.Config{Peers: []wgtypes.PeerConfig{{
				PublicKey: wgtypes.Key(b), ReplaceAllowedIPs: true, AllowedIPs: ipnets("10.4.0.2/32"),
			}}},
			wantAdd: 1,
		},
		{
			name:    "listen port only when different",
			in:      DiffInput{PrivateKey: priv, ListenPort: 51821},
			cur:     withPeers(),
			wantCfg: wgtypes.Config{ListenPort: ptr(51821)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, rep := Diff(tt.in, tt.cur)
			if cfg.ReplacePeers {
				t.Fatal("Diff must never set ReplacePeers")
			}
			if !reflect.DeepEqual(cfg, tt.wantCfg) {
				t.Errorf("config:\n got %+v\nwant %+v", cfg, tt.wantCfg)
			}
			if len(rep.Added) != tt.wantAdd || len(rep.Removed) != tt.wantRem || len(rep.KeptEndpoints) != tt.wantKept {
				t.Errorf("report added/removed/kept = %d/%d/%d, want %d/%d/%d", len(rep.Added), len(rep.Removed), len(rep.KeptEndpoints), tt.wantAdd, tt.wantRem, tt.wantKept)
			}
			var gotUpd []string
			if len(rep.Updated) == 1 {
				gotUpd = rep.Updated[0].Fields
			} else if len(rep.Updated) > 1 {
				t.Fatalf("updated %d peers, want at most 1", len(rep.Updated))
			}
			if !reflect.DeepEqual(gotUpd, tt.wantUpd) {
				t.Errorf("updated fields = %v, want %v", gotUpd, tt.wantUpd)
			}
			if got, want := rep.PeersTouched(), len(tt.wantCfg.Peers); got != want {
				t.Errorf("PeersTouched = %d, config has %d peers", got, want)
			}
			if rep.Removed != nil && tt.in.Names != nil && rep.Removed[0].Name != tt.in.Names[rep.Removed[0].PublicKey] {
				t.Errorf("removed peer name = %q", rep.Removed[0].Name)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestDiffAppliedFollowsPlanOrder: the memory's position cache (order)
// never hides a change — plans reordered, a peer changed, removed, and
// re-added at the position its removed self still occupies in the cache.
func TestDiffAppliedFollowsPlanOrder(t *testing.T) {
	peer := func(name string, k byte, ips ...string) ResolvedPeer {
		return ResolvedPeer{PeerSpec: PeerSpec{Name: name, PublicKey: testKey(k), AllowedIPs: pfx(ips...)}}
	}
	a, b, c := peer("a", 1, "10.0.1.0/24"), peer("b", 2, "10.0.2.0/24"), peer("c", 3, "10.0.3.0/24")
	b2 := peer("b", 2, "10.0.22.0/24")
	a2 := peer("a", 1, "10.0.11.0/24")
	mem := newApplied(DiffInput{ListenPort: 51820, Peers: []ResolvedPeer{a, b, c}}, 51820)
	type want struct{ added, updated, removed []string }
	names := func(cs []PeerChange) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	for _, step := range []struct {
		name  string
		peers []ResolvedPeer
		want  want
	}{
		{"same plan", []ResolvedPeer{a, b, c}, want{}},
		{"reordered", []ResolvedPeer{c, a, b}, want{}},
		{"one changed", []ResolvedPeer{c, a, b2}, want{updated: []string{"b"}}},
		{"one removed", []ResolvedPeer{c, b2}, want{removed: []string{"a"}}},
		{"re-added elsewhere, changed", []ResolvedPeer{a2, c, b2}, want{added: []string{"a"}}},
		{"last removed", []ResolvedPeer{a2, c}, want{removed: []string{"b"}}},
		// The cache's slot 2 still holds the removed b: it must not pass
		// for the applied b.
		{"re-added where its removed self is cached", []ResolvedPeer{a2, c, b2}, want{added: []string{"b"}}},
		{"settled", []ResolvedPeer{a2, c, b2}, want{}},
	} {
		specs := make([]PeerSpec, len(step.peers))
		for i, p := range step.peers {
			specs[i] = p.PeerSpec
		}
		d := diffApplied(planInput{ListenPort: 51820, Peers: specs,
			Resolve: func(p PeerSpec, _ *appliedPeer) ResolvedPeer { return ResolvedPeer{PeerSpec: p} }}, mem)
		if d.needRead {
			t.Fatalf("%s: needRead", step.name)
		}
		got := want{names(d.rep.Added), names(d.rep.Updated), names(d.rep.Removed)}
		if !reflect.DeepEqual(got, step.want) {
			t.Fatalf("%s: added %v updated %v removed %v, want %+v", step.name, got.added, got.updated, got.removed, step.want)
		}
		// What Manager.remember does after a successful apply.
		for _, r := range d.rep.Removed {
			mem.remove(r.PublicKey)
		}
		for _, p := range d.changed {
			mem.set(p)
		}
	}
}

// TestDiffAppliedResolvesOnlyUnsettled: an apply against memory resolves
// (and copies) only the peers that are not settled — new, changed, a host
// name (re-resolved every apply, and so one whose resolution failed) — so a
// one-peer change costs one resolution on any size of device.
func TestDiffAppliedResolvesOnlyUnsettled(t *testing.T) {
	spec := func(name string, k byte, endpoint string, ips ...string) PeerSpec {
		return PeerSpec{Name: name, PublicKey: testKey(k), Endpoint: endpoint, AllowedIPs: pfx(ips...)}
	}
	lit := spec("lit", 1, "192.0.2.1:51820", "10.0.1.0/24")
	none := spec("none", 2, "", "10.0.2.0/24")
	host := spec("host", 3, "node.example:51820", "10.0.3.0/24")
	flaky := spec("flaky", 4, "flaky.example:51820", "10.0.4.0/24")
	none2 := none
	lit2 := lit
	lit2.Endpoint = "192.0.2.2:51820"
	litBad := lit
	litBad.Endpoint = "192.0.2.2:0"
	none2.PersistentKeepalive = 25 * time.Second
	none3 := none2
	none3.Name = "none-renamed"
	failing := true
	resolve := func(p PeerSpec, prev *appliedPeer) ResolvedPeer {
		r := ResolvedPeer{PeerSpec: p}
		switch {
		case p.Endpoint == "":
		case p.Endpoint == flaky.Endpoint && failing, p.Endpoint == litBad.Endpoint:
			r.ResolveErr = errors.New("no such host")
		case p.Endpoint == lit.Endpoint, p.Endpoint == lit2.Endpoint:
			r.Addr, r.literal = net.UDPAddrFromAddrPort(netip.MustParseAddrPort(p.Endpoint)), true
			if prev != nil && prev.literal && prev.Endpoint == p.Endpoint {
				r.Addr = prev.Addr
			}
		default:
			r.Addr = net.UDPAddrFromAddrPort(netip.MustParseAddrPort("192.0.2.9:51820"))
		}
		return r
	}
	var first []ResolvedPeer
	for _, p := range []PeerSpec{lit, none, host, flaky} {
		first = append(first, resolve(p, nil))
	}
	mem := newApplied(DiffInput{ListenPort: 51820, Peers: first}, 51820)
	for _, step := range []struct {
		name     string
		peers    []PeerSpec
		recovers bool
		want     []string // resolved, in plan order
	}{
		{"host names only", []PeerSpec{lit, none, host, flaky}, false, []string{"host", "flaky"}},
		{"one changed", []PeerSpec{lit, none2, host, flaky}, false, []string{"none", "host", "flaky"}},
		{"resolution recovers", []PeerSpec{lit, none2, host, flaky}, true, []string{"host", "flaky"}},
		{"settled but the host names", []PeerSpec{lit, none2, host, flaky}, true, []string{"host", "flaky"}},
		{"reordered", []PeerSpec{flaky, host, none2, lit}, true, []string{"flaky", "host"}},
		{"literal changed", []PeerSpec{flaky, host, none2, lit2}, true, []string{"flaky", "host", "lit"}},
		{"literal fails", []PeerSpec{flaky, host, none2, litBad}, true, []string{"flaky", "host", "lit"}},
		// The memory kept lit2's address, but the last resolution failed.
		{"literal as before the failure", []PeerSpec{flaky, host, none2, lit2}, true, []string{"flaky", "host", "lit"}},
		{"settled literal", []PeerSpec{flaky, host, none2, lit2}, true, []string{"flaky", "host"}},
		{"renamed", []PeerSpec{flaky, host, none3, lit2}, true, []string{"flaky", "host", "none-renamed"}},
	} {
		failing = !step.recovers
		var got []string
		d := diffApplied(planInput{ListenPort: 51820, Peers: step.peers, LastEndpoints: map[wgtypes.Key]string{},
			Resolve: func(p PeerSpec, prev *appliedPeer) ResolvedPeer {
				got = append(got, p.Name)
				return resolve(p, prev)
			}}, mem)
		if d.needRead {
			t.Fatalf("%s: needRead", step.name)
		}
		if !reflect.DeepEqual(got, step.want) {
			t.Fatalf("%s: resolved %v, want %v", step.name, got, step.want)
		}
		for _, p := range d.changed {
			mem.set(p)
		}
	}
}
