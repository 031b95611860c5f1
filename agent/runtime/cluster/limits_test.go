package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// TestCountLimits: a cluster over --max-peers or --max-remote-nodes keeps
// its oldest objects (creation time, then name), whatever their names, and
// says so in one LimitExceeded rejection on the oldest left out; the local
// cluster's nodes are never limited.
func TestCountLimits(t *testing.T) {
	// created i: object i was created i seconds after budgetNow; names
	// sort the other way round, so name order would pick the newest.
	peer := func(i int) *kilo.Peer {
		p := budgetPeer(0, i, 1)
		p.Name = fmt.Sprintf("peer-%03d", 100-i)
		return p
	}
	for _, tc := range []struct {
		name           string
		cluster        string
		limits         kilo.Limits
		nodes, peers   int
		sameTime       bool // every object created in the same second
		wantNodes      []string
		wantPeers      []string
		wantRejections []string // Object of each LimitExceeded
	}{
		{"under the limits", "remote", kilo.Limits{Peers: 5, RemoteNodes: 5}, 5, 5, false,
			[]string{"c1-node-000000", "c1-node-000001", "c1-node-000002", "c1-node-000003", "c1-node-000004"},
			[]string{"peer-096", "peer-097", "peer-098", "peer-099", "peer-100"}, nil},
		{"remote over both: the oldest kept", "remote", kilo.Limits{Peers: 2, RemoteNodes: 3}, 5, 5, false,
			[]string{"c1-node-000000", "c1-node-000001", "c1-node-000002"},
			[]string{"peer-099", "peer-100"},
			[]string{"remote:Node/c1-node-000003", "remote:Peer/peer-098"}},
		{"same creation time: by name", "remote", kilo.Limits{Peers: 2}, 1, 4, true,
			[]string{"c1-node-000000"}, []string{"peer-097", "peer-098"}, []string{"remote:Peer/peer-099"}},
		{"local nodes are not limited", "", kilo.Limits{Peers: 1, RemoteNodes: 1}, 3, 2, false,
			[]string{"c0-node-000000", "c0-node-000001", "c0-node-000002"}, []string{"peer-100"}, []string{"Peer/peer-099"}},
		{"zero: no limit", "remote", kilo.Limits{}, 4, 3, false,
			[]string{"c1-node-000000", "c1-node-000001", "c1-node-000002", "c1-node-000003"},
			[]string{"peer-098", "peer-099", "peer-100"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			space := 1
			if tc.cluster == "" {
				space = 0
			}
			o := newObjects(tc.cluster, tc.limits)
			for i := tc.nodes - 1; i >= 0; i-- { // arrival order is not creation order
				n := budgetNode(space, i, "x")
				if tc.sameTime {
					n.CreationTimestamp = metav1.NewTime(budgetNow)
				}
				o.setNode(n, false, budgetNow)
			}
			for i := 0; i < tc.peers; i++ {
				p := peer(i)
				if tc.sameTime {
					p.CreationTimestamp = metav1.NewTime(budgetNow)
				}
				o.setPeer(p, false)
			}
			nodes, peers, rejs := o.state()
			var gotNodes, gotPeers, gotRejs []string
			for _, n := range nodes {
				gotNodes = append(gotNodes, n.Name)
			}
			for _, p := range peers {
				gotPeers = append(gotPeers, p.Name)
			}
			for _, r := range rejs {
				if r.Reason != topology.ReasonLimitExceeded {
					t.Errorf("unexpected rejection %+v", r)
					continue
				}
				gotRejs = append(gotRejs, r.Object.String())
				if !strings.Contains(r.Message, "--max-") {
					t.Errorf("rejection %q does not name its flag", r.Message)
				}
			}
			if fmt.Sprint(gotNodes) != fmt.Sprint(tc.wantNodes) || fmt.Sprint(gotPeers) != fmt.Sprint(tc.wantPeers) || fmt.Sprint(gotRejs) != fmt.Sprint(tc.wantRejections) {
				t.Errorf("nodes %v peers %v rejections %v\nwant %v %v %v", gotNodes, gotPeers, gotRejs, tc.wantNodes, tc.wantPeers, tc.wantRejections)
			}
		})
	}
}

// TestLimitRejectionStable: a cluster that keeps growing past its limit
// keeps the same rejection (one Event), and the left-out objects' own
// rejections are not reported one by one.
func TestLimitRejectionStable(t *testing.T) {
	o := newObjects("remote", kilo.Limits{RemoteNodes: 2})
	var first []topology.Rejection
	for i := 0; i < 50; i++ {
		n := budgetNode(1, i, "x")
		if i >= 2 {
			n.Annotations[topology.AnnotationKey] = "not a key"
		}
		o.setNode(n, false, budgetNow)
		_, _, rejs := o.state()
		if i == 2 {
			first = rejs
		}
		if i >= 2 && fmt.Sprint(rejs) != fmt.Sprint(first) {
			t.Fatalf("with %d nodes: rejections %v, want %v", i+1, rejs, first)
		}
	}
	if len(first) != 1 {
		t.Fatalf("rejections %v, want one", first)
	}
}

// TestOverLimitEditKeepsLastAccepted: a Peer or an allowed-location-ips
// annotation edited over its limit keeps the last accepted version in the
// plan (nothing is removed from the data plane), with the rejection.
func TestOverLimitEditKeepsLastAccepted(t *testing.T) {
	lim := kilo.Limits{PeerAllowedIPs: 3, AllowedLocationIPs: 3}
	for _, tc := range []struct {
		name     string
		existing bool // an accepted version came first
		want     int  // prefixes in the plan
	}{
		{"an edit over the limit", true, 2},
		{"a new object over the limit", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newObjects("", lim)
			n, p := budgetNode(0, 1, "x"), budgetPeer(0, 1, 2)
			if tc.existing {
				n.Annotations[topology.AnnotationAllowedLocationIPs] = "192.168.0.0/24,192.168.1.0/24"
				o.setNode(n, false, budgetNow)
				o.setPeer(p, false)
			}
			n, p = n.DeepCopy(), budgetPeer(0, 1, 4)
			n.Annotations[topology.AnnotationAllowedLocationIPs] = cidrList(200)
			o.setNode(n, false, budgetNow.Add(time.Second))
			o.setPeer(p, false)
			nodes, peers, rejs := o.state()
			got := len(nodes[0].AllowedLocationIPs)
			if len(peers) > 0 {
				got += 10 * len(peers[0].AllowedIPs)
			}
			limited := 0
			for _, r := range rejs {
				if r.Reason == topology.ReasonLimitExceeded {
					limited++
				}
			}
			if got != tc.want*11 || limited != 2 {
				t.Errorf("location IPs + 10×peer IPs = %d, want %d; %d LimitExceeded, want 2: %v", got, tc.want*11, limited, rejs)
			}
		})
	}
}

// TestNoCountRejectionBeforeSync: a remote cluster whose first list is still
// arriving reports no count limit yet (it would name a different Node at
// each step); once synced it does, once.
func TestNoCountRejectionBeforeSync(t *testing.T) {
	for _, synced := range []bool{false, true} {
		w := &remote{name: "remote", objs: newObjects("remote", kilo.Limits{RemoteNodes: 2}), synced: synced}
		for i := 0; i < 5; i++ {
			w.objs.setNode(budgetNode(1, i, "x"), false, budgetNow)
		}
		_, rejs := w.state()
		if want := map[bool]int{false: 0, true: 1}[synced]; len(rejs) != want {
			t.Errorf("synced=%v: rejections %v, want %d", synced, rejs, want)
		}
	}
}
