package cluster

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// Hostile input, measured from the Kubernetes objects to the plan: each
// object goes through what a watcher does with it (objects.setNode /
// setPeer: kilo's conversion), then the snapshot through planner.Compute,
// for the leader of a small ordinary local cluster (docs/security.md#hostile-input).

var budgetNow = time.Unix(1_800_000_000, 0).UTC()

// budgetKey is a distinct WireGuard key per (space, i).
func budgetKey(space, i int) string {
	var k [32]byte
	k[0], k[1], k[2], k[3], k[31] = byte(space), byte(i>>16), byte(i>>8), byte(i), 0x42
	return base64.StdEncoding.EncodeToString(k[:])
}

// budgetNode is a ready Kilo node: location loc, its own key, endpoint and
// pod CIDR; space tells clusters apart (0 = local, 10.100.0.0/16 for pods;
// else remote, 100.64.0.0/10 for pods and WireGuard IPs, and every node
// publishes a WireGuard IP, as a leader does).
func budgetNode(space, i int, loc string) *corev1.Node {
	ip := fmt.Sprintf("10.%d.%d.%d", space, i>>8&0xff, i&0xff)
	pod := fmt.Sprintf("10.100.%d.0/24", i)
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:              fmt.Sprintf("c%d-node-%06d", space, i),
			CreationTimestamp: metav1.NewTime(budgetNow.Add(time.Duration(i) * time.Second)),
			Annotations: map[string]string{
				topology.AnnotationKey:        budgetKey(space, i),
				topology.AnnotationEndpoint:   ip + ":51820",
				topology.AnnotationInternalIP: ip + "/16",
				topology.AnnotationLastSeen:   strconv.FormatInt(budgetNow.Unix(), 10),
				topology.AnnotationLocation:   loc,
			},
		},
	}
	if space != 0 {
		pod = addr4(100<<24|64<<16+i*16).String() + "/28"
		n.Annotations[topology.AnnotationWireGuardIP] = addr4(100<<24|96<<16+i).String() + "/10"
	}
	n.Spec.PodCIDR = pod
	return n
}

func addr4(a int) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
}

// budgetPeer is a roaming Peer with n allowed /32s (distinct per space, i).
func budgetPeer(space, i, n int) *kilo.Peer {
	p := &kilo.Peer{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d-peer-%06d", space, i),
			CreationTimestamp: metav1.NewTime(budgetNow.Add(time.Duration(i) * time.Second))},
		Spec: kilo.PeerSpec{PublicKey: budgetKey(200+space, i)},
	}
	base := 172<<24 | 16<<16 // local
	if space != 0 {
		base = 100<<24 | 120<<16 // inside the remote's allowedNetworks
	}
	for j := 0; j < n; j++ {
		p.Spec.AllowedIPs = append(p.Spec.AllowedIPs, addr4(base+i*n+j).String()+"/32")
	}
	return p
}

// budgetInput is one hostile case: the local cluster's and one remote
// cluster's objects, on top of ordinary ones.
type budgetInput struct {
	localNodes  []*corev1.Node
	localPeers  []*kilo.Peer
	remoteNodes []*corev1.Node
	remotePeers []*kilo.Peer
}

// ordinary is 10 local nodes in 2 locations (c0-node-000000 leads the
// first) with 10 Peers, and a remote cluster of 10 nodes.
func ordinary() budgetInput {
	var in budgetInput
	for i := 0; i < 10; i++ {
		in.localNodes = append(in.localNodes, budgetNode(0, i, fmt.Sprintf("loc-%d", i%2)))
		in.localPeers = append(in.localPeers, budgetPeer(0, i, 1))
		in.remoteNodes = append(in.remoteNodes, budgetNode(1, i, fmt.Sprintf("site-%d", i%2)))
	}
	in.localNodes[0].Annotations[topology.AnnotationLeader] = ""
	in.remotePeers = append(in.remotePeers, budgetPeer(1, 0, 1))
	return in
}

// cidrList is a comma-separated list of /32s of about size bytes.
func cidrList(size int) string {
	var b strings.Builder
	for i := 0; b.Len() < size-20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "192.168.%d.%d/32", i>>8&0xff, i&0xff)
	}
	return b.String()
}

// discovered is a discovered-endpoints annotation of about size bytes.
func discovered(size int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; b.Len() < size-100; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `%q:{"IP":"203.0.%d.%d","Port":51820,"Zone":""}`, budgetKey(99, i), i>>8&0xff, i&0xff)
	}
	b.WriteByte('}')
	return b.String()
}

