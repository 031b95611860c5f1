package kilo

import (
	"net/netip"
	"reflect"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
)

func testNode(name string, ann map[string]string, mutate ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann, Labels: map[string]string{"topology.kubernetes.io/region": "eu"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
	}
	for _, m := range mutate {
		m(n)
	}
	return n
}

// fields returns the (field, reason) pairs of rejections, sorted.
func fields(rs []topology.Rejection) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Field+"="+string(r.Reason))
	}
	sort.Strings(out)
	return out
}

func TestConvertNode(t *testing.T) {
	k := testKey(1)
	full := map[string]string{
		topology.AnnotationLocation:            "fra",
		topology.AnnotationLeader:              "",
		topology.AnnotationEndpoint:            "198.51.100.1:51820",
		topology.AnnotationInternalIP:          "192.168.1.34/24",
		topology.AnnotationKey:                 k.String(),
		topology.AnnotationLastSeen:            "1700000000",
		topology.AnnotationWireGuardIP:         "100.66.0.1/16",
		topology.AnnotationPersistentKeepalive: "25",
		topology.AnnotationAllowedLocationIPs:  "192.168.50.0/24",
		topology.AnnotationDiscoveredEndpoints: `{"` + testKey(2).String() + `":{"IP":"203.0.113.9","Port":40000,"Zone":""}}`,
		topology.AnnotationGranularity:         "location",
		topology.AnnotationCNICompatibilityIP:  "10.244.1.17/32",
		"unrelated.example.com/x":              "y",
	}
	tests := []struct {
		name      string
		node      *corev1.Node
		check     func(t *testing.T, n topology.Node)
		rejected  []string
		remoteBad bool
	}{
		{
			name: "every annotation",
			node: testNode("n1", full),
			check: func(t *testing.T, n topology.Node) {
				want := topology.Node{
					Name: "n1", Labels: map[string]string{"topology.kubernetes.io/region": "eu"},
					LocationAnnotation: "fra", Leader: true, Endpoint: "198.51.100.1:51820",
					InternalIP: netip.MustParsePrefix("192.168.1.34/24"), PublicKey: k,
					WireGuardIP: netip.MustParsePrefix("100.66.0.1/16"), PodCIDRs: prefixes("10.244.1.0/24"),
					LastSeen: time.Unix(1700000000, 0).UTC(), PersistentKeepalive: 25,
					AllowedLocationIPs:  prefixes("192.168.50.0/24"),
					DiscoveredEndpoints: map[topology.Key]netip.AddrPort{testKey(2): netip.MustParseAddrPort("203.0.113.9:40000")},
					Granularity:         topology.GranularityLocation, CNICompatibilityIP: netip.MustParsePrefix("10.244.1.17/32"),
					Ready: true,
				}
				if !reflect.DeepEqual(n, want) {
					t.Fatalf("got  %+v\nwant %+v", n, want)
				}
			},
		},
		{
			name: "force-endpoint wins and is kept separately",
			node: testNode("n", map[string]string{topology.AnnotationEndpoint: "10.0.0.1:51820", topology.AnnotationForceEndpoint: "[2001:db8::1]:51821"}),
			check: func(t *testing.T, n topology.Node) {
				if n.Endpoint != "[2001:db8::1]:51821" || n.ForceEndpoint != "[2001:db8::1]:51821" {
					t.Fatalf("endpoint %q force %q", n.Endpoint, n.ForceEndpoint)
				}
			},
		},
		{
			name: "malformed force-endpoint: in-cluster falls back as Kilo, remote use is invalid",
			node: testNode("n", map[string]string{topology.AnnotationEndpoint: "10.0.0.1:51820", topology.AnnotationForceEndpoint: "10.0.0.9"}),
			check: func(t *testing.T, n topology.Node) {
				if n.Endpoint != "10.0.0.1:51820" || n.ForceEndpoint != "" {
					t.Fatalf("endpoint %q force %q", n.Endpoint, n.ForceEndpoint)
				}
			},
			rejected:  []string{topology.AnnotationForceEndpoint + "=InvalidEndpoint"},
			remoteBad: true,
		},
		{
			name:      "malformed clustermesh-endpoint blocks remote use even with valid force-endpoint",
			node:      testNode("n", map[string]string{topology.AnnotationClusterMeshEndpoint: "x:y", topology.AnnotationForceEndpoint: "1.2.3.4:5"}),
			rejected:  []string{topology.AnnotationClusterMeshEndpoint + "=InvalidEndpoint"},
			remoteBad: true,
		},
		{
			name: "valid clustermesh-endpoint shadows malformed later sources",
			node: testNode("n", map[string]string{topology.AnnotationClusterMeshEndpoint: "gw.example.com:51820", topology.AnnotationEndpoint: "bad"}),
			check: func(t *testing.T, n topology.Node) {
				if n.ClusterMeshEndpoint != "gw.example.com:51820" || n.Endpoint != "" {
					t.Fatalf("cm %q endpoint %q", n.ClusterMeshEndpoint, n.Endpoint)
				}
			},
			rejected: []string{topology.AnnotationEndpoint + "=InvalidEndpoint"},
		},
		{
			name: "ExternalIP shadows a malformed endpoint annotation for remote use",
			node: testNode("n", map[string]string{topology.AnnotationEndpoint: "bad"}, func(n *corev1.Node) {
				n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "198.51.100.3"}}
			}),
			rejected: []string{topology.AnnotationEndpoint + "=InvalidEndpoint"},
		},
		{
			name:      "malformed endpoint with no earlier source",
			node:      testNode("n", map[string]string{topology.AnnotationEndpoint: "bad"}),
			rejected:  []string{topology.AnnotationEndpoint + "=InvalidEndpoint"},
			remoteBad: true,
		},
		{
			name: "force-internal-ip overrides internal-ip",
			node: testNode("n", map[string]string{topology.AnnotationInternalIP: "192.168.1.34/24", topology.AnnotationForceInternalIP: "10.9.0.1/32"}),
			check: func(t *testing.T, n topology.Node) {
				if n.InternalIP != netip.MustParsePrefix("10.9.0.1/32") {
					t.Fatalf("internal %v", n.InternalIP)
				}
			},
		},
		{
			name: `force-internal-ip "-" means none`,
			node: testNode("n", map[string]string{topology.AnnotationInternalIP: "192.168.1.34/24", topology.AnnotationForceInternalIP: "-"}),
			check: func(t *testing.T, n topology.Node) {
				if n.InternalIP.IsValid() {
					t.Fatalf("internal %v", n.InternalIP)
				}
			},
		},
		{
			name: `force-internal-ip "" means none`,
			node: testNode("n", map[string]string{topology.AnnotationInternalIP: "192.168.1.34/24", topology.AnnotationForceInternalIP: ""}),
			check: func(t *testing.T, n topology.Node) {
				if n.InternalIP.IsValid() {
					t.Fatalf("internal %v", n.InternalIP)
				}
			},
		},
		{
			name: "malformed force-internal-ip falls back to internal-ip (Kilo)",
			node: testNode("n", map[string]string{topology.AnnotationInternalIP: "192.168.1.34/24", topology.AnnotationForceInternalIP: "nope"}),
			check: func(t *testing.T, n topology.Node) {
				if n.InternalIP != netip.MustParsePrefix("192.168.1.34/24") {
					t.Fatalf("internal %v", n.InternalIP)
				}
			},
			rejected: []string{topology.AnnotationForceInternalIP + "=InvalidCIDR"},
		},
		{
			name: "malformed values become rejections, fields empty or Kilo defaults",
			node: testNode("n", map[string]string{
				topology.AnnotationKey: "short", topology.AnnotationWireGuardIP: "100.66.0.1", topology.AnnotationInternalIP: "x",
				topology.AnnotationLastSeen: "soon", topology.AnnotationPersistentKeepalive: "25s", topology.AnnotationGranularity: "mesh",
				topology.AnnotationCNICompatibilityIP: "1", topology.AnnotationDiscoveredEndpoints: "{", topology.AnnotationAllowedLocationIPs: "10.0.0.0/8,x",
			}),
			check: func(t *testing.T, n topology.Node) {
				if !n.PublicKey.IsZero() || n.WireGuardIP.IsValid() || n.InternalIP.IsValid() || !n.LastSeen.IsZero() ||
					n.PersistentKeepalive != 0 || n.Granularity != "" || n.CNICompatibilityIP.IsValid() || n.DiscoveredEndpoints != nil ||
					!reflect.DeepEqual(n.AllowedLocationIPs, prefixes("10.0.0.0/8")) {
					t.Fatalf("fields not defaulted: %+v", n)
				}
			},
			rejected: []string{
				topology.AnnotationAllowedLocationIPs + "=InvalidCIDR",
				topology.AnnotationCNICompatibilityIP + "=InvalidCIDR",
				topology.AnnotationDiscoveredEndpoints + "=InvalidEndpoint",
				topology.AnnotationGranularity + "=InvalidAnnotation",
				topology.AnnotationInternalIP + "=InvalidCIDR",
				topology.AnnotationKey + "=InvalidKey",
				topology.AnnotationLastSeen + "=InvalidAnnotation",
				topology.AnnotationPersistentKeepalive + "=InvalidAnnotation",
				topology.AnnotationWireGuardIP + "=InvalidCIDR",
			},
		},
		{
			name: "ready condition, external IPs IPv4 first, podCIDR fallback",
			node: testNode("n", nil, func(n *corev1.Node) {
				n.Spec.PodCIDRs = nil
				n.Spec.PodCIDR = "10.244.7.1/24"
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue},
					{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}
				n.Status.Addresses = []corev1.NodeAddress{
					{Type: corev1.NodeInternalIP, Address: "192.168.1.2"},
					{Type: corev1.NodeExternalIP, Address: "2001:db8::5"},
					{Type: corev1.NodeExternalIP, Address: "198.51.100.5"},
					{Type: corev1.NodeExternalIP, Address: "198.51.100.5"},
					{Type: corev1.NodeExternalIP, Address: "198.51.100.6"},
					{Type: corev1.NodeExternalIP, Address: "garbage"},
					{Type: corev1.NodeHostName, Address: "n"},
				}
			}),
			check: func(t *testing.T, n topology.Node) {
				wantIPs := []netip.Addr{netip.MustParseAddr("198.51.100.5"), netip.MustParseAddr("198.51.100.6"), netip.MustParseAddr("2001:db8::5")}
				if n.Ready || !reflect.DeepEqual(n.ExternalIPs, wantIPs) || !reflect.DeepEqual(n.PodCIDRs, prefixes("10.244.7.0/24")) {
					t.Fatalf("ready %v ips %v pods %v", n.Ready, n.ExternalIPs, n.PodCIDRs)
				}
			},
			rejected: []string{"status.addresses=InvalidEndpoint"},
		},
		{
			name: "cordoned (kubectl cordon, a drain's first step)",
			node: testNode("n", nil, func(n *corev1.Node) { n.Spec.Unschedulable = true }),
			check: func(t *testing.T, n topology.Node) {
				if n.Leaving != topology.LeavingCordoned {
					t.Fatalf("leaving %q, want %q", n.Leaving, topology.LeavingCordoned)
				}
			},
		},
		{
			name: "being deleted",
			node: testNode("n", nil, func(n *corev1.Node) {
				n.Spec.Unschedulable = true
				ts := metav1.Now()
				n.DeletionTimestamp = &ts
			}),
			check: func(t *testing.T, n topology.Node) {
				if n.Leaving != topology.LeavingDeleting {
					t.Fatalf("leaving %q, want %q", n.Leaving, topology.LeavingDeleting)
				}
			},
		},
		{
			// Kilo routes spec.podCIDR only: the second family of a
			// dual-stack node is not part of the mesh.
			name: "dual-stack: spec.podCIDR only, as Kilo",
			node: testNode("n", nil, func(n *corev1.Node) {
				n.Spec.PodCIDR = "10.244.1.0/24"
				n.Spec.PodCIDRs = []string{"10.244.1.0/24", "fd00:10:244:1::/64"}
			}),
			check: func(t *testing.T, n topology.Node) {
				if !reflect.DeepEqual(n.PodCIDRs, prefixes("10.244.1.0/24")) {
					t.Fatalf("pods %v", n.PodCIDRs)
				}
			},
		},
		{
			name: "only spec.podCIDRs set: its first entry",
			node: testNode("n", nil, func(n *corev1.Node) {
				n.Spec.PodCIDR = ""
				n.Spec.PodCIDRs = []string{"fd00:10:244:1::/64", "10.244.1.0/24"}
			}),
			check: func(t *testing.T, n topology.Node) {
				if !reflect.DeepEqual(n.PodCIDRs, prefixes("fd00:10:244:1::/64")) {
					t.Fatalf("pods %v", n.PodCIDRs)
				}
			},
		},
		{
			name: "bad spec.podCIDR",
			node: testNode("n", nil, func(n *corev1.Node) {
				n.Spec.PodCIDR = "bad"
				n.Spec.PodCIDRs = []string{"bad"}
			}),
			check: func(t *testing.T, n topology.Node) {
				if len(n.PodCIDRs) != 0 {
					t.Fatalf("pods %v", n.PodCIDRs)
				}
			},
			rejected: []string{"spec.podCIDR=InvalidCIDR"},
		},
		{
			name: "no conditions means ready; location annotation absent",
			node: testNode("n", nil),
			check: func(t *testing.T, n topology.Node) {
				if !n.Ready || n.LocationAnnotation != "" || n.Leader {
					t.Fatalf("%+v", n)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ConvertNode(tt.node, "remote-a")
			if tt.check != nil {
				tt.check(t, r.Node)
			}
			if got := fields(r.Rejections); !reflect.DeepEqual(got, tt.rejected) {
				t.Fatalf("rejections %v, want %v", got, tt.rejected)
			}
			for _, rej := range r.Rejections {
				if rej.Object != (topology.ObjectRef{Kind: "Node", Cluster: "remote-a", Name: tt.node.Name}) || rej.Message == "" {
					t.Fatalf("bad rejection %+v", rej)
				}
			}
			if r.Node.MalformedEndpoint != tt.remoteBad {
				t.Fatalf("MalformedEndpoint = %v, want %v", r.Node.MalformedEndpoint, tt.remoteBad)
			}
			n, rejs := NodeToTopology(tt.node, "remote-a")
			if !reflect.DeepEqual(n, r.Node) || !reflect.DeepEqual(rejs, r.Rejections) {
				t.Fatal("NodeToTopology differs from ConvertNode")
			}
		})
	}
	if r := ConvertNode(nil, ""); !reflect.DeepEqual(r, NodeResult{}) {
		t.Fatalf("nil node: %+v", r)
	}
}

