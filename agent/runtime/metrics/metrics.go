// Package metrics exports meshlet's Prometheus metrics: agent state, and
// per-peer WireGuard health read from the device at scrape time, shaped so
// that alerts on them are honest (see the docs of Collector).
package metrics

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/wg"
)

// Agent holds the agent-level metrics.
type Agent struct {
	Leader             prometheus.Gauge
	Peers              *prometheus.GaugeVec
	Routes             *prometheus.GaugeVec
	Reconciles         *prometheus.CounterVec
	ReconcileDuration  prometheus.Histogram
	Convergence        prometheus.Histogram
	RemoteClusterReady *prometheus.GaugeVec
	RemoteClusterNodes *prometheus.GaugeVec
	// RemoteClusterClockSkew: the remote cluster's clock minus this node's.
	RemoteClusterClockSkew *prometheus.GaugeVec
	Rejections             *prometheus.CounterVec
	RejectionsActive       *prometheus.GaugeVec
	AnnotationPatches      prometheus.Counter
	DataPlaneChanges       *prometheus.CounterVec
}

// NewAgent creates the agent metrics and registers them.
func NewAgent(reg prometheus.Registerer) *Agent {
	a := &Agent{
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshlet_leader",
			Help: "1 when this node leads its segment (kilo0 up, peers configured)."}),
		Peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_peers",
			Help: "WireGuard peers in the current plan, by kind (segment, peer, remote)."}, []string{"kind"}),
		Routes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_routes",
			Help: "Routes in the current plan, by address family (ipv4, ipv6): a dual-stack mesh routes both (docs/dual-stack.md)."}, []string{"family"}),
		Reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshlet_reconciles_total",
			Help: "Reconcile runs by result (success, error)."}, []string{"result"}),
		ReconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meshlet_reconcile_duration_seconds",
			Help:    "Duration of one reconcile: snapshot, plan, apply, publish.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		Convergence: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meshlet_convergence_seconds",
			Help:    "Time from an object change seen by a watcher to the data plane applied.",
			Buckets: []float64{.01, .025, .05, .1, .15, .2, .3, .5, .75, 1, 2, 5, 10}}),
		RemoteClusterReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_remote_cluster_ready",
			Help: "1 when the remote cluster's API is reachable and its watch is synced."}, []string{"cluster"}),
		RemoteClusterNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_remote_cluster_nodes",
			Help: "Nodes known in the remote cluster."}, []string{"cluster"}),
		RemoteClusterClockSkew: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_remote_cluster_clock_skew_seconds",
			Help: "How far the remote cluster's clock is ahead of this node's (negative: behind), from when its nodes' last-seen changes arrive (±1 s); liveness of remote nodes is judged by the remote clock."}, []string{"cluster"}),
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshlet_rejections_total",
			Help: "Inputs rejected (each counted once until it is fixed), by reason."}, []string{"reason"}),
		RejectionsActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_rejections_active",
			Help: "Rejections in force in the current plan (reported: Event written or due), by reason and kind of object (Node, Peer, ClusterMesh)."}, []string{"reason", "kind"}),
		AnnotationPatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshlet_annotation_patches_total",
			Help: "Patches of this node's Kilo annotations."}),
		DataPlaneChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshlet_dataplane_changes_total",
			Help: "Changes applied to the data plane, by kind of object (peer, route, rule, address, iptables, link)."}, []string{"object"}),
	}
	// Both results exist from the start at 0, so the first error is an
	// increase that rate() sees (a series born at 1 shows none).
	for _, r := range []string{"success", "error"} {
		a.Reconciles.WithLabelValues(r)
	}
	reg.MustRegister(a.Leader, a.Peers, a.Routes, a.Reconciles, a.ReconcileDuration, a.Convergence, a.RemoteClusterReady,
		a.RemoteClusterNodes, a.RemoteClusterClockSkew, a.Rejections, a.RejectionsActive, a.AnnotationPatches, a.DataPlaneChanges)
	return a
}

