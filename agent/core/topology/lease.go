package topology

import (
	"net/netip"
	"time"
)

// The data of meshlet's fast failover (docs/failover.md) that the planner
// reads and writes: the location's Lease as an agent sees it, what its
// health probes observed, and the plan's decisions. The decisions
// themselves are agent/core/failover's.

// LeaseState is this agent's view of its location's Lease
// (agent/runtime/leadership).
type LeaseState struct {
	// Name is the Lease observed (the one the last plan named).
	Name string
	// Exists: the Lease object exists.
	Exists bool
	// Holder is its holderIdentity ("" = free: released or never taken).
	Holder   string
	Duration time.Duration
	// Fresh: the holder is presumed alive until Fresh + Duration. It is the
	// later of when this agent last saw the Lease change and when its view
	// of the Lease was last broken (a watch that failed proves nothing
	// about the holder), on this agent's clock.
	Fresh time.Time
	// StepAsides are the nodes that gave leadership up for their health,
	// with when (the Lease's meshlet.io/step-asides, and this agent's own
	// latest one).
	StepAsides map[string]StepAside
}

// StepAside is one node's giving leadership up.
type StepAside struct {
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// Health is what this node's probes observed (agent/runtime/health), on
// this agent's clock.
type Health struct {
	// Peers are the probed tunnels to other leaders.
	Peers []TunnelProbe
	// Gateway is the underlay gateway's probe (Addr invalid = none).
	Gateway GatewayProbe
}

// TunnelProbe is one probed tunnel: since when it is probed, when the peer
// last answered (zero = never).
type TunnelProbe struct {
	PublicKey       Key
	Since, Answered time.Time
}

// GatewayProbe is the underlay gateway's probe: Answered is its last
// answer (zero = it never answered: not judged, as a gateway that drops
// pings), Recovered when it answered again after being unreachable.
type GatewayProbe struct {
	Addr                       netip.Addr
	Since, Answered, Recovered time.Time
}

// Leadership is this node's part in its location's Lease: what the
// leadership actuator does with the Lease (agent/runtime/leadership), and
// the leader marks the Node writer carries out (Claim, Unmark:
// cluster.Publisher).
type Leadership struct {
	Location string `json:"location"`
	// Lease is the Lease's name (in meshlet's namespace).
	Lease string `json:"lease"`
	// Governed: the location is under the Lease; otherwise Kilo's rule
	// alone elects its leader. Why says which.
	Governed bool   `json:"governed"`
	Why      string `json:"why"`
	// Holder is the Lease's holder as observed.
	Holder string `json:"holder,omitempty"`
	// Candidates are the nodes that may take the Lease, in Kilo's order.
	Candidates []string `json:"candidates,omitempty"`
	// Candidate: this node competes for a free Lease once it has been
	// free for Wait (its rank in Kilo's order).
	Candidate bool          `json:"candidate"`
	Wait      time.Duration `json:"wait,omitempty"`
	// Hold: keep renewing the Lease while this node holds it.
	Hold bool `json:"hold"`
	// Release: give the Lease up now, and why.
	Release string `json:"release,omitempty"`
	// StepAside: this node leads and gives leadership up for its health
	// (the reason); the actuator records it in the Lease.
	StepAside string `json:"stepAside,omitempty"`
	// Claim: carry the marked leader annotation (this node holds the
	// Lease); Unmark: nodes whose marked leader annotation must go.
	Claim  bool     `json:"claim,omitempty"`
	Unmark []string `json:"unmark,omitempty"`
	// Degraded is this node's own health judgement ("" = fit to lead),
	// published in meshlet.io/degraded.
	Degraded string `json:"degraded,omitempty"`
}

// Probes are what this node's health probes watch.
type Probes struct {
	// Source is the address the tunnel probes leave from (this leader's
	// WireGuard IP), so answers come back through the tunnel.
	Source netip.Addr    `json:"source,omitzero"`
	Peers  []ProbeTarget `json:"peers,omitempty"`
	// Gateway is the underlay gateway to probe (invalid = none).
	Gateway netip.Addr `json:"gateway,omitzero"`
	// LeaderPath, on a non-leader, is the path through its leader to
	// probe (nil = none).
	LeaderPath *LeaderPathProbe `json:"leaderPath,omitempty"`
}

// LeaderPathProbe is a non-leader's probe of the path every packet it
// sends to the mesh takes: an echo to its leader's WireGuard IP, routed
// through the leader like that traffic, and, when that goes unanswered,
// one to the leader's own address on the underlay. The first answered and
// the second not is what a network that drops packets not addressed to the
// nodes themselves does (cloud anti-spoofing, docs/runbooks.md).
type LeaderPathProbe struct {
	Leader string     `json:"leader"`
	Via    netip.Addr `json:"via"`    // the leader's WireGuard IP
	Direct netip.Addr `json:"direct"` // the leader's private IP
}

// ProbeTarget is one tunnel to probe: the peer's WireGuard IP.
type ProbeTarget struct {
	Name      string     `json:"name"`
	Cluster   string     `json:"cluster,omitempty"`
	PublicKey Key        `json:"publicKey"`
	Addr      netip.Addr `json:"addr"`
}