// TestNodeAnnotationsRoundTrip: ConvertNode(node with NodeAnnotations(n)) == n.
func TestNodeAnnotationsRoundTrip(t *testing.T) {
	nodes := []topology.Node{
		{Name: "a", Ready: true},
		{
			Name: "b", Labels: map[string]string{"x": "y"}, LocationAnnotation: "fra", Leader: true,
			Endpoint: "[2001:db8::1]:51820", ForceEndpoint: "[2001:db8::1]:51820", ClusterMeshEndpoint: "gw.example.com:4000",
			InternalIP: netip.MustParsePrefix("192.168.1.34/24"), PublicKey: testKey(5),
			WireGuardIP: netip.MustParsePrefix("100.66.0.2/16"), PodCIDRs: prefixes("10.244.2.0/24"),
			LastSeen: time.Unix(1764470000, 0).UTC(), PersistentKeepalive: 25,
			AllowedLocationIPs:  prefixes("10.10.0.0/16", "192.168.60.0/24"),
			DiscoveredEndpoints: map[topology.Key]netip.AddrPort{testKey(6): netip.MustParseAddrPort("203.0.113.6:1234")},
			Granularity:         topology.GranularityCross, CNICompatibilityIP: netip.MustParsePrefix("10.244.2.9/32"), Ready: true,
		},
	}
	for _, want := range nodes {
		k8s := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: want.Name, Labels: want.Labels, Annotations: NodeAnnotations(want)}}
		for _, p := range want.PodCIDRs {
			k8s.Spec.PodCIDRs = append(k8s.Spec.PodCIDRs, p.String())
		}
		got, rejs := NodeToTopology(k8s, "")
		if len(rejs) > 0 || !reflect.DeepEqual(got, want) {
			t.Errorf("round trip:\n got %+v %v\nwant %+v", got, rejs, want)
		}
	}
}