// NewSessionRepairs creates meshlet_session_repairs_total{peer}, counted by
// the WireGuard actuator's watch, and registers it.
func NewSessionRepairs(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshlet_session_repairs_total",
		Help: "Half-dead WireGuard sessions re-established: the peer (run by kg) forgot the session when it rewrote its device."}, []string{"peer"})
	reg.MustRegister(c)
	return c
}

// StatsSource reads the device; it is called at scrape time.
type StatsSource interface {
	Stats(ctx context.Context) (wg.DeviceStats, error)
}

// PeerInfo is what the plan says about a peer (labels).
type PeerInfo struct {
	Name, Kind, Cluster, Location string
}

// Collector exports per-peer series from the device at scrape time. Series
// of peers that left the device vanish with them.
type Collector struct {
	iface  string
	source StatsSource
	compat bool
	now    func() time.Time

	mu     sync.Mutex
	info   map[wgtypes.Key]PeerInfo
	txSeen map[wgtypes.Key]txMark

	handshake, rx, tx, keepalive, up, allowed *prometheus.Desc
	compatSent, compatRecv, compatHS          *prometheus.Desc
	scrapeErr                                 *prometheus.Desc
}

type txMark struct {
	bytes   int64
	first   time.Time // when this process first saw the peer
	changed time.Time // when the counter was last seen growing
}

// NewCollector returns a collector for the device iface. With compat, the
// series of prometheus_wireguard_exporter are exported too.
func NewCollector(iface string, source StatsSource, compat bool, now func() time.Time) *Collector {
	if now == nil {
		now = clock.RealClock{}.Now
	}
	labels := []string{"interface", "public_key", "peer", "kind", "cluster", "location"}
	compatLabels := []string{"interface", "public_key", "allowed_ips"}
	return &Collector{
		iface: iface, source: source, compat: compat, now: now,
		info: map[wgtypes.Key]PeerInfo{}, txSeen: map[wgtypes.Key]txMark{},
		handshake: prometheus.NewDesc("meshlet_peer_last_handshake_timestamp_seconds",
			"Unix time of the peer's last handshake; absent when it never completed one.", labels, nil),
		rx: prometheus.NewDesc("meshlet_peer_receive_bytes_total", "Bytes received from the peer.", labels, nil),
		tx: prometheus.NewDesc("meshlet_peer_transmit_bytes_total", "Bytes sent to the peer.", labels, nil),
		keepalive: prometheus.NewDesc("meshlet_peer_persistent_keepalive_seconds",
			"Persistent keepalive interval of the peer (0 = off).", labels, nil),
		up: prometheus.NewDesc("meshlet_peer_up",
			"1 when the last handshake is as young as the peer's keepalive and traffic allow, 0 when older; absent for idle peers without keepalive and for peers too new to judge.", labels, nil),
		allowed: prometheus.NewDesc("meshlet_peer_handshake_allowed_age_seconds",
			"How old the peer's last handshake may be while it is up: 180 s (REJECT_AFTER_TIME) + its keepalive (or the time since traffic was sent to it) + 15 s.", labels, nil),
		compatSent: prometheus.NewDesc("wireguard_sent_bytes_total", "Bytes sent to the peer (prometheus_wireguard_exporter).", compatLabels, nil),
		compatRecv: prometheus.NewDesc("wireguard_received_bytes_total", "Bytes received from the peer (prometheus_wireguard_exporter).", compatLabels, nil),
		compatHS: prometheus.NewDesc("wireguard_latest_handshake_seconds",
			"Unix time of the last handshake, 0 = never (prometheus_wireguard_exporter).", compatLabels, nil),
		scrapeErr: prometheus.NewDesc("meshlet_device_scrape_error", "1 when the WireGuard device could not be read.", []string{"interface"}, nil),
	}
}

