package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/netlinkx"
)

// updateCompat rewrites the "meshlet" block of the deviation cases from the
// planner's output: go test ./cmd/meshlet -run KiloCompat -update-compat.
// Review the diff: each change is a change of a documented deviation.
var updateCompat = flag.Bool("update-compat", false, "rewrite the expected meshlet output of deviation cases in testdata/kilo-compat")

// compatPending runs the cases marked pending too (they fail where meshlet
// does not yet do what Kilo does): go test ./cmd/meshlet -run KiloCompat
// -compat-pending.
var compatPending = flag.Bool("compat-pending", false, "also run the kilo-compat cases marked pending")

// compatCase is one file of testdata/kilo-compat: an input on which Kilo
// 0.7's topology code was run, and what it computed (docs/kilo-compatibility.md
// says how the cases were made).
type compatCase struct {
	Name  string          `json:"name"`
	Node  string          `json:"node"`
	Flags []string        `json:"flags"`
	Input json.RawMessage `json:"input"`
	// Kg names the kg the case was recorded with when it is not Kilo 0.7
	// (the X cases: Cozystack's kg, Kilo with Cozystack's cross patch).
	Kg string `json:"kg,omitempty"`
	// Kilo is that kg's output for Node (Kilo 0.7's unless Kg says).
	Kilo compatPlan `json:"kilo"`
	// KiloPanic is how that kg crashed on the input instead (Kilo is then
	// empty): meshlet must plan it, as a deviation.
	KiloPanic string `json:"kiloPanic,omitempty"`
	// Deviation names the section of docs/kilo-compatibility.md that
	// explains why meshlet computes Meshlet instead; empty means meshlet
	// must compute exactly Kilo.
	Deviation string      `json:"deviation,omitempty"`
	Meshlet   *compatPlan `json:"meshlet,omitempty"`
	// Rejections are the reasons meshlet reports for the deviation.
	Rejections []string `json:"rejections,omitempty"`
	// Pending says why meshlet cannot compute Kilo's output for this case
	// yet (a flag it lacks, a known bug): TestKiloCompat skips the case
	// with that reason, unless -compat-pending.
	Pending string `json:"pending,omitempty"`
	// Verdict is what the case was recorded for (cases that came from a
	// side-by-side disagreement say whether meshlet should match Kilo);
	// for people, kept by -update-compat.
	Verdict string `json:"verdict,omitempty"`
}

// compatPlan is the part of a plan both Kilo and meshlet compute, in a
// canonical form: peers by key, allowed IPs, routes and rules sorted.
type compatPlan struct {
	Leader      bool          `json:"leader"`
	WireGuardIP string        `json:"wireguardIP"`
	Peers       []compatPeer  `json:"peers"`
	Routes      []compatRoute `json:"routes"`
	Rules       []compatRule  `json:"rules"`
	// IPTables are Kilo's iptables rules (Topology.Rules): one string per
	// rule, "v4 nat KILO-NAT -d 10.4.0.1/32 -j RETURN" (protocol, table,
	// chain, the rule without its comment), sorted; chains themselves are
	// not listed. Optional: a case without it does not compare iptables.
	IPTables []string `json:"iptables,omitempty"`
}

type compatPeer struct {
	PublicKey           string   `json:"publicKey"`
	AllowedIPs          []string `json:"allowedIPs"`
	Endpoint            string   `json:"endpoint"`
	PersistentKeepalive int      `json:"persistentKeepalive"`
}

type compatRoute struct {
	Dst    string `json:"dst"`
	Gw     string `json:"gw"`
	Dev    string `json:"dev"`
	Src    string `json:"src"`
	Table  int    `json:"table"`
	OnLink bool   `json:"onlink"`
}

type compatRule struct {
	Iif   string `json:"iif"`
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	Table int    `json:"table"`
}

