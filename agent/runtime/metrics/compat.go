package metrics

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Compat says which other exporters' series meshlet exports besides its
// own (--metrics-compat), so dashboards built for kg and
// prometheus_wireguard_exporter keep working (docs/metrics.md).
type Compat struct {
	// WireGuardExporter: wireguard_* of prometheus_wireguard_exporter.
	WireGuardExporter bool
	// Kilo: the kilo_* series kg exports.
	Kilo bool
}

// Compat values of --metrics-compat.
const (
	CompatWireGuardExporter = "wireguard-exporter"
	CompatKilo              = "kilo"
)

// ParseCompat parses --metrics-compat: "" or a comma-separated list of
// wireguard-exporter and kilo.
func ParseCompat(s string) (Compat, error) {
	var c Compat
	for _, v := range strings.Split(s, ",") {
		switch strings.TrimSpace(v) {
		case "":
		case CompatWireGuardExporter:
			c.WireGuardExporter = true
		case CompatKilo:
			c.Kilo = true
		default:
			return Compat{}, fmt.Errorf("%q is not %s or %s", v, CompatWireGuardExporter, CompatKilo)
		}
	}
	return c, nil
}

// Kilo exports the series kg exports (docs/metrics.md#kilo), with kg's
// names, types and labels, from meshlet's own state: kilo_leader,
// kilo_nodes, kilo_peers from the last plan, kilo_reconciles_total and
// kilo_errors_total{event="apply"} from meshlet_reconciles_total. It reads
// each plan through Report (the loop hands it every plan, as to the
// rejection sink) and the counters at scrape time, so nothing is counted
// twice.
type Kilo struct {
	agent *Agent

	mu           sync.Mutex
	leader       bool
	nodes, peers int

	leaderD, nodesD, peersD, reconcilesD, errorsD *prometheus.Desc
}

// NewKilo returns the kilo_* collector reading agent's counters.
func NewKilo(agent *Agent) *Kilo {
	return &Kilo{
		agent:       agent,
		leaderD:     prometheus.NewDesc("kilo_leader", "Leadership status of the node.", nil, nil),
		nodesD:      prometheus.NewDesc("kilo_nodes", "Number of nodes in the mesh.", nil, nil),
		peersD:      prometheus.NewDesc("kilo_peers", "Number of peers in the mesh.", nil, nil),
		reconcilesD: prometheus.NewDesc("kilo_reconciles_total", "Number of reconciliation attempts.", nil, nil),
		errorsD:     prometheus.NewDesc("kilo_errors_total", "Number of errors that occurred while administering the mesh.", []string{"event"}, nil),
	}
}

// Report records what kg would count in this plan: the local cluster's
// ready nodes (every node of every segment: the planner puts only ready
// nodes in segments, as kg counts only ready ones) and the Kilo Peers
// configured on this node.
func (k *Kilo) Report(_ context.Context, plan topology.Plan) {
	nodes := 0
	for _, s := range plan.Segments {
		nodes += len(s.Nodes)
	}
	peers := 0
	for _, p := range plan.WireGuard.Peers {
		if p.Kind == topology.KindPeer {
			peers++
		}
	}
	k.mu.Lock()
	k.leader, k.nodes, k.peers = plan.Leader, nodes, peers
	k.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (k *Kilo) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{k.leaderD, k.nodesD, k.peersD, k.reconcilesD, k.errorsD} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (k *Kilo) Collect(ch chan<- prometheus.Metric) {
	k.mu.Lock()
	leader, nodes, peers := 0.0, float64(k.nodes), float64(k.peers)
	if k.leader {
		leader = 1
	}
	k.mu.Unlock()
	ok := counterValue(k.agent.Reconciles.WithLabelValues("success"))
	failed := counterValue(k.agent.Reconciles.WithLabelValues("error"))
	ch <- prometheus.MustNewConstMetric(k.leaderD, prometheus.GaugeValue, leader)
	ch <- prometheus.MustNewConstMetric(k.nodesD, prometheus.GaugeValue, nodes)
	ch <- prometheus.MustNewConstMetric(k.peersD, prometheus.GaugeValue, peers)
	ch <- prometheus.MustNewConstMetric(k.reconcilesD, prometheus.CounterValue, ok+failed)
	// kg counts a failed apply of its topology as event "apply"; a failed
	// meshlet run is the same thing.
	ch <- prometheus.MustNewConstMetric(k.errorsD, prometheus.CounterValue, failed, "apply")
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
