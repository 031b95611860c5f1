package metrics

import "github.com/prometheus/client_golang/prometheus"

// Leadership holds the metrics of the per-location Lease and of the health
// probes (docs/failover.md).
type Leadership struct {
	// LeaseHeld is 1 while this node holds its location's Lease.
	LeaseHeld prometheus.Gauge
	// Changes counts the leader changes this node made by taking the
	// Lease, by reason (First, Released, Expired).
	Changes *prometheus.CounterVec
	// StepAsides counts the times this node gave leadership up, by reason.
	StepAsides *prometheus.CounterVec
	// Degraded is 1 for the reason this node may not lead now.
	Degraded *prometheus.GaugeVec
	// Tunnels counts the probed tunnels by state (alive, dead, new).
	Tunnels *prometheus.GaugeVec
}

// NewLeadership creates the leadership metrics and registers them.
func NewLeadership(reg prometheus.Registerer) *Leadership {
	l := &Leadership{
		LeaseHeld: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshlet_lease_held",
			Help: "1 while this node holds its location's Lease (it leads the location)."}),
		Changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshlet_leader_changes_total",
			Help: "Leader changes this node made by taking its location's Lease, by reason: First (no Lease yet), Released (the holder gave it up), Expired (the holder stopped renewing)."}, []string{"reason"}),
		StepAsides: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshlet_leader_step_asides_total",
			Help: "Times this node gave leadership up for its health, by reason (WireGuardDegraded, GatewayUnreachable)."}, []string{"reason"}),
		Degraded: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_degraded",
			Help: "1 while this node may not lead, by reason (WireGuardDegraded, GatewayUnreachable)."}, []string{"reason"}),
		Tunnels: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshlet_tunnel_probes",
			Help: "Tunnels to other leaders this leader probes, by state: alive (answered within 3 s), dead (nothing for 3 s), new."}, []string{"state"}),
	}
	for _, r := range []string{"First", "Released", "Expired"} {
		l.Changes.WithLabelValues(r)
	}
	reg.MustRegister(l.LeaseHeld, l.Changes, l.StepAsides, l.Degraded, l.Tunnels)
	return l
}
