// Package diagnose checks a whole cluster's mesh from what its API shows
// (and its agents report) and says, for each problem, what to do — like
// `subctl diagnose`. It is pure: `meshlet diagnose` reads the clusters and
// the agents, Check decides.
package diagnose

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// Severity of a finding.
type Severity string

const (
	Error   Severity = "error"
	Warning Severity = "warning"
	OK      Severity = "ok"
)

// Finding is one result.
type Finding struct {
	Severity Severity `json:"severity"`
	Check    string   `json:"check"`
	Subject  string   `json:"subject"`
	Message  string   `json:"message"`
	Fix      string   `json:"fix,omitempty"`
	// ID names a fault users hit (findings.go); Evidence is the data that
	// shows it and Runbook its entry in docs/runbooks.md.
	ID       string   `json:"id,omitempty"`
	Evidence []string `json:"evidence,omitempty"`
	Runbook  string   `json:"runbook,omitempty"`
}

// Input is a cluster as read once.
type Input struct {
	Cluster string
	// Snapshot is the local cluster and the remote clusters that could be
	// read, Now its API server's time.
	Snapshot topology.Snapshot
	// Plans is every local node's plan as its agent computes it.
	Plans map[string]topology.Plan
	// ClockOffset is how far the local API server's clock is ahead of
	// this machine's.
	ClockOffset time.Duration
	Remotes     []Remote
	// Agents are the meshlet agents' reports by node; nil when they were
	// not asked (offline, from dumps).
	Agents map[string]Agent
	// LeaderElection is the agents' --leader-election.
	LeaderElection bool
	// PeerAdmission is how the API server answered a dry-run Peer; nil
	// when it was not asked (offline, or no permission to create Peers).
	PeerAdmission *PeerAdmission
}

// Remote is one remote cluster of the accepted ClusterMeshes.
type Remote struct {
	Cluster, Mesh string
	Secret        string // namespace/name[key]
	// Err is why it could not be read with its Secret's credentials;
	// Refused says the kubeconfig itself was refused (not inline
	// credentials: docs/security.md#kubeconfig).
	Err         string
	Refused     bool
	ServerTime  time.Time
	ClockOffset time.Duration
}

// Agent is what a node's meshlet agent reports (`meshlet status`).
type Agent struct {
	Err       string // the agent could not be read
	Role      string
	Version   string
	LastError string
	Drift     []string
	Peers     []AgentPeer
	// Findings are the named findings the agent proved about its node
	// (NodeFindings, in its status).
	Findings []Finding
	// FeaturesOff are the features its grants (or the cluster's CRDs) do
	// not allow, each with what it lacks (docs/dropin.md#grants).
	FeaturesOff []FeatureOff
}

// FeatureOff is one feature an agent may not use, and what it lacks.
type FeatureOff struct {
	Name    string
	Missing []string
}

// AgentPeer is a peer as an agent judges it.
type AgentPeer struct {
	Name, Kind, Cluster, State string
	// Location is a segment peer's location.
	Location      string
	LastHandshake time.Time
	Allowed       time.Duration
	// Endpoint is the planned endpoint, Learned the device's when it
	// differs; the counters are the device's since it was created.
	Endpoint, Learned string
	Keepalive         int
	RxBytes, TxBytes  int64
}

const (
	skewWarn  = topology.ClockSkewWarn
	skewError = 30 * time.Second
)

// Check runs every check; findings come errors first.
func Check(in Input) []Finding {
	var fs []Finding
	add := func(sev Severity, check, subject, msg, fix string) {
		fs = append(fs, Finding{Severity: sev, Check: check, Subject: subject, Message: msg, Fix: fix})
	}
	ref := reference(in)
	checkReadiness(in, add)
	checkLeaders(in, ref, add)
	checkLeadership(in, add)
	checkImplementations(in, add)
	checkRejections(ref, add)
	checkRemotes(in, add)
	checkClocks(in, add)
	checkAgents(in, ref, add)
	checkGrants(in, add)
	checkFindings(in, func(f Finding) { fs = append(fs, f) })
	rank := map[Severity]int{Error: 0, Warning: 1, OK: 2}
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(rank[a.Severity], rank[b.Severity]), cmp.Compare(a.Check, b.Check), cmp.Compare(a.Subject, b.Subject))
	})
	return fs
}