func TestTransformNode(t *testing.T) {
	ann := map[string]string{
		topology.AnnotationEndpoint: "198.51.100.1:51820", topology.AnnotationKey: testKey(1).String(),
		topology.AnnotationNodePersistentKeepalive: "[]", "node.alpha.kubernetes.io/ttl": "0",
		"kubectl.kubernetes.io/last-applied-configuration": "{...}",
	}
	n := testNode("n1", ann, func(n *corev1.Node) {
		n.UID = "uid-1"
		n.ResourceVersion = "42"
		n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
		n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}
		n.Status.Images = []corev1.ContainerImage{{Names: []string{"big"}}}
		n.Status.NodeInfo.KubeletVersion = "v1.34.0"
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.2"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.1"}}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse},
			{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", LastHeartbeatTime: metav1.Now()}}
	})
	orig := n.DeepCopy()
	obj, err := TransformNode(n)
	if err != nil {
		t.Fatal(err)
	}
	s := obj.(*corev1.Node)
	if !reflect.DeepEqual(n, orig) {
		t.Fatal("TransformNode mutated its input")
	}
	if len(s.ManagedFields) != 0 || len(s.Status.Images) != 0 || s.Status.NodeInfo.KubeletVersion != "" || len(s.Spec.Taints) != 0 ||
		len(s.Status.Conditions) != 1 || len(s.Status.Addresses) != 2 || len(s.Annotations) != 3 || s.UID != "uid-1" || s.ResourceVersion != "42" {
		t.Fatalf("not stripped as expected: %+v", s)
	}
	wantN, wantR := NodeToTopology(n, "c")
	gotN, gotR := NodeToTopology(s, "c")
	if !reflect.DeepEqual(gotN, wantN) || !reflect.DeepEqual(gotR, wantR) {
		t.Fatalf("conversion changed by transform:\n got %+v\nwant %+v", gotN, wantN)
	}
	// Idempotent: client-go may transform an object twice.
	again, _ := TransformNode(s)
	if !reflect.DeepEqual(again, s) {
		t.Fatal("TransformNode is not idempotent")
	}
	// Other objects (tombstones) pass through.
	tomb := struct{ Key string }{"n1"}
	if o, err := TransformNode(tomb); err != nil || o != tomb {
		t.Fatal("non-Node not passed through")
	}
}

