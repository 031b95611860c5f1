package diagnose

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
)

var now = time.Unix(1_700_000_000, 0)

func node(name, location string, key byte, version string) topology.Node {
	return topology.Node{
		Name: name, LocationAnnotation: location, Endpoint: "192.168.0." + string('0'+rune(key)) + ":51820",
		InternalIP: netip.MustParsePrefix("192.168.0." + string('0'+rune(key)) + "/24"), PublicKey: topology.Key{key},
		PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 2, key, 0}), 24)}, LastSeen: now.Add(-5 * time.Second),
		Granularity: topology.GranularityLocation, MeshletVersion: version, Ready: true,
	}
}

// input plans every node of nodes and publishes each leader's WireGuard IP
// as a healthy mesh would.
func input(nodes []topology.Node, change func(*Input)) Input {
	snap := topology.Snapshot{Now: now, Nodes: nodes}
	in := Input{Cluster: "a", Snapshot: snap, Plans: map[string]topology.Plan{}}
	plan := func() {
		for _, n := range in.Snapshot.Nodes {
			in.Plans[n.Name] = planner.Compute(in.Snapshot, topology.Self{Name: n.Name, PublicKey: n.PublicKey})
		}
	}
	plan()
	for i, n := range in.Snapshot.Nodes {
		if p := in.Plans[n.Name]; p.Leader {
			in.Snapshot.Nodes[i].WireGuardIP = p.WireGuardIP
		}
	}
	if change != nil {
		change(&in)
	}
	plan()
	return in
}

func find(fs []Finding, check string, sev Severity) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.Check == check && f.Severity == sev {
			out = append(out, f)
		}
	}
	return out
}