type adder func(sev Severity, check, subject, msg, fix string)

// reference is the plan of the first segment leader (it sees the remote
// clusters too); all plans share the segments.
func reference(in Input) topology.Plan {
	names := make([]string, 0, len(in.Plans))
	for n := range in.Plans {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return topology.Plan{}
	}
	first := in.Plans[names[0]]
	if len(first.Segments) > 0 {
		if p, ok := in.Plans[first.Segments[0].Leader]; ok {
			return p
		}
	}
	return first
}

func checkReadiness(in Input, add adder) {
	notReady := 0
	for _, n := range in.Snapshot.Nodes {
		why := topology.NotReady(n, in.Snapshot.Now)
		if len(why) == 0 {
			continue
		}
		notReady++
		fix := "check that Kilo's agent (kg or meshlet) runs on the node: kubectl -n kilo-system get pods -o wide --field-selector spec.nodeName=" + n.Name
		if slices.Contains(why, "no pod CIDR") {
			fix += "; a node without spec.podCIDR needs the controller manager's --allocate-node-cidrs (Kilo routes pod CIDRs)"
		}
		add(Warning, "readiness", "node "+n.Name, "not in the mesh: "+strings.Join(why, ", "), fix)
	}
	if notReady == 0 && len(in.Snapshot.Nodes) > 0 {
		add(OK, "readiness", "cluster "+in.Cluster, fmt.Sprintf("all %d nodes are Ready in Kilo's sense", len(in.Snapshot.Nodes)), "")
	}
}

// checkLeaders compares the leaders the plan elects with the WireGuard IPs
// the nodes publish: Kilo publishes one only on a segment's leader, so a
// node that publishes another (or none while leading) computes another
// topology.
func checkLeaders(in Input, ref topology.Plan, add adder) {
	leaderOf := map[string]topology.SegmentInfo{}
	for _, s := range ref.Segments {
		leaderOf[s.Leader] = s
	}
	bad := 0
	fix := "every node's agent (kg or meshlet) must run with the same --mesh-granularity, --subnet and topology label; `meshlet status --node NODE` shows a meshlet node's view"
	for _, n := range in.Snapshot.Nodes {
		if len(topology.NotReady(n, in.Snapshot.Now)) > 0 {
			continue
		}
		seg, leads := leaderOf[n.Name]
		switch {
		case leads && !n.WireGuardIP.IsValid():
			bad++
			add(Warning, "leaders", "node "+n.Name, fmt.Sprintf("leads %s by Kilo's rules but publishes no WireGuard IP (want %s): its agent has not caught up or disagrees", segName(seg), seg.WireGuardIP), fix)
		case leads && n.WireGuardIP != seg.WireGuardIP:
			bad++
			add(Error, "leaders", "node "+n.Name, fmt.Sprintf("leads %s but publishes WireGuard IP %s, not %s: nodes disagree on the segments", segName(seg), n.WireGuardIP, seg.WireGuardIP), fix)
		case !leads && n.WireGuardIP.IsValid():
			bad++
			add(Error, "leaders", "node "+n.Name, fmt.Sprintf("publishes WireGuard IP %s as a leader would, but its segment's leader is %s: nodes disagree on the leader", n.WireGuardIP, leaderName(ref, n.Name)), fix)
		}
	}
	if bad == 0 && len(ref.Segments) > 0 {
		var parts []string
		for _, s := range ref.Segments {
			parts = append(parts, fmt.Sprintf("%s → %s", segName(s), s.Leader))
		}
		add(OK, "leaders", "cluster "+in.Cluster, fmt.Sprintf("%d segments, one leader each, and the nodes agree: %s", len(ref.Segments), strings.Join(parts, ", ")), "")
	}
}

