package topology

import (
	"net/netip"
	"sort"
	"strconv"
	"time"
)

// What this node publishes on its own Node object, and the plan's final
// form: sorted, de-duplicated, each rejection with the node that reports
// it.

// Annotations is what this node writes on its own Node object, in Kilo's
// formats: its key, endpoint, private IP, last-seen, granularity, version,
// Cilium's cni-compatibility-ip, and its WireGuard IP when it leads.
func Annotations(self Self, h Host, set Settings, now time.Time, wireGuardIP netip.Prefix, leader bool) map[string]string {
	a := map[string]string{}
	if !self.PublicKey.IsZero() {
		a[AnnotationKey] = self.PublicKey.String()
	}
	a[AnnotationEndpoint] = h.Endpoint
	a[AnnotationInternalIP] = FormatPrefix(h.Private.Prefix)
	a[AnnotationLastSeen] = FormatLastSeen(now)
	a[AnnotationWireGuardIP] = ""
	if leader {
		a[AnnotationWireGuardIP] = wireGuardIP.String()
	}
	a[AnnotationGranularity] = string(set.Granularity)
	a[AnnotationVersion] = self.Version
	a[AnnotationCNICompatibilityIP] = ""
	if set.Compatibility == CompatibilityCilium {
		a[AnnotationCNICompatibilityIP] = FormatPrefix(self.CiliumHostIP)
	}
	return a
}

// WithLastSeen decides this node's heartbeat (Kilo's last-seen, and
// meshlet.io/seen, its copy that tells meshlet's last-seen from kg's): the
// published values stay while the published last-seen is meshlet's (seen
// equal to it), younger than LastSeenRefresh and nothing else in want
// differs from what is published; otherwise both are now, riding along with
// whatever else changes. So a quiet node patches its Node once per refresh,
// as kg does, and the publisher writes what differs and decides nothing.
// want already holds last-seen as now (Annotations).
func WithLastSeen(want, published map[string]string, now time.Time) map[string]string {
	fresh := false
	if ls, ok := published[AnnotationLastSeen]; ok && published[AnnotationSeen] == ls {
		if sec, err := strconv.ParseInt(ls, 10, 64); err == nil && now.Sub(time.Unix(sec, 0)) < LastSeenRefresh {
			fresh = true
		}
	}
	for k, v := range want {
		if k == AnnotationLastSeen || k == AnnotationSeen {
			continue
		}
		if old, ok := published[k]; !ok || old != v {
			fresh = false
			break
		}
	}
	if fresh {
		want[AnnotationLastSeen] = published[AnnotationLastSeen]
	}
	want[AnnotationSeen] = want[AnnotationLastSeen]
	return want
}

// CNIRange is the IPAM range of Kilo's CNI configuration list (kg's
// --cni): the node's pod CIDR as its Node says, once it has one; nothing
// while the file cannot be written (rejected: it stays as it is).
func CNIRange(set Settings, self Self, published *Node) (netip.Prefix, []Rejection) {
	if !set.CNI || published == nil || len(published.PodCIDRs) == 0 {
		return netip.Prefix{}, nil
	}
	if self.CNI.Err != "" {
		return netip.Prefix{}, []Rejection{{Object: ObjectRef{Kind: "Node", Name: self.Name}, Field: "cni-path",
			Reason: ReasonInvalidCNIConfig, Message: self.CNI.Err + "; the file is left as it is (the install-cni init container writes it)"}}
	}
	return published.PodCIDRs[0].Masked(), nil
}

// DiscoveredToPublish is what this node publishes in discovered-endpoints,
// Kilo's set (discoverNATEndpoints): what its device learned for segment
// leaders that keep a keepalive themselves and for every Peer; for remote
// peers (meshlet's), what it learned for those that roam.
func DiscoveredToPublish(self Self, l Local, peers []WireGuardPeer) map[Key]netip.AddrPort {
	natted := map[Key]bool{}
	for _, s := range l.Segments {
		natted[s.LeaderNode().PublicKey] = s.LeaderNode().PersistentKeepalive != 0
	}
	learned := deviceEndpoints(self)
	out := map[Key]netip.AddrPort{}
	for _, wp := range peers {
		ap, ok := learned[wp.PublicKey]
		if !ok || !usableDiscovered(ap) {
			continue
		}
		switch {
		case wp.Kind == KindSegment && natted[wp.PublicKey], wp.Kind == KindPeer, wp.Kind == KindRemote && wp.Roaming:
			out[wp.PublicKey] = ap
		}
	}
	return out
}