// SetPeers records the labels of the planned peers.
func (c *Collector) SetPeers(peers []topology.WireGuardPeer) {
	m := make(map[wgtypes.Key]PeerInfo, len(peers))
	for _, p := range peers {
		m[wgtypes.Key(p.PublicKey)] = PeerInfo{Name: p.Name, Kind: string(p.Kind), Cluster: p.Cluster, Location: p.Location}
	}
	c.mu.Lock()
	c.info = m
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.handshake, c.rx, c.tx, c.keepalive, c.up, c.allowed, c.scrapeErr} {
		ch <- d
	}
	if c.compat {
		ch <- c.compatSent
		ch <- c.compatRecv
		ch <- c.compatHS
	}
}

// Collect implements prometheus.Collector: it reads the device now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev, err := c.source.Stats(ctx)
	stats := dev.Peers
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.scrapeErr, prometheus.GaugeValue, 1, c.iface)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeErr, prometheus.GaugeValue, 0, c.iface)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[wgtypes.Key]bool, len(stats))
	for _, s := range stats {
		seen[s.PublicKey] = true
		info := c.info[s.PublicKey]
		lv := []string{c.iface, s.PublicKey.String(), info.Name, info.Kind, info.Cluster, info.Location}
		if !s.LastHandshake.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.handshake, prometheus.GaugeValue, float64(s.LastHandshake.UnixNano())/1e9, lv...)
		}
		ch <- prometheus.MustNewConstMetric(c.rx, prometheus.CounterValue, float64(s.ReceiveBytes), lv...)
		ch <- prometheus.MustNewConstMetric(c.tx, prometheus.CounterValue, float64(s.TransmitBytes), lv...)
		ch <- prometheus.MustNewConstMetric(c.keepalive, prometheus.GaugeValue, s.PersistentKeepalive.Seconds(), lv...)

		h := c.health(s, now)
		if h.Judged() {
			up := 0.0
			if h.Up() {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, lv...)
		}
		if h.Allowed > 0 {
			ch <- prometheus.MustNewConstMetric(c.allowed, prometheus.GaugeValue, h.Allowed.Seconds(), lv...)
		}
		if c.compat {
			cl := []string{c.iface, s.PublicKey.String(), joinPrefixes(s.AllowedIPs)}
			ch <- prometheus.MustNewConstMetric(c.compatSent, prometheus.CounterValue, float64(s.TransmitBytes), cl...)
			ch <- prometheus.MustNewConstMetric(c.compatRecv, prometheus.CounterValue, float64(s.ReceiveBytes), cl...)
			hs := 0.0
			if !s.LastHandshake.IsZero() {
				hs = float64(s.LastHandshake.Unix())
			}
			ch <- prometheus.MustNewConstMetric(c.compatHS, prometheus.GaugeValue, hs, cl...)
		}
	}
	for k := range c.txSeen {
		if !seen[k] {
			delete(c.txSeen, k)
		}
	}
}

// health tracks a peer's transmit counter between reads and judges it.
// Traffic is seen as a change of the counter between two reads; the first
// sighting (e.g. after a restart) proves nothing. Call with c.mu held.
func (c *Collector) health(s wg.PeerStats, now time.Time) Health {
	mark, ok := c.txSeen[s.PublicKey]
	switch {
	case !ok:
		mark = txMark{bytes: s.TransmitBytes, first: now}
	case mark.bytes != s.TransmitBytes:
		mark.bytes, mark.changed = s.TransmitBytes, now
	}
	c.txSeen[s.PublicKey] = mark
	return Judge(s, now, mark.first, mark.changed)
}

// Health judges the device's peers now, for status; it shares the
// counter-tracking of the scrapes.
func (c *Collector) Health(stats []wg.PeerStats) map[wgtypes.Key]Health {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[wgtypes.Key]Health, len(stats))
	for _, s := range stats {
		out[s.PublicKey] = c.health(s, now)
	}
	return out
}

func joinPrefixes(ps []netip.Prefix) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += ","
		}
		s += p.String()
	}
	return s
}