// checkLeadership says, per location, whether its leader is the holder of
// its Lease (failover in seconds, a degraded leader steps aside) or is
// elected by Kilo's rule alone, and why: a location that also holds kg
// nodes keeps Kilo's rule, since kg cannot follow a Lease
// (docs/failover.md#governed).
func checkLeadership(in Input, add adder) {
	set := in.Snapshot.Settings
	if !in.LeaderElection {
		add(OK, "leadership", "cluster "+in.Cluster, "--leader-election=false: Kilo's rule elects every location's leader (a dead leader is replaced when its last-seen ages out, 60 s)", "")
		return
	}
	byLoc := map[string][]topology.Node{}
	for _, n := range in.Snapshot.Nodes {
		if len(topology.NotReady(n, in.Snapshot.Now)) == 0 {
			loc := topology.NodeLocation(n, set)
			byLoc[loc] = append(byLoc[loc], n)
		}
	}
	locs := make([]string, 0, len(byLoc))
	for l := range byLoc {
		locs = append(locs, l)
	}
	sort.Strings(locs)
	for _, l := range locs {
		governed, why := failover.Governance(byLoc[l], set)
		kg, meshlet := false, false
		for _, n := range byLoc[l] {
			kg = kg || n.MeshletVersion == ""
			meshlet = meshlet || n.MeshletVersion != ""
		}
		switch {
		case governed:
			add(OK, "leadership", "location "+l, "Lease "+failover.LeaseName(l)+": "+why+" (failover in seconds, a degraded leader steps aside)", "")
		case kg && meshlet:
			add(Warning, "leadership", "location "+l, why+"; a degraded leader is not replaced (Kilo's rule)",
				"run meshlet on every node of the location (docs/migration.md) for a Lease: failover in seconds (docs/failover.md#governed)")
		default:
			add(OK, "leadership", "location "+l, why, "")
		}
	}
}

func segName(s topology.SegmentInfo) string {
	if s.Location != "" {
		return "location " + s.Location
	}
	return "segment " + s.Name
}

func leaderName(ref topology.Plan, node string) string {
	for _, s := range ref.Segments {
		if slices.Contains(s.Nodes, node) {
			return s.Leader
		}
	}
	return "unknown"
}

func checkImplementations(in Input, add adder) {
	versions := map[string][]string{}
	var kg []string
	for _, n := range in.Snapshot.Nodes {
		if n.MeshletVersion == "" {
			kg = append(kg, n.Name)
		} else {
			versions[n.MeshletVersion] = append(versions[n.MeshletVersion], n.Name)
		}
		if _, ok := in.Agents[n.Name]; ok && n.MeshletVersion == "" && len(topology.NotReady(n, in.Snapshot.Now)) == 0 {
			add(Warning, "implementation", "node "+n.Name,
				"a meshlet pod runs here but the node's annotations are kg's (no meshlet.io/version): kg may still run on it, and two agents fight over kilo0",
				"remove kg from this node before meshlet takes over (docs/migration.md)")
		}
	}
	meshlet := 0
	for _, ns := range versions {
		meshlet += len(ns)
	}
	msg := fmt.Sprintf("%d nodes run meshlet, %d run kg", meshlet, len(kg))
	if len(kg) > 0 && meshlet > 0 {
		msg += " (kg: " + strings.Join(kg, ", ") + "); mixed clusters interoperate (docs/kilo-compatibility.md#half-dead)"
	}
	add(OK, "implementation", "cluster "+in.Cluster, msg, "")
	if len(versions) > 1 {
		vs := make([]string, 0, len(versions))
		for v, ns := range versions {
			vs = append(vs, fmt.Sprintf("%s on %s", v, strings.Join(ns, ", ")))
		}
		sort.Strings(vs)
		add(Warning, "versions", "cluster "+in.Cluster, "meshlet versions differ: "+strings.Join(vs, "; "),
			"finish the rollout: kubectl -n kilo-system rollout status ds/meshlet")
	}
}

