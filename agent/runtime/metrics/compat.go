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
// names, types and labels, from meshlet's own state: kilo_leader and
// kilo_nodes from the last plan, kilo_peers from the last snapshot (the
// planner's input), kilo_reconciles_total and kilo_errors_total{event="apply"}
// from meshlet_reconciles_total, kilo_iptables_operations_total from the
// firewall changes the host actuator reports. It reads each plan through
// Report (the loop hands it every plan, as to the rejection sink), each
// snapshot through Snapshot, and the counters at scrape time, so nothing
// is counted twice.
type Kilo struct {
	agent *Agent

	mu           sync.Mutex
	leader       bool
	nodes, peers int

	leaderD, nodesD, peersD, reconcilesD, errorsD *prometheus.Desc
	// iptables is kg's kilo_iptables_operations_total, one CounterVec per
	// protocol as kg registers it (the protocol is a const label there).
	iptables map[string]*prometheus.CounterVec
}

// NewKilo returns the kilo_* collector reading agent's counters.
func NewKilo(agent *Agent) *Kilo {
	k := &Kilo{
		agent:       agent,
		leaderD:     prometheus.NewDesc("kilo_leader", "Leadership status of the node.", nil, nil),
		nodesD:      prometheus.NewDesc("kilo_nodes", "Number of nodes in the mesh.", nil, nil),
		peersD:      prometheus.NewDesc("kilo_peers", "Number of peers in the mesh.", nil, nil),
		reconcilesD: prometheus.NewDesc("kilo_reconciles_total", "Number of reconciliation attempts.", nil, nil),
		errorsD:     prometheus.NewDesc("kilo_errors_total", "Number of errors that occurred while administering the mesh.", []string{"event"}, nil),
		iptables:    map[string]*prometheus.CounterVec{},
	}
	for _, proto := range []string{protoIPv4, protoIPv6} {
		k.iptables[proto] = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "kilo_iptables_operations_total",
			Help:        "Number of iptables operations.",
			ConstLabels: prometheus.Labels{"protocol": proto},
		}, []string{"operation", "table", "chain"})
	}
	return k
}

// Report records what kg would count in this plan: whether this node leads
// and the local cluster's ready nodes (every node of every segment: the
// planner puts only ready nodes in segments, as kg counts only ready ones).
func (k *Kilo) Report(_ context.Context, plan topology.Plan) {
	nodes := 0
	for _, s := range plan.Segments {
		nodes += len(s.Nodes)
	}
	k.mu.Lock()
	k.leader, k.nodes = plan.Leader, nodes
	k.mu.Unlock()
}

// Snapshot records the planner's input: kg sets kilo_peers to the ready
// Peer objects of its cluster on every node, leader or not (Kilo's
// pkg/mesh applyTopology), so it is the local cluster's Peers meshlet
// accepted (a Peer Kilo would leave out as not ready, without a key or
// allowed IPs, meshlet rejects), whatever this node's role.
func (k *Kilo) Snapshot(snap topology.Snapshot) {
	k.mu.Lock()
	k.peers = len(snap.Peers)
	k.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (k *Kilo) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{k.leaderD, k.nodesD, k.peersD, k.reconcilesD, k.errorsD} {
		ch <- d
	}
	for _, c := range k.iptables {
		c.Describe(ch)
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
	for _, c := range k.iptables {
		c.Collect(ch)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
