package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

func TestReadObjects(t *testing.T) {
	for _, tc := range []struct {
		name, in                      string
		nodes, peers, meshes, skipped int
		wantErr                       bool
	}{
		{name: "v1 List as kubectl prints it", in: `
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: a}}
- {apiVersion: kilo.squat.ai/v1alpha1, kind: Peer, metadata: {name: p}, spec: {allowedIPs: [10.5.0.1/32], publicKey: x}}
- {apiVersion: kilo.squat.ai/v1alpha1, kind: ClusterMesh, metadata: {name: m, namespace: kilo-system}, spec: {clusters: []}}
- {apiVersion: v1, kind: Secret, metadata: {name: s}}
`, nodes: 1, peers: 1, meshes: 1, skipped: 1},
		{name: "multi-document YAML", in: "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: b}\n---\n", nodes: 2},
		{name: "JSON NodeList", in: `{"apiVersion":"v1","kind":"NodeList","items":[{"apiVersion":"v1","kind":"Node","metadata":{"name":"a"}}]}`, nodes: 1},
		{name: "object without kind", in: "metadata: {name: a}\n", wantErr: true},
		{name: "not YAML", in: "a: [\n", wantErr: true},
		{name: "Node with a wrong type", in: "apiVersion: v1\nkind: Node\nspec: {podCIDRs: 3}\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ReadObjects(strings.NewReader(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err == nil && (len(o.Nodes) != tc.nodes || len(o.Peers) != tc.peers || len(o.Meshes) != tc.meshes || o.Skipped != tc.skipped) {
				t.Fatalf("got %d nodes %d peers %d meshes %d skipped", len(o.Nodes), len(o.Peers), len(o.Meshes), o.Skipped)
			}
		})
	}
}

func TestAnnotationDiff(t *testing.T) {
	cur := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"a": "1", "b": "2", "c": ""}}}
	d := AnnotationDiff(cur, map[string]string{"a": "1", "b": "3", "c": "", "d": ""})
	if len(d) != 2 || d["b"] != "3" || d["d"] != "" {
		t.Errorf("diff = %v, want b=3 and d=\"\" (a value that differs, an empty one not there yet)", d)
	}
}

func TestSetNodeWakesOnlyOnMaterialChange(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	mk := func(lastSeen time.Time, endpoint string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
			topology.AnnotationLastSeen: fmt.Sprint(lastSeen.Unix()), topology.AnnotationEndpoint: endpoint}}}
	}
	o := newObjects("b", kilo.Limits{})
	steps := []struct {
		name string
		node *corev1.Node
		del  bool
		want bool
	}{
		{"new node", mk(now, "1.2.3.4:51820"), false, true},
		{"heartbeat only", mk(now.Add(30*time.Second), "1.2.3.4:51820"), false, false},
		{"endpoint changed", mk(now.Add(31*time.Second), "1.2.3.5:51820"), false, true},
		{"back after being stale", mk(now.Add(200*time.Second), "1.2.3.5:51820"), false, true},
		{"deleted", mk(now, ""), true, true},
	}
	clock := now
	for _, s := range steps {
		if s.name == "back after being stale" {
			clock = now.Add(200 * time.Second)
		}
		if got := o.setNode(s.node, s.del, clock); got != s.want {
			t.Errorf("%s: changed = %v, want %v", s.name, got, s.want)
		}
		if s.name == "heartbeat only" {
			if ls := o.nodes["n"].Node.LastSeen; !ls.Equal(now.Add(30 * time.Second)) {
				t.Errorf("heartbeat not stored: %v", ls)
			}
		}
	}
}

func TestBadPeerEditKeepsLastValidVersion(t *testing.T) {
	o := newObjects("", kilo.Limits{})
	peer := func(key string) *kilo.Peer {
		return &kilo.Peer{ObjectMeta: metav1.ObjectMeta{Name: "laptop"},
			Spec: kilo.PeerSpec{AllowedIPs: []string{"10.5.0.1/32"}, PublicKey: key}}
	}
	good := "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg="
	o.setPeer(peer(good), false)
	o.setPeer(peer("not-a-key"), false)
	_, peers, rejs := o.state()
	if len(peers) != 1 || peers[0].PublicKey.String() != good || len(rejs) != 1 || rejs[0].Reason != topology.ReasonInvalidKey {
		t.Fatalf("peers %+v rejections %+v: want the last valid version kept and the edit rejected", peers, rejs)
	}
	// Deleting it still removes it; a Peer invalid from the start never enters.
	o.setPeer(peer(good), true)
	o.setPeer(peer("not-a-key"), false)
	if _, peers, _ := o.state(); len(peers) != 0 {
		t.Fatalf("peers = %+v", peers)
	}
}

func TestRemoteNodeHeardAndClockSkew(t *testing.T) {
	local := time.Unix(1_800_000_000, 0)
	behind := -90 * time.Second // the remote cluster's clock
	mk := func(name string, lastSeen time.Time) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			topology.AnnotationLastSeen: fmt.Sprint(lastSeen.Unix())}}}
	}
	o := newObjects("b", kilo.Limits{})
	steps := []struct {
		name        string
		node        string
		at          time.Duration // local clock, from local
		lastSeen    time.Duration // remote clock, from local+behind
		heard       time.Duration
		heardChange bool
	}{
		{"first sighting", "n1", 0, -10 * time.Second, 0, false},
		{"the same value again (a relist)", "n1", 5 * time.Second, -10 * time.Second, 0, false},
		{"its last-seen changed", "n1", 20 * time.Second, 20 * time.Second, 20 * time.Second, true},
		{"another node", "n2", 21 * time.Second, 21 * time.Second, 21 * time.Second, false},
		{"another node changes", "n2", 30 * time.Second, 29 * time.Second, 30 * time.Second, true},
	}
	for _, s := range steps {
		o.setNode(mk(s.node, local.Add(behind+s.lastSeen)), false, local.Add(s.at))
		n := o.nodes[s.node].Node
		if !n.Heard.Equal(local.Add(s.heard)) || n.HeardChange != s.heardChange {
			t.Errorf("%s: heard %v change %v, want %v %v", s.name, n.Heard.Sub(local), n.HeardChange, s.heard, s.heardChange)
		}
	}
	// Samples: n1 −90 s, n2 −91 s (last-seen one second older than when it
	// arrived): the median of two is the upper one.
	if d, ok := o.clockSkew(); !ok || d != -90*time.Second {
		t.Errorf("clock skew %v %v, want -90s", d, ok)
	}
	o.setNode(mk("n1", local), true, local)
	if d, _ := o.clockSkew(); d != -91*time.Second {
		t.Errorf("clock skew after n1 left: %v", d)
	}
	// The local cluster records nothing of the kind.
	l := newObjects("", kilo.Limits{})
	l.setNode(mk("x", local), false, local)
	if !l.nodes["x"].Node.Heard.IsZero() {
		t.Error("local node has Heard set")
	}
}