// rejectionFix says what to do about each kind of rejection.
var rejectionFix = map[topology.Reason]string{
	topology.ReasonInvalidKey:           "write a valid base64 WireGuard public key (wg pubkey)",
	topology.ReasonInvalidCIDR:          "fix the CIDR's syntax (address/length with the host bits zero)",
	topology.ReasonInvalidEndpoint:      "write the endpoint as host:port or [IPv6]:port",
	topology.ReasonInvalidAnnotation:    "fix or remove the annotation (docs/kilo-api.md lists each one's format)",
	topology.ReasonInvalidPeer:          "fix the Peer's spec (docs/kilo-api.md)",
	topology.ReasonInvalidClusterMesh:   "fix the ClusterMesh (docs/clustermesh.md)",
	topology.ReasonNetworksOverlap:      "give each cluster its own pod, service and WireGuard networks",
	topology.ReasonOutsideAllowed:       "widen the cluster's allowedNetworks in the ClusterMesh, or fix the remote object",
	topology.ReasonOverlapsLocal:        "the remote prefix overlaps this cluster's own networks: renumber one of them",
	topology.ReasonDefaultRoute:         "a default route cannot be routed to a peer: list the real prefixes",
	topology.ReasonDuplicateKey:         "each node and Peer needs its own WireGuard key",
	topology.ReasonDuplicateWireGuardIP: "two nodes claim one WireGuard IP: their agents disagree on the topology",
	topology.ReasonOwnKey:               "a Peer uses this node's own key: give it its own",
	topology.ReasonDuplicateAllowedIP:   "two peers claim one allowed IP: remove it from one of them",
	topology.ReasonNoPublicKey:          "the object lacks a WireGuard public key",
	topology.ReasonMeshConflict:         "two ClusterMeshes disagree about a cluster: keep one definition",
	topology.ReasonUnsafeKubeconfig:     "put inline credentials in the Secret's kubeconfig: no exec, auth provider or file path (docs/security.md#kubeconfig)",
}

func checkRejections(ref topology.Plan, add adder) {
	if len(ref.Rejections) == 0 {
		add(OK, "rejections", "mesh", "no object is rejected", "")
		return
	}
	for _, r := range ref.Rejections {
		fix := rejectionFix[r.Reason]
		if fix == "" {
			fix = "fix the object"
		}
		field := ""
		if r.Field != "" {
			field = " " + r.Field
		}
		add(Warning, "rejections", r.Object.String(), fmt.Sprintf("%s%s: %s (ignored until fixed; an Event is on the object)", r.Reason, field, r.Message), fix)
	}
}

func checkRemotes(in Input, add adder) {
	for _, r := range in.Remotes {
		subject := "cluster " + r.Cluster
		if r.Err != "" {
			fix := "check the kubeconfig in the Secret reaches the cluster's API server and that its user may get, list and watch nodes and peers.kilo.squat.ai there (read-only; docs/clustermesh.md)"
			if r.Refused {
				fix = "put inline credentials in the Secret's kubeconfig (a ServiceAccount token, or client certificate data), no exec, auth provider or file path (docs/security.md#kubeconfig)"
			}
			add(Error, "remote clusters", subject, fmt.Sprintf("cannot be read with the credentials of Secret %s: %s", r.Secret, r.Err), fix)
			continue
		}
		nodes, ready := 0, 0
		var leaders []string
		for _, rc := range in.Snapshot.Remotes {
			if rc.Name != r.Cluster {
				continue
			}
			nodes = len(rc.Nodes)
			now := r.ServerTime
			if now.IsZero() {
				now = in.Snapshot.Now
			}
			for _, n := range rc.Nodes {
				if len(topology.NotReady(n, now)) == 0 {
					ready++
				}
			}
		}
		for _, ri := range reference(in).Remotes {
			if ri.Cluster == r.Cluster {
				leaders = ri.Leaders
			}
		}
		if len(leaders) == 0 {
			add(Error, "remote clusters", subject, fmt.Sprintf("reachable (%d nodes, %d Ready) but no node can lead a tunnel to it", nodes, ready),
				"its nodes need a fresh last-seen, a key and an endpoint this cluster can reach (clustermesh-endpoint, force-endpoint or an ExternalIP; docs/clustermesh.md)")
			continue
		}
		add(OK, "remote clusters", subject, fmt.Sprintf("reachable with its Secret's read-only credentials: %d nodes, %d Ready, leaders %s", nodes, ready, strings.Join(leaders, ", ")), "")
	}
}

