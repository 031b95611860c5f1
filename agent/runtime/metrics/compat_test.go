package metrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/wg"
)

func TestParseCompat(t *testing.T) {
	tests := []struct {
		in      string
		want    Compat
		wantErr bool
	}{
		{"", Compat{}, false},
		{"wireguard-exporter", Compat{WireGuardExporter: true}, false},
		{"kilo", Compat{Kilo: true}, false},
		{"kilo,wireguard-exporter", Compat{Kilo: true, WireGuardExporter: true}, false},
		{" wireguard-exporter , kilo ", Compat{Kilo: true, WireGuardExporter: true}, false},
		{"kilo,", Compat{Kilo: true}, false},
		{"kg", Compat{}, true},
		{"kilo,wg", Compat{}, true},
	}
	for _, tt := range tests {
		got, err := ParseCompat(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseCompat(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestKiloSeries: the kilo_* series kg exports, with kg's names, help,
// types and labels (docs/metrics.md#kilo), from a plan, its snapshot and
// meshlet's reconcile counters. kilo_peers is the cluster's Peers on every
// node, as kg counts them: a follower configures none but counts them all.
func TestKiloSeries(t *testing.T) {
	const head = `
# HELP kilo_errors_total Number of errors that occurred while administering the mesh.
# TYPE kilo_errors_total counter
kilo_errors_total{event="apply"} %ERR%
# HELP kilo_leader Leadership status of the node.
# TYPE kilo_leader gauge
kilo_leader %LEADER%
# HELP kilo_nodes Number of nodes in the mesh.
# TYPE kilo_nodes gauge
kilo_nodes %NODES%
# HELP kilo_peers Number of peers in the mesh.
# TYPE kilo_peers gauge
kilo_peers %PEERS%
# HELP kilo_reconciles_total Number of reconciliation attempts.
# TYPE kilo_reconciles_total counter
kilo_reconciles_total %REC%
`
	leaderPlan := topology.Plan{
		Leader: true,
		Segments: []topology.SegmentInfo{
			{Name: "location:x", Nodes: []string{"a-1", "a-2"}},
			{Name: "location:y", Nodes: []string{"a-3"}},
		},
		WireGuard: topology.Device{Peers: []topology.WireGuardPeer{
			{Name: "a-3", Kind: topology.KindSegment},
			{Name: "laptop", Kind: topology.KindPeer},
			{Name: "phone", Kind: topology.KindPeer},
			{Name: "b-1", Kind: topology.KindRemote},
		}},
	}
	followerPlan := topology.Plan{Segments: leaderPlan.Segments}
	// The planner's input: the local cluster's accepted Peers (a Peer
	// with a bad key is a rejection, not among them) and a remote
	// cluster's, which kg never sees.
	snap := topology.Snapshot{
		Peers:   []topology.Peer{{Name: "laptop"}, {Name: "phone"}},
		Remotes: []topology.RemoteCluster{{Name: "b", Peers: []topology.Peer{{Name: "b-laptop"}}}},
	}
	tests := []struct {
		name               string
		plan               *topology.Plan // nil: no plan yet
		snap               *topology.Snapshot
		success, errors    int
		leader, nodes, prs string
		rec, errs          string
	}{
		{"before the first plan", nil, nil, 0, 0, "0", "0", "0", "0", "0"},
		{"leader: 3 ready nodes, 2 Peers (segment and remote peers are not Kilo Peers)", &leaderPlan, &snap, 4, 1, "1", "3", "2", "5", "1"},
		{"follower: none configured here, the cluster's 2 counted as kg does", &followerPlan, &snap, 2, 0, "0", "3", "2", "2", "0"},
		{"no Peer in the cluster", &followerPlan, &topology.Snapshot{}, 1, 0, "0", "3", "0", "1", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			a := NewAgent(reg)
			k := NewKilo(a)
			reg.MustRegister(k)
			if tt.snap != nil {
				k.Snapshot(*tt.snap)
			}
			if tt.plan != nil {
				k.Report(context.Background(), *tt.plan)
			}
			a.Reconciles.WithLabelValues("success").Add(float64(tt.success))
			a.Reconciles.WithLabelValues("error").Add(float64(tt.errors))
			want := strings.NewReplacer("%ERR%", tt.errs, "%LEADER%", tt.leader, "%NODES%", tt.nodes, "%PEERS%", tt.prs, "%REC%", tt.rec).Replace(head)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
				"kilo_errors_total", "kilo_leader", "kilo_nodes", "kilo_peers", "kilo_reconciles_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestKiloIPTablesOperations: kilo_iptables_operations_total as kg's client
// counts its calls (Kilo's pkg/iptables: operation, table, chain, and the
// protocol as a const label), from the lines of the host actuator's firewall
// report (netlinkx.FirewallReport.Changes).
func TestKiloIPTablesOperations(t *testing.T) {
	const head = `
# HELP kilo_iptables_operations_total Number of iptables operations.
# TYPE kilo_iptables_operations_total counter
`
	tests := []struct {
		name    string
		changes []string
		want    string
	}{
		{"nothing changed: no series yet (as kg's before its first call)", nil, ""},
		{"NAT set up on IPv4: the chain, its rules, the jumps", []string{
			"IPv4 created chain nat/MESHLET-NAT",
			`IPv4 MESHLET-NAT: insert 1 "-d 10.4.0.0/16 -j RETURN"`,
			`IPv4 MESHLET-NAT: insert 2 "-j MASQUERADE"`,
			`IPv4 POSTROUTING: add "-s 10.1.0.0/24 -j MESHLET-NAT"`,
			`IPv4 POSTROUTING: add "-s 10.1.1.0/24 -j MESHLET-NAT"`,
		}, head + `kilo_iptables_operations_total{chain="MESHLET-NAT",operation="InsertUnique",protocol="IPv4",table="nat"} 2
kilo_iptables_operations_total{chain="MESHLET-NAT",operation="NewChain",protocol="IPv4",table="nat"} 1
kilo_iptables_operations_total{chain="POSTROUTING",operation="AppendUnique",protocol="IPv4",table="nat"} 2
`},
		{"forwarding on IPv6 (the jump goes first in FORWARD), then taken down", []string{
			"IPv6 created chain filter/MESHLET-FORWARD",
			`IPv6 MESHLET-FORWARD: insert 1 "-s fd00::/64 -j ACCEPT"`,
			`IPv6 FORWARD: add "-j MESHLET-FORWARD"`,
			`IPv6 FORWARD: delete "-j MESHLET-FORWARD"`,
			"IPv6 deleted chain filter/MESHLET-FORWARD",
		}, head + `kilo_iptables_operations_total{chain="FORWARD",operation="Delete",protocol="IPv6",table="filter"} 1
kilo_iptables_operations_total{chain="FORWARD",operation="InsertUnique",protocol="IPv6",table="filter"} 1
kilo_iptables_operations_total{chain="MESHLET-FORWARD",operation="ClearChain",protocol="IPv6",table="filter"} 1
kilo_iptables_operations_total{chain="MESHLET-FORWARD",operation="DeleteChain",protocol="IPv6",table="filter"} 1
kilo_iptables_operations_total{chain="MESHLET-FORWARD",operation="InsertUnique",protocol="IPv6",table="filter"} 1
kilo_iptables_operations_total{chain="MESHLET-FORWARD",operation="NewChain",protocol="IPv6",table="filter"} 1
`},
		{"a stale rule replaced in place", []string{
			`IPv4 MESHLET-NAT: delete 1 "-d 10.5.0.0/16 -j RETURN"`,
			`IPv4 MESHLET-NAT: insert 1 "-d 10.4.0.0/16 -j RETURN"`,
		}, head + `kilo_iptables_operations_total{chain="MESHLET-NAT",operation="Delete",protocol="IPv4",table="nat"} 1
kilo_iptables_operations_total{chain="MESHLET-NAT",operation="InsertUnique",protocol="IPv4",table="nat"} 1
`},
		{"lines of another form are not counted", []string{
			"", "IPv4", "IPv5 created chain nat/X", "IPv4 created chain nat", "IPv4 INPUT: add \"-j DROP\"",
			`IPv4 MESHLET-NAT: replace 1 "-j MASQUERADE"`,
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			k := NewKilo(NewAgent(reg))
			reg.MustRegister(k)
			k.IPTablesChanges(tt.changes)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tt.want), "kilo_iptables_operations_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCompatOff: without --metrics-compat, neither kg's nor the exporter's
// names appear (they would shadow a real kg or exporter on the same node).
func TestCompatOff(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	NewAgent(reg)
	reg.MustRegister(NewCollector("kilo0", &fakeSource{stats: []wg.PeerStats{{PublicKey: wgtypes.Key(k(1))}}}, false, nil))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); strings.HasPrefix(n, "kilo_") || strings.HasPrefix(n, "wireguard_") {
			t.Errorf("%s exported without --metrics-compat", n)
		}
	}
}