func TestCheck(t *testing.T) {
	two := func() []topology.Node {
		return []topology.Node{node("a1", "x", 1, "v1"), node("a2", "x", 2, "v1"), node("b1", "y", 3, "")}
	}
	for _, tc := range []struct {
		name   string
		change func(*Input)
		// want: check → severity → substring of one finding's message
		want []Finding
		// clean: checks that must report only ok
		clean []string
	}{
		{
			name:  "healthy mixed cluster",
			want:  []Finding{{Check: "leaders", Severity: OK, Message: "location x → a1, location y → b1"}, {Check: "implementation", Severity: OK, Message: "2 nodes run meshlet, 1 run kg (kg: b1)"}},
			clean: []string{"readiness", "leaders", "rejections", "clocks", "versions"},
		},
		{
			name:   "stale node",
			change: func(in *Input) { in.Snapshot.Nodes[1].LastSeen = now.Add(-2 * time.Minute) },
			want:   []Finding{{Check: "readiness", Severity: Warning, Subject: "node a2", Message: "last seen 2m0s ago"}},
			clean:  []string{"leaders"},
		},
		{
			name:   "non-leader publishes a WireGuard IP",
			change: func(in *Input) { in.Snapshot.Nodes[1].WireGuardIP = netip.MustParsePrefix("10.4.0.9/16") },
			want:   []Finding{{Check: "leaders", Severity: Error, Subject: "node a2", Message: "its segment's leader is a1"}},
		},
		{
			name:   "leader publishes another WireGuard IP",
			change: func(in *Input) { in.Snapshot.Nodes[2].WireGuardIP = netip.MustParsePrefix("10.4.0.1/16") },
			want:   []Finding{{Check: "leaders", Severity: Error, Subject: "node b1", Message: "publishes WireGuard IP 10.4.0.1/16, not 10.4.0.2/16"}},
		},
		{
			name:   "version skew",
			change: func(in *Input) { in.Snapshot.Nodes[1].MeshletVersion = "v2" },
			want:   []Finding{{Check: "versions", Severity: Warning, Message: "v1 on a1; v2 on a2"}},
		},
		{
			name: "meshlet pod on a kg node",
			change: func(in *Input) {
				in.Agents = map[string]Agent{"a1": {Role: "leader"}, "a2": {Role: "non-leader"}, "b1": {Err: "connection refused"}}
			},
			want: []Finding{{Check: "implementation", Severity: Warning, Subject: "node b1", Message: "kg may still run on it"},
				{Check: "agents", Severity: Warning, Subject: "node b1", Message: "connection refused"}},
		},
		{
			name: "features off under kg's RBAC",
			change: func(in *Input) {
				off := []FeatureOff{{Name: "leader-election", Missing: []string{"create leases in kube-system"}}, {Name: "events", Missing: []string{"create events"}}}
				in.Agents = map[string]Agent{"a1": {Role: "leader", FeaturesOff: off}, "a2": {Role: "non-leader", FeaturesOff: off}, "b1": {Role: "leader"}}
			},
			want: []Finding{{Check: "grants", Severity: Warning, Subject: "2 nodes a1, a2",
				Message: "features off: leader-election (lacks create leases in kube-system), events (lacks create events)"}},
		},
		{
			name: "every feature on",
			change: func(in *Input) {
				in.Agents = map[string]Agent{"a1": {Role: "leader"}, "a2": {Role: "non-leader"}, "b1": {Role: "leader"}}
			},
			want:  []Finding{{Check: "grants", Severity: OK, Message: "the 3 agents read may use every feature"}},
			clean: []string{"grants"},
		},
		{
			name: "peer down, failed reconcile, drift, role lag",
			change: func(in *Input) {
				in.Agents = map[string]Agent{
					"a1": {Role: "leader", Peers: []AgentPeer{{Name: "b1", Kind: "segment", State: "down", LastHandshake: now.Add(-300 * time.Second), Allowed: 220 * time.Second},
						{Name: "laptop", Kind: "peer", State: "idle"}}},
					"a2": {Role: "leader", LastError: "applying host network: permission denied", Drift: []string{"route missing or different: 10.2.3.0/24"}},
				}
			},
			want: []Finding{{Check: "peers", Severity: Error, Subject: "node a1", Message: "peer b1 (segment) is down: last handshake 5m0s ago, allowed 3m40s"},
				{Check: "agents", Severity: Error, Subject: "node a2", Message: "permission denied"},
				{Check: "agents", Severity: Warning, Subject: "node a2", Message: "route missing"},
				{Check: "leaders", Severity: Warning, Subject: "node a2", Message: "its agent says leader, the cluster's state makes it non-leader"}},
		},
		{
			name: "remote clusters: unreachable, skewed, leaderless",
			change: func(in *Input) {
				in.Remotes = []Remote{{Cluster: "b", Mesh: "m", Secret: "kilo-system/b[kubeconfig]", Err: "Unauthorized"},
					{Cluster: "c", ServerTime: now.Add(40 * time.Second), ClockOffset: 40 * time.Second}}
				in.Snapshot.Remotes = []topology.RemoteCluster{{Name: "c", Synced: true}}
			},
			want: []Finding{{Check: "remote clusters", Severity: Error, Subject: "cluster b", Message: "Unauthorized"},
				{Check: "remote clusters", Severity: Error, Subject: "cluster c", Message: "no node can lead"},
				{Check: "clocks", Severity: Error, Subject: "cluster c", Message: "40s off"}},
		},
		{
			name:   "node clock ahead",
			change: func(in *Input) { in.Snapshot.Nodes[0].LastSeen = now.Add(20 * time.Second) },
			want:   []Finding{{Check: "clocks", Severity: Warning, Subject: "node a1", Message: "20s ahead"}},
		},
		{
			name:   "leadership by Lease",
			change: func(in *Input) { in.LeaderElection = true },
			want: []Finding{{Check: "leadership", Severity: OK, Subject: "location x", Message: "every node runs meshlet: the holder of the Lease leads"},
				{Check: "leadership", Severity: OK, Subject: "location y", Message: "kg runs on b1"}},
			clean: []string{"leadership"},
		},
		{
			name: "location that also holds a kg node keeps Kilo's rule",
			change: func(in *Input) {
				in.LeaderElection = true
				in.Snapshot.Nodes = append(in.Snapshot.Nodes, node("a3", "x", 4, ""))
			},
			want: []Finding{{Check: "leadership", Severity: Warning, Subject: "location x", Message: "kg runs on a3 and cannot follow a Lease: Kilo's rule"}},
		},
		{
			name:  "leader election off",
			want:  []Finding{{Check: "leadership", Severity: OK, Message: "--leader-election=false: Kilo's rule"}},
			clean: []string{"leadership"},
		},
		{
			name: "rejections in force",
			change: func(in *Input) {
				in.Snapshot.Rejections = []topology.Rejection{{Object: topology.ObjectRef{Kind: "Node", Name: "a2"}, Field: "kilo.squat.ai/persistent-keepalive",
					Reason: topology.ReasonInvalidAnnotation, Message: `"x" is not a number`}}
			},
			want: []Finding{{Check: "rejections", Severity: Warning, Message: `InvalidAnnotation kilo.squat.ai/persistent-keepalive: "x" is not a number`}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := Check(input(two(), tc.change))
			for _, w := range tc.want {
				found := false
				for _, f := range find(fs, w.Check, w.Severity) {
					if strings.Contains(f.Message, w.Message) && (w.Subject == "" || f.Subject == w.Subject) {
						found = true
						if f.Severity != OK && f.Fix == "" {
							t.Errorf("finding without a fix: %+v", f)
						}
					}
				}
				if !found {
					t.Errorf("no %s %s finding for %q %q in:\n%s", w.Severity, w.Check, w.Subject, w.Message, dump(fs))
				}
			}
			for _, c := range tc.clean {
				if bad := append(find(fs, c, Error), find(fs, c, Warning)...); len(bad) > 0 {
					t.Errorf("check %s not clean:\n%s", c, dump(bad))
				}
			}
			for i := 1; i < len(fs); i++ {
				if fs[i-1].Severity == OK && fs[i].Severity != OK {
					t.Errorf("findings not ordered by severity:\n%s", dump(fs))
					break
				}
			}
		})
	}
}

func dump(fs []Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(string(f.Severity) + " " + f.Check + " " + f.Subject + ": " + f.Message + "\n")
	}
	return b.String()
}