// checkClocks: Kilo's readiness compares a node's last-seen (written with
// its own clock) with the reader's clock, so skew between clusters or a
// node whose clock runs ahead bends who is Ready.
func checkClocks(in Input, add adder) {
	skewed := false
	for _, r := range in.Remotes {
		if r.Err != "" || r.ServerTime.IsZero() || in.Snapshot.Now.IsZero() {
			continue
		}
		skew := r.ClockOffset - in.ClockOffset
		if abs(skew) <= skewWarn {
			continue
		}
		skewed = true
		sev := Warning
		if abs(skew) > skewError {
			sev = Error
		}
		add(sev, "clocks", "cluster "+r.Cluster, fmt.Sprintf("its API server's clock is %s off this cluster's (±1 s)", skew.Round(time.Second)),
			"run NTP (chrony, systemd-timesyncd, Talos' time sync) on both clusters' nodes")
	}
	check := func(cluster string, nodes []topology.Node, now time.Time) {
		for _, n := range nodes {
			if n.LastSeen.IsZero() || now.IsZero() {
				continue
			}
			if ahead := n.LastSeen.Sub(now); ahead > skewWarn {
				skewed = true
				add(Warning, "clocks", "node "+qualified(cluster, n.Name), fmt.Sprintf("its last-seen is %s ahead of its API server's clock: the node's clock runs ahead", ahead.Round(time.Second)),
					"run NTP on the node")
			}
		}
	}
	check("", in.Snapshot.Nodes, in.Snapshot.Now)
	for _, rc := range in.Snapshot.Remotes {
		for _, r := range in.Remotes {
			if r.Cluster == rc.Name && !r.ServerTime.IsZero() {
				check(rc.Name, rc.Nodes, r.ServerTime)
			}
		}
	}
	if !skewed && !in.Snapshot.Now.IsZero() {
		add(OK, "clocks", "mesh", "no clock skew over 5 s between the clusters' API servers or from a node's last-seen", "")
	}
}