// Normalize sorts what must be deterministic, drops what the kernel cannot
// hold (oneFamily, dedupRoutes) and assigns each rejection its reporter.
func Normalize(pl Plan, l Local, set Settings, self string) Plan {
	peers := append([]WireGuardPeer(nil), pl.WireGuard.Peers...)
	sort.SliceStable(peers, func(i, j int) bool {
		a, b := peers[i], peers[j]
		if a.Kind != b.Kind {
			return kindOrder(a.Kind) < kindOrder(b.Kind)
		}
		if a.Cluster != b.Cluster {
			return a.Cluster < b.Cluster
		}
		return a.Name < b.Name
	})
	pl.WireGuard.Peers = peers
	pl.Routes = oneFamily(dedupRoutes(pl.Routes), set.Interface)
	sort.SliceStable(pl.Routes, func(i, j int) bool { return routeLess(pl.Routes[i], pl.Routes[j]) })
	pl.Rules = oneFamilyRules(dedupRules(pl.Rules))
	sort.SliceStable(pl.Rules, func(i, j int) bool { return ruleLess(pl.Rules[i], pl.Rules[j]) })
	rejs := append([]Rejection(nil), pl.Rejections...)
	sort.SliceStable(rejs, func(i, j int) bool {
		a, b := rejs[i], rejs[j]
		if a.Object.String() != b.Object.String() {
			return a.Object.String() < b.Object.String()
		}
		if a.Field != b.Field {
			return a.Field < b.Field
		}
		return a.Message < b.Message
	})
	pl.Rejections = assignReporters(dedupRejections(rejs), l, self)
	if pl.WireGuard.Peers == nil {
		pl.WireGuard.Peers = []WireGuardPeer{}
	}
	if pl.Routes == nil {
		pl.Routes = []Route{}
	}
	if pl.Rules == nil {
		pl.Rules = []Rule{}
	}
	if pl.Rejections == nil {
		pl.Rejections = []Rejection{}
	}
	return pl
}

// assignReporters sets each rejection's Reporter (see Rejection): only Ready
// nodes that run meshlet (meshlet.io/version) can write an Event.
func assignReporters(rejs []Rejection, l Local, self string) []Rejection {
	runs := map[string]bool{}
	var leaders, others []string
	for _, s := range l.Segments {
		for _, n := range s.Nodes {
			if n.MeshletVersion == "" {
				continue
			}
			runs[n.Name] = true
			if n == s.LeaderNode() {
				leaders = append(leaders, n.Name)
			} else {
				others = append(others, n.Name)
			}
		}
	}
	sort.Strings(leaders)
	sort.Strings(others)
	reporter := self
	switch {
	case len(leaders) > 0:
		reporter = leaders[0]
	case len(others) > 0:
		reporter = others[0]
	}
	for i := range rejs {
		r := &rejs[i]
		r.Reporter = reporter
		if r.Object.Kind == "Node" && r.Object.Cluster == "" && runs[r.Object.Name] {
			r.Reporter = r.Object.Name
		}
	}
	return rejs
}

func kindOrder(k PeerKind) int {
	switch k {
	case KindSegment:
		return 0
	case KindPeer:
		return 1
	}
	return 2
}

func dedupRejections(rs []Rejection) []Rejection {
	out := rs[:0]
	for i, r := range rs {
		if i > 0 && r == rs[i-1] {
			continue
		}
		out = append(out, r)
	}
	return out
}

// PublishedTunnels is what the node of a public key publishes of its
// tunnels (local segment leaders and remote leaders): the input
// failover's health judgement compares its own probes with.
func PublishedTunnels(snap Snapshot) func(Key) string {
	return func(k Key) string {
		for i := range snap.Nodes {
			if snap.Nodes[i].PublicKey == k {
				return snap.Nodes[i].Tunnels
			}
		}
		for _, r := range snap.Remotes {
			for i := range r.Nodes {
				if r.Nodes[i].PublicKey == k {
					return r.Nodes[i].Tunnels
				}
			}
		}
		return ""
	}
}

// NextReadinessChange is the earliest time after snap.Now at which a node
// (local or remote) that is fresh now stops being Ready because its
// last-seen ages past Kilo's window; zero when none will. Nothing notifies
// the agent of an annotation that does NOT change, so the loop re-plans at
// that moment instead of at the next resync: a dead leader is replaced as
// soon as Kilo's rule allows, not up to a resync period later.
func NextReadinessChange(snap Snapshot) time.Time {
	var next time.Time
	consider := func(ns []Node) {
		for i := range ns {
			if ns[i].LastSeen.IsZero() {
				continue
			}
			t := ns[i].LastSeen.Add(ReadyWindow)
			if t.After(snap.Now) && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
	}
	consider(snap.Nodes)
	for _, r := range snap.Remotes {
		if !r.ObservedAt.IsZero() {
			continue // frozen while its API is unreachable
		}
		newest := newestLastSeen(r.Nodes)
		for i := range r.Nodes {
			n := &r.Nodes[i]
			if n.Heard.IsZero() || n.LastSeen.IsZero() {
				continue
			}
			// RemoteAge grows with the time since Heard only.
			if RemoteAge(n, newest, snap.Now) < ReadyWindow {
				if t := n.Heard.Add(ReadyWindow); next.IsZero() || t.Before(next) {
					next = t
				}
			}
		}
		consider(withoutHeard(r.Nodes))
	}
	return next
}

// withoutHeard are the nodes judged by their last-seen alone.
func withoutHeard(ns []Node) []Node {
	var out []Node
	for _, n := range ns {
		if n.Heard.IsZero() {
			out = append(out, n)
		}
	}
	return out
}
