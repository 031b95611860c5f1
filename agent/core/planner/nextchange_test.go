package planner

import (
	"net/netip"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// TestNextChange: the moments the plan changes with time alone, and
// nothing else (a renewing holder is not among them, nor a tunnel dead
// for longer than every rule's timing).
func TestNextChange(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	node := func(name string, seenAgo time.Duration) topology.Node {
		return topology.Node{Name: name, LastSeen: now.Add(-seenAgo)}
	}
	for _, tc := range []struct {
		name   string
		snap   topology.Snapshot
		health *topology.Health
		want   time.Time
	}{
		{"nothing", topology.Snapshot{}, nil, time.Time{}},
		{"own last-seen due for its refresh", topology.Snapshot{Nodes: []topology.Node{node("self", 10*time.Second)}}, nil,
			now.Add(topology.LastSeenRefresh - 10*time.Second)},
		{"own last-seen being refreshed by this run: the refresh after", topology.Snapshot{Nodes: []topology.Node{node("self", 70*time.Second)}}, nil,
			now.Add(topology.LastSeenRefresh)},
		{"another node leaving the ready window first", topology.Snapshot{Nodes: []topology.Node{node("self", 0), node("b", 50*time.Second)}}, nil,
			now.Add(topology.ReadyWindow - 50*time.Second)},
		{"another node's last-seen alone is no refresh", topology.Snapshot{Nodes: []topology.Node{node("b", 10*time.Second)}}, nil,
			now.Add(topology.ReadyWindow - 10*time.Second)},
		{"a step-aside's cool-down ending", topology.Snapshot{Nodes: []topology.Node{node("self", 0)},
			Lease: &topology.LeaseState{Holder: "b", Fresh: now, Duration: 3 * time.Second,
				StepAsides: map[string]topology.StepAside{"c": {At: now.Add(-failover.StepAsideCoolDown + time.Second)}}}}, nil,
			now.Add(time.Second)},
		{"a cool-down over, a live holder: the refresh", topology.Snapshot{Nodes: []topology.Node{node("self", 0)},
			Lease: &topology.LeaseState{Holder: "b", Fresh: now, Duration: 3 * time.Second,
				StepAsides: map[string]topology.StepAside{"c": {At: now.Add(-failover.StepAsideCoolDown)}}}}, nil,
			now.Add(topology.LastSeenRefresh)},
		{"a live tunnel: its going dead is the probes' to see, the refresh", topology.Snapshot{Nodes: []topology.Node{node("self", 0)}},
			&topology.Health{Peers: []topology.TunnelProbe{{Since: now.Add(-time.Minute), Answered: now.Add(-time.Second)}}},
			now.Add(topology.LastSeenRefresh)},
		{"a dead tunnel's step-aside moment", topology.Snapshot{Nodes: []topology.Node{node("self", 0)}},
			&topology.Health{Peers: []topology.TunnelProbe{{Since: now.Add(-time.Minute), Answered: now.Add(-failover.ProbeDeadAfter - time.Second)}}},
			now.Add(failover.StepAsideAfter - time.Second)},
		{"an answering gateway: the refresh", topology.Snapshot{Nodes: []topology.Node{node("self", 0)}},
			&topology.Health{Gateway: topology.GatewayProbe{Addr: netip.MustParseAddr("192.0.2.1"), Since: now.Add(-time.Minute), Answered: now.Add(-time.Second)}},
			now.Add(topology.LastSeenRefresh)},
		{"a down gateway's step-aside moment", topology.Snapshot{Nodes: []topology.Node{node("self", 0)}},
			&topology.Health{Gateway: topology.GatewayProbe{Addr: netip.MustParseAddr("192.0.2.1"), Since: now.Add(-time.Minute), Answered: now.Add(-failover.GatewayDeadAfter - time.Second)}},
			now.Add(failover.StepAsideAfter - time.Second)},
		{"the gateway recovering for GatewayRecoverAfter", topology.Snapshot{Nodes: []topology.Node{node("self", 0)}},
			&topology.Health{Gateway: topology.GatewayProbe{Addr: netip.MustParseAddr("192.0.2.1"), Since: now.Add(-time.Hour), Answered: now.Add(-time.Hour), Recovered: now.Add(-failover.GatewayRecoverAfter + time.Second)}},
			now.Add(time.Second)},
		{"a tunnel dead for long: no moment of its own, the refresh", topology.Snapshot{Nodes: []topology.Node{node("self", 0)}},
			&topology.Health{Peers: []topology.TunnelProbe{{Since: now.Add(-time.Hour)}}},
			now.Add(topology.LastSeenRefresh)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.snap.Now = now
			if got := NextChange(tc.snap, topology.Self{Name: "self", Health: tc.health}); !got.Equal(tc.want) {
				t.Errorf("NextChange = %v, want %v", got, tc.want)
			}
		})
	}
}
