package planner

import (
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// TestNextChange: the moments the plan changes with time alone, and
// nothing else (a renewing holder is not among them).
func TestNextChange(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	node := func(name string, seenAgo time.Duration) topology.Node {
		return topology.Node{Name: name, LastSeen: now.Add(-seenAgo)}
	}
	for _, tc := range []struct {
		name string
		snap topology.Snapshot
		want time.Time
	}{
		{"nothing", topology.Snapshot{}, time.Time{}},
		{"own last-seen due for its refresh", topology.Snapshot{Nodes: []topology.Node{node("self", 10*time.Second)}},
			now.Add(topology.LastSeenRefresh - 10*time.Second)},
		{"own last-seen being refreshed by this run: the refresh after", topology.Snapshot{Nodes: []topology.Node{node("self", 70*time.Second)}},
			now.Add(topology.LastSeenRefresh)},
		{"another node leaving the ready window first", topology.Snapshot{Nodes: []topology.Node{node("self", 0), node("b", 50*time.Second)}},
			now.Add(topology.ReadyWindow - 50*time.Second)},
		{"another node's last-seen alone is no refresh", topology.Snapshot{Nodes: []topology.Node{node("b", 10*time.Second)}},
			now.Add(topology.ReadyWindow - 10*time.Second)},
		{"a step-aside's cool-down ending", topology.Snapshot{Nodes: []topology.Node{node("self", 0)},
			Lease: &topology.LeaseState{Holder: "b", Fresh: now, Duration: 3 * time.Second,
				StepAsides: map[string]topology.StepAside{"c": {At: now.Add(-failover.StepAsideCoolDown + time.Second)}}}},
			now.Add(time.Second)},
		{"a cool-down over, a live holder: the refresh", topology.Snapshot{Nodes: []topology.Node{node("self", 0)},
			Lease: &topology.LeaseState{Holder: "b", Fresh: now, Duration: 3 * time.Second,
				StepAsides: map[string]topology.StepAside{"c": {At: now.Add(-failover.StepAsideCoolDown)}}}},
			now.Add(topology.LastSeenRefresh)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.snap.Now = now
			if got := NextChange(tc.snap, "self"); !got.Equal(tc.want) {
				t.Errorf("NextChange = %v, want %v", got, tc.want)
			}
		})
	}
}