// TestMeshletMarksLiveness: meshlet's marks (version, tunnels, degraded)
// count while the node's last-seen is meshlet's own (meshlet.io/seen); a
// last-seen refreshed after it (kg runs the node again) makes them stale,
// and the node is a kg node. Without meshlet.io/seen (a meshlet before it)
// the marks are trusted.
func TestMeshletMarksLiveness(t *testing.T) {
	for _, tc := range []struct {
		name      string
		seen      string // "" = absent
		lastSeen  string
		wantMesh  bool
		wantStale bool
	}{
		{"meshlet wrote last-seen", "1800000000", "1800000000", true, false},
		{"kg refreshed last-seen since", "1800000000", "1800000030", false, true},
		{"seen unparsable", "soon", "1800000000", false, true},
		{"no seen: an older meshlet", "", "1800000000", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{topology.AnnotationVersion: "v1", topology.AnnotationTunnels: topology.TunnelsUp,
				topology.AnnotationDegraded: "WireGuardDegraded", topology.AnnotationLastSeen: tc.lastSeen}
			if tc.seen != "" {
				ann[topology.AnnotationSeen] = tc.seen
			}
			n := ConvertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: ann}}, "").Node
			if (n.MeshletVersion != "") != tc.wantMesh || n.MarksStale != tc.wantStale {
				t.Fatalf("version %q, stale %v; want meshlet %v, stale %v", n.MeshletVersion, n.MarksStale, tc.wantMesh, tc.wantStale)
			}
			if tc.wantStale && (n.Tunnels != "" || n.Degraded != "") {
				t.Errorf("stale marks kept: tunnels %q, degraded %q", n.Tunnels, n.Degraded)
			}
		})
	}
}