// keepaliveRules is a node-persistent-keepalive annotation of about size
// bytes.
func keepaliveRules(size int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; b.Len() < size-60; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"value":%d,"location":"loc-%d"}`, i%60+1, i)
	}
	b.WriteByte(']')
	return b.String()
}

// annotationBudget is what Kubernetes allows all of an object's
// annotations together (apimachinery's TotalAnnotationSizeLimitB).
const annotationBudget = 256 << 10

func budgetCases() []struct {
	name string
	in   func() budgetInput
} {
	return []struct {
		name string
		in   func() budgetInput
	}{
		{"ordinary", ordinary},
		{"peer-allowedIPs=100000", func() budgetInput {
			in := ordinary()
			in.localPeers = append(in.localPeers, budgetPeer(0, 1000, 100000))
			return in
		}},
		{"peers=10000", func() budgetInput {
			in := ordinary()
			for i := 10; i < 10000; i++ {
				in.localPeers = append(in.localPeers, budgetPeer(0, i, 1))
			}
			return in
		}},
		{"allowed-location-ips=256KiB", func() budgetInput {
			in := ordinary()
			in.localNodes[1].Annotations[topology.AnnotationAllowedLocationIPs] = cidrList(annotationBudget)
			return in
		}},
		{"discovered-endpoints=256KiB", func() budgetInput {
			in := ordinary()
			in.localNodes[1].Annotations[topology.AnnotationDiscoveredEndpoints] = discovered(annotationBudget)
			return in
		}},
		{"node-persistent-keepalive=256KiB", func() budgetInput {
			in := ordinary()
			in.localPeers[1].Annotations = map[string]string{topology.AnnotationNodePersistentKeepalive: keepaliveRules(annotationBudget)}
			return in
		}},
		{"remote-nodes=50000", func() budgetInput {
			in := ordinary()
			in.remoteNodes = nil
			for i := 0; i < 50000; i++ {
				// Every node its own location: 50,000 segments.
				in.remoteNodes = append(in.remoteNodes, budgetNode(1, i, fmt.Sprintf("site-%d", i)))
			}
			return in
		}},
	}
}

// budgetSnapshot converts in as the watchers do and returns the snapshot.
func budgetSnapshot(in budgetInput, limits kilo.Limits) topology.Snapshot {
	local, remote := newObjects("", limits), newObjects("remote", limits)
	for _, n := range in.localNodes {
		local.setNode(n, false, budgetNow)
	}
	for _, p := range in.localPeers {
		local.setPeer(p, false)
	}
	for _, n := range in.remoteNodes {
		remote.setNode(n, false, budgetNow)
	}
	for _, p := range in.remotePeers {
		remote.setPeer(p, false)
	}
	snap := topology.Snapshot{Now: budgetNow, Settings: topology.Settings{Subnet: netip.MustParsePrefix("10.4.0.0/16")}}
	snap.Nodes, snap.Peers, snap.Rejections = local.state()
	rc := topology.RemoteCluster{Name: "remote", Synced: true}
	var rejs []topology.Rejection
	rc.Nodes, rc.Peers, rejs = remote.state()
	snap.Remotes = []topology.RemoteCluster{rc}
	snap.Rejections = append(snap.Rejections, rejs...)
	snap.Meshes = []topology.Mesh{{Namespace: "kilo-system", Name: "mesh", Clusters: []topology.MeshCluster{
		{Name: "local", Local: true, AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16")}},
		{Name: "remote", WireGuardPort: 51820, AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")}},
	}}}
	return snap
}

// budgetSelf is what the agent on the local leader observes.
func budgetSelf(snap topology.Snapshot) topology.Self {
	n := snap.Nodes[0]
	return topology.Self{Name: n.Name, PublicKey: n.PublicKey, DefaultInterface: "eth0", DefaultMTU: 1500,
		Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: n.InternalIP}}}
}

// BenchmarkHostileInput: per case, the conversion of every object (as the
// watchers do it), the heap the snapshot holds, and one plan of the
// local leader, without limits (Kilo's behaviour) and with meshlet's
// defaults. Run with -benchtime=1x: a case is one pass.
func BenchmarkHostileInput(b *testing.B) {
	for _, c := range budgetCases() {
		for _, l := range []struct {
			name   string
			limits kilo.Limits
		}{{"none", kilo.Limits{}}, {"default", kilo.DefaultLimits}} {
			b.Run(c.name+"/limits="+l.name, func(b *testing.B) {
				in := c.in()
				var convert, plan time.Duration
				var pl topology.Plan
				var held uint64
				for b.Loop() {
					before := liveHeap()
					t0 := time.Now()
					snap := budgetSnapshot(in, l.limits)
					convert = time.Since(t0)
					held = max(liveHeap(), before) - before
					t0 = time.Now()
					pl = planner.Compute(snap, budgetSelf(snap))
					plan = time.Since(t0)
				}
				if !pl.Leader {
					b.Fatalf("%s does not lead: %v", pl.Node, pl.Rejections[:min(3, len(pl.Rejections))])
				}
				b.ReportMetric(convert.Seconds()*1000, "convert-ms")
				b.ReportMetric(plan.Seconds()*1000, "plan-ms")
				b.ReportMetric(float64(held)/(1<<20), "snapshot-MiB")
				b.ReportMetric(float64(len(pl.WireGuard.Peers)), "wg-peers")
				b.ReportMetric(float64(countAllowedIPs(pl)), "wg-allowedIPs")
				b.ReportMetric(float64(len(pl.Routes)), "routes")
				b.ReportMetric(float64(len(pl.Rejections)), "rejections")
			})
		}
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func countAllowedIPs(pl topology.Plan) int {
	n := 0
	for _, p := range pl.WireGuard.Peers {
		n += len(p.AllowedIPs)
	}
	return n
}
