package kilo

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kilo-clustermesh-operator's Peers are ignored with one rejection that
// says what to delete; the operator's labels survive the informer transform
// (which drops every other label) so that the rule can see them.
func TestOperatorPeerIgnored(t *testing.T) {
	op := &Peer{ObjectMeta: metav1.ObjectMeta{Name: "cluster-b-node-1", Labels: map[string]string{
		"kilo-clustermesh.io/cluster": "cluster-b", "kilo-clustermesh.io/mesh": "prod", "team": "x"}},
		Spec: PeerSpec{AllowedIPs: []string{"10.2.1.0/24"}, PublicKey: "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg="}}
	got, err := TransformPeer(op)
	if err != nil {
		t.Fatal(err)
	}
	tp := got.(*Peer)
	if len(tp.Labels) != 2 || tp.Labels["team"] != "" {
		t.Fatalf("transformed labels %v: want only the operator's", tp.Labels)
	}
	_, rejs, ok := PeerToTopology(tp, "")
	if ok || len(rejs) != 1 || rejs[0].Reason != ReasonOperatorPeer {
		t.Fatalf("operator Peer: ok=%v rejections %+v", ok, rejs)
	}
	for _, want := range []string{"kilo-clustermesh-operator", "kubectl delete peers.kilo.squat.ai cluster-b-node-1", "-l kilo-clustermesh.io/cluster"} {
		if !strings.Contains(rejs[0].Message, want) {
			t.Errorf("message %q lacks %q", rejs[0].Message, want)
		}
	}
	// The same Peer without the operator's labels is an ordinary Peer.
	plain := op.DeepCopy()
	plain.Labels = map[string]string{"team": "x"}
	got, _ = TransformPeer(plain)
	if _, rejs, ok := PeerToTopology(got.(*Peer), ""); !ok || len(rejs) != 0 {
		t.Fatalf("plain Peer: ok=%v %+v", ok, rejs)
	}
}
