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
// types and labels (docs/metrics.md#kilo), from a plan and meshlet's
// reconcile counters.
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
	tests := []struct {
		name               string
		plan               *topology.Plan // nil: no plan yet
		success, errors    int
		leader, nodes, prs string
		rec, errs          string
	}{
		{"before the first plan", nil, 0, 0, "0", "0", "0", "0", "0"},
		{"leader: 3 ready nodes, 2 Peers (segment and remote peers are not Kilo Peers)", &leaderPlan, 4, 1, "1", "3", "2", "5", "1"},
		{"follower: no peers of its own", &followerPlan, 2, 0, "0", "3", "0", "2", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			a := NewAgent(reg)
			k := NewKilo(a)
			reg.MustRegister(k)
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