func (p *compatPlan) canonical() {
	for i := range p.Peers {
		slices.Sort(p.Peers[i].AllowedIPs)
		if p.Peers[i].AllowedIPs == nil {
			p.Peers[i].AllowedIPs = []string{}
		}
	}
	slices.SortFunc(p.Peers, func(a, b compatPeer) int { return strings.Compare(a.PublicKey, b.PublicKey) })
	slices.SortFunc(p.Routes, func(a, b compatRoute) int {
		return strings.Compare(fmt.Sprintf("%05d %s %s %s %s", a.Table, a.Dst, a.Dev, a.Gw, a.Src), fmt.Sprintf("%05d %s %s %s %s", b.Table, b.Dst, b.Dev, b.Gw, b.Src))
	})
	slices.SortFunc(p.Rules, func(a, b compatRule) int {
		return strings.Compare(fmt.Sprintf("%05d %s %s %s", a.Table, a.Iif, a.Src, a.Dst), fmt.Sprintf("%05d %s %s %s", b.Table, b.Iif, b.Src, b.Dst))
	})
	for _, s := range []*[]compatPeer{&p.Peers} {
		if *s == nil {
			*s = []compatPeer{}
		}
	}
	if p.Routes == nil {
		p.Routes = []compatRoute{}
	}
	if p.Rules == nil {
		p.Rules = []compatRule{}
	}
	if p.IPTables != nil {
		p.IPTables = canonicalIPTables(p.IPTables)
	}
}

// kiloNAT is Kilo's nat chain; meshlet's is netlinkx.ChainNAT.
const kiloNAT = "KILO-NAT"

// natRules renders a plan's NAT as netlinkx's actuator installs it
// (netlinkx/iptables.go, desiredChains), in Kilo's rule strings with
// meshlet's chain named as Kilo's: POSTROUTING jumps for traffic from
// NAT.Sources and to NAT.Destinations (not from them: Cozystack's kg's
// rule, docs/kilo-compatibility.md#alip-nat); in the chain, RETURN for each of
// NAT.Exceptions, then MASQUERADE; per family, and the chain only where
// something jumps to it. Plan.Forward (Kilo's --cni=true
// --iptables-forward-rules) is netlinkx's MESHLET-FORWARD chain, jumped to
// first from FORWARD: read as Kilo's rules in FORWARD, an ACCEPT from and
// one to each prefix.
func natRules(nat topology.NAT, forward ...netip.Prefix) []string {
	rules := []string{}
	for _, p := range forward {
		fam := "v4"
		if !p.Addr().Is4() {
			fam = "v6"
		}
		rules = append(rules, fam+" filter FORWARD -s "+p.Masked().String()+" -j ACCEPT", fam+" filter FORWARD -d "+p.Masked().String()+" -j ACCEPT")
	}
	for _, f := range []struct {
		name string
		is4  bool
	}{{"v4", true}, {"v6", false}} {
		in := func(p netip.Prefix) bool { return p.Addr().Is4() == f.is4 }
		var jumps []string
		for _, s := range nat.Sources {
			if in(s) {
				jumps = append(jumps, f.name+" nat POSTROUTING -s "+s.Masked().String()+" -j "+netlinkx.ChainNAT)
			}
		}
		for _, d := range nat.Destinations {
			if in(d) {
				jumps = append(jumps, f.name+" nat POSTROUTING -d "+d.Masked().String()+" ! -s "+d.Masked().String()+" -j "+netlinkx.ChainNAT)
			}
		}
		if len(jumps) == 0 {
			continue
		}
		rules = append(rules, jumps...)
		for _, e := range nat.Exceptions {
			if in(e) {
				rules = append(rules, f.name+" nat "+netlinkx.ChainNAT+" -d "+e.Masked().String()+" -j RETURN")
			}
		}
		rules = append(rules, f.name+" nat "+netlinkx.ChainNAT+" -j MASQUERADE")
	}
	for i, r := range rules {
		rules[i] = strings.ReplaceAll(r, netlinkx.ChainNAT, kiloNAT)
	}
	return rules
}