func qualified(cluster, name string) string {
	if cluster == "" {
		return name
	}
	return cluster + "/" + name
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func checkAgents(in Input, ref topology.Plan, add adder) {
	if in.Agents == nil {
		return
	}
	names := make([]string, 0, len(in.Agents))
	for n := range in.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	down, asked := 0, 0
	for _, node := range names {
		a := in.Agents[node]
		subject := "node " + node
		if a.Err != "" {
			add(Warning, "agents", subject, "meshlet's status could not be read: "+a.Err,
				"check the pod: kubectl -n kilo-system logs --selector app.kubernetes.io/name=meshlet --field-selector spec.nodeName="+node+" (reading /status needs get on pods/proxy)")
			continue
		}
		asked++
		if a.LastError != "" {
			add(Error, "agents", subject, "the last reconcile failed: "+a.LastError, "read the agent's log; `meshlet status --node "+node+"` shows what it applied")
		}
		if len(a.Drift) > 0 {
			add(Warning, "agents", subject, fmt.Sprintf("the host differs from the plan (%s); the next reconcile restores it unless something keeps changing it", strings.Join(a.Drift, "; ")),
				"look for another agent (kg) or a script managing kilo0's routes on the node")
		}
		if p, ok := in.Plans[node]; ok && a.Role != "" {
			want := "non-leader"
			if p.Leader {
				want = "leader"
			}
			if (a.Role == "leader" || a.Role == "non-leader") && a.Role != want {
				add(Warning, "leaders", subject, fmt.Sprintf("its agent says %s, the cluster's state makes it %s", a.Role, want),
					"the agent may lag a change (it re-plans within seconds); if it persists, compare its flags with the other nodes'")
			}
		}
		for _, peer := range a.Peers {
			switch peer.State {
			case "down", "never", "missing":
				down++
				add(Error, "peers", subject, describePeer(peer, in.Snapshot.Now), peerFix(peer))
			}
		}
	}
	if down == 0 && asked > 0 {
		add(OK, "peers", "cluster "+in.Cluster, fmt.Sprintf("every judged peer of the %d agents read is up", asked), "")
	}
}

// checkGrants says which features the agents may not use and what turns
// each on: kg's RBAC alone meshes the cluster with Kilo's leader rule, so a
// feature off is a mode, said once per set of agents sharing it (a
// warning: failover, Events, remote clusters or a clean uninstall are
// missing), not an error.
func checkGrants(in Input, add adder) {
	if in.Agents == nil {
		return
	}
	bySet := map[string][]string{}
	asked := 0
	for node, a := range in.Agents {
		if a.Err != "" {
			continue
		}
		asked++
		if len(a.FeaturesOff) == 0 {
			continue
		}
		var parts []string
		for _, f := range a.FeaturesOff {
			parts = append(parts, f.Name+" (lacks "+strings.Join(f.Missing, "; ")+")")
		}
		key := strings.Join(parts, ", ")
		bySet[key] = append(bySet[key], node)
	}
	if asked == 0 {
		return
	}
	if len(bySet) == 0 {
		add(OK, "grants", "cluster "+in.Cluster, fmt.Sprintf("the %d agents read may use every feature (Lease failover, Events, ClusterMesh, the uninstall check)", asked), "")
		return
	}
	sets := make([]string, 0, len(bySet))
	for k := range bySet {
		sets = append(sets, k)
	}
	sort.Strings(sets)
	for _, set := range sets {
		nodes := bySet[set]
		sort.Strings(nodes)
		subject := fmt.Sprintf("%d nodes %s", len(nodes), strings.Join(nodes, ", "))
		if len(nodes) == 1 {
			subject = "node " + nodes[0]
		}
		add(Warning, "grants", subject, "features off: "+set,
			"the add-on grants bound to the DaemonSet's ServiceAccount turn them on: kubectl apply --server-side -k manifests/dropin (docs/dropin.md#grants); the agents restart to use them within 5 minutes")
	}
}

func describePeer(p AgentPeer, now time.Time) string {
	where := p.Kind
	if p.Cluster != "" {
		where += ", cluster " + p.Cluster
	}
	switch p.State {
	case "missing":
		return fmt.Sprintf("peer %s (%s) is planned but not on the WireGuard device", p.Name, where)
	case "never":
		return fmt.Sprintf("peer %s (%s) never completed a handshake in the %s it had", p.Name, where, p.Allowed)
	}
	age := "unknown"
	if !p.LastHandshake.IsZero() && !now.IsZero() {
		age = now.Sub(p.LastHandshake).Round(time.Second).String()
	}
	return fmt.Sprintf("peer %s (%s) is down: last handshake %s ago, allowed %s", p.Name, where, age, p.Allowed)
}

func peerFix(p AgentPeer) string {
	if p.State == "missing" {
		return "the agent failed to configure it: read its log"
	}
	return "check the peer's endpoint is reachable over UDP from this node (firewall, NAT: a NATed side needs persistent keepalive), that both sides have each other's current key, and `meshlet status` on both ends"
}

// Errors counts the findings of severity error.
func Errors(fs []Finding) int {
	n := 0
	for _, f := range fs {
		if f.Severity == Error {
			n++
		}
	}
	return n
}