// canonicalIPTables is the form both sides are compared in: what iptables
// keeps of a rule (an address with host bits as its network: iptables
// stores 10.5.0.1/24 as 10.5.0.0/24), and only what takes effect: Kilo
// creates KILO-NAT in both families, with its MASQUERADE, even where
// nothing jumps to it; such a chain's rules are dropped. Sorted, unique.
func canonicalIPTables(rules []string) []string {
	jumped := map[string]bool{}
	fields := make([][]string, len(rules))
	for i, r := range rules {
		fields[i] = strings.Fields(r)
		for j, a := range fields[i] {
			if (a == "-s" || a == "-d") && j+1 < len(fields[i]) {
				if p, err := netip.ParsePrefix(fields[i][j+1]); err == nil {
					fields[i][j+1] = p.Masked().String()
				}
			}
		}
		if f := fields[i]; len(f) > 3 && f[1] == "nat" && f[2] != kiloNAT && f[len(f)-2] == "-j" && f[len(f)-1] == kiloNAT {
			jumped[f[0]] = true
		}
	}
	out := []string{}
	for _, f := range fields {
		if len(f) > 2 && f[1] == "nat" && f[2] == kiloNAT && !jumped[f[0]] {
			continue
		}
		out = append(out, strings.Join(f, " "))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func addrString(a fmt.Stringer, valid bool) string {
	if !valid {
		return ""
	}
	return a.String()
}

// toCompat reduces a meshlet plan to what Kilo computes.
func toCompat(pl topology.Plan) compatPlan {
	c := compatPlan{Leader: pl.Leader, WireGuardIP: addrString(pl.WireGuardIP, pl.WireGuardIP.IsValid())}
	for _, wp := range pl.WireGuard.Peers {
		cp := compatPeer{PublicKey: wp.PublicKey.String(), Endpoint: wp.Endpoint, PersistentKeepalive: wp.PersistentKeepalive}
		for _, a := range wp.AllowedIPs {
			cp.AllowedIPs = append(cp.AllowedIPs, a.String())
		}
		c.Peers = append(c.Peers, cp)
	}
	for _, r := range pl.Routes {
		c.Routes = append(c.Routes, compatRoute{Dst: r.Dst.String(), Gw: addrString(r.Gw, r.Gw.IsValid()), Dev: r.Dev,
			Src: addrString(r.Src, r.Src.IsValid()), Table: r.Table, OnLink: r.OnLink})
	}
	for _, r := range pl.Rules {
		c.Rules = append(c.Rules, compatRule{Iif: r.Iif, Src: addrString(r.Src, r.Src.IsValid()), Dst: addrString(r.Dst, r.Dst.IsValid()), Table: r.Table})
	}
	c.IPTables = natRules(pl.NAT, pl.Forward...)
	c.canonical()
	return c
}

// newestLastSeen is the time a case was made at: its newest last-seen.
func newestLastSeen(t *testing.T, input []byte) string {
	var list struct {
		Items []struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(input, &list); err != nil {
		t.Fatal(err)
	}
	var newest int64
	for _, it := range list.Items {
		if v, err := strconv.ParseInt(it.Metadata.Annotations[topology.AnnotationLastSeen], 10, 64); err == nil && v > newest {
			newest = v
		}
	}
	return strconv.FormatInt(newest, 10)
}

// planArgs are a case's kg flags as `meshlet plan` takes them. meshlet is
// never the CNI: what it plans is kg's with --cni=false, so that flag is
// left out while `meshlet plan` does not have it; any other flag goes to
// `meshlet plan` as it is (a case with one it does not know is pending).
func planArgs(flags []string) []string {
	known := newPlanCmd().Flags()
	var args []string
	for _, f := range flags {
		if f == "--cni=false" && known.Lookup("cni") == nil {
			continue
		}
		args = append(args, f)
	}
	return args
}

// planCase runs `meshlet plan` on a case as kg ran: eth0 as the private
// interface, and the tunnel device kg uses in that mode (flannel.1, the
// device flannel's VXLAN backend creates, in flannel mode).
func planCase(t *testing.T, c compatCase) planOutput {
	t.Helper()
	dir := t.TempDir()
	in := filepath.Join(dir, "input.json")
	if err := os.WriteFile(in, c.Input, 0o600); err != nil {
		t.Fatal(err)
	}
	tunnel := topology.TunnelIPIP
	switch {
	case slices.Contains(c.Flags, "--compatibility=cilium"):
		tunnel = topology.TunnelCilium
	case slices.Contains(c.Flags, "--compatibility=flannel"):
		tunnel = "flannel.1"
	}
	args := append([]string{"--node", c.Node, "--local", in, "--now", newestLastSeen(t, c.Input),
		"--private-interface", "eth0", "--tunnel-device", tunnel, "-o", "json"}, planArgs(c.Flags)...)
	var out bytes.Buffer
	if err := runCmd(append([]string{"plan"}, args...), &out); err != nil {
		t.Fatalf("meshlet plan %s: %v", strings.Join(args, " "), err)
	}
	var pl planOutput
	if err := json.Unmarshal(out.Bytes(), &pl); err != nil {
		t.Fatal(err)
	}
	return pl
}

// peerKeepaliveDeviation accounts for the deviation that is the point of the
// project (docs/kilo-compatibility.md#peer-keepalive): a WireGuard peer made
// from a Peer object whose keepalive came from that Peer must carry the
// Peer's spec.persistentKeepalive, and is then compared with Kilo on
// everything else.
func peerKeepaliveDeviation(t *testing.T, c compatCase, pl topology.Plan, got *compatPlan) {
	t.Helper()
	var list struct {
		Items []struct {
			Kind string `json:"kind"`
			Spec struct {
				PublicKey           string `json:"publicKey"`
				PersistentKeepalive int    `json:"persistentKeepalive"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal(c.Input, &list); err != nil {
		t.Fatal(err)
	}
	spec := map[string]int{}
	for _, it := range list.Items {
		if it.Kind == "Peer" {
			spec[it.Spec.PublicKey] = it.Spec.PersistentKeepalive
		}
	}
	kilo := map[string]int{}
	for _, p := range c.Kilo.Peers {
		kilo[p.PublicKey] = p.PersistentKeepalive
	}
	for _, wp := range pl.WireGuard.Peers {
		if wp.Kind != topology.KindPeer || wp.KeepaliveSource != topology.KeepalivePeerSpec {
			continue
		}
		k := wp.PublicKey.String()
		if wp.PersistentKeepalive != spec[k] {
			t.Errorf("Peer %s: keepalive %d, want its spec's %d", wp.Name, wp.PersistentKeepalive, spec[k])
		}
		for i := range got.Peers {
			if got.Peers[i].PublicKey == k {
				got.Peers[i].PersistentKeepalive = kilo[k]
			}
		}
	}
}

// planOutput is `meshlet plan -o json` read back; rejections are written as
// one string per object, so they are read into their own type.
type planOutput struct {
	topology.Plan
	Rejections []struct {
		Object string          `json:"object"`
		Field  string          `json:"field"`
		Reason topology.Reason `json:"reason"`
	} `json:"rejections"`
}

func mustJSON(v any) string {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestKiloCompat: on every case of testdata/kilo-compat meshlet's plan is
// Kilo 0.7's, or the documented deviation (which must differ from Kilo, be
// explained in docs/kilo-compatibility.md, and report its rejections).
func TestKiloCompat(t *testing.T) {
	files, err := filepath.Glob("testdata/kilo-compat/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no cases: %v", err)
	}
	doc, err := os.ReadFile("../../docs/kilo-compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var c compatCase
			if err := json.Unmarshal(raw, &c); err != nil {
				t.Fatal(err)
			}
			if c.Pending != "" && !*compatPending {
				t.Skip("pending: " + c.Pending)
			}
			pl := planCase(t, c)
			got := toCompat(pl.Plan)
			if c.Kilo.IPTables == nil {
				got.IPTables = nil // not recorded for this case
			}
			recorded := c.Kilo.IPTables // Kilo's own output, as it is in the file
			c.Kilo.canonical()
			peerKeepaliveDeviation(t, c, pl.Plan, &got)
			if c.Deviation == "" {
				if !reflect.DeepEqual(got, c.Kilo) {
					t.Fatalf("meshlet differs from Kilo 0.7 (-kilo +meshlet):\n%s", cmp.Diff(c.Kilo, got))
				}
				return
			}
			if !strings.Contains(string(doc), `<a id="`+c.Deviation+`"></a>`) {
				t.Errorf("deviation %q has no section anchored <a id=%q></a> in docs/kilo-compatibility.md", c.Deviation, c.Deviation)
			}
			var reasons []string
			for _, r := range pl.Rejections {
				reasons = append(reasons, r.Object+" "+r.Field+" "+string(r.Reason))
			}
			if *updateCompat {
				c.Meshlet, c.Rejections = &got, reasons
				c.Kilo.IPTables = recorded
				b, _ := json.MarshalIndent(c, "", " ")
				if err := os.WriteFile(f, append(b, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if c.Meshlet == nil {
				t.Fatal("deviation case without the expected meshlet output (run with -update-compat and review)")
			}
			if c.Kilo.IPTables != nil && c.Meshlet.IPTables == nil {
				c.Meshlet.IPTables = []string{} // written as none
			}
			c.Meshlet.canonical()
			if !reflect.DeepEqual(got, *c.Meshlet) {
				t.Errorf("meshlet's plan changed on a documented deviation\ngot:  %s\nwant: %s", mustJSON(got), mustJSON(c.Meshlet))
			}
			if reflect.DeepEqual(*c.Meshlet, c.Kilo) {
				t.Errorf("deviation %q: meshlet computes what Kilo computes; drop the deviation", c.Deviation)
			}
			if !slices.Equal(reasons, c.Rejections) {
				t.Errorf("rejections = %v, want %v", reasons, c.Rejections)
			}
		})
	}
}

// TestIPTablesCanonicalForm pins the mapping TestKiloCompat compares NAT in:
// meshlet's NAT as its actuator installs it, read as Kilo's rules, and
// Kilo's rules reduced to what takes effect.
func TestIPTablesCanonicalForm(t *testing.T) {
	nat := topology.NAT{
		Sources:      []netip.Prefix{netip.MustParsePrefix("10.5.0.1/32")},
		Destinations: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		Exceptions:   []netip.Prefix{netip.MustParsePrefix("10.4.0.1/32"), netip.MustParsePrefix("fd00::/64")},
	}
	got := canonicalIPTables(natRules(nat))
	kilo := canonicalIPTables([]string{
		"v4 nat KILO-NAT -d 10.4.0.1/32 -j RETURN",
		"v4 nat KILO-NAT -j MASQUERADE",
		"v4 nat POSTROUTING -d 192.168.1.0/24 ! -s 192.168.1.0/24 -j KILO-NAT", // Cozystack's kg's
		"v4 nat POSTROUTING -s 10.5.0.1/32 -j KILO-NAT",
		// Nothing jumps to the IPv6 chain: it has no effect.
		"v6 nat KILO-NAT -d fd00::1/64 -j RETURN",
		"v6 nat KILO-NAT -j MASQUERADE",
	})
	if !slices.Equal(got, kilo) {
		t.Errorf("meshlet %q\nkilo    %q", got, kilo)
	}
	// Host bits as iptables stores them; FORWARD rules kept as they are.
	if got, want := canonicalIPTables([]string{"v4 filter FORWARD -s 10.5.0.1/24 -j ACCEPT", "v4 filter FORWARD -s 10.5.0.0/24 -j ACCEPT"}),
		[]string{"v4 filter FORWARD -s 10.5.0.0/24 -j ACCEPT"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
