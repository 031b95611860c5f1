package kilo

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
)

const limitsKey = "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg="

// cidrs returns n distinct /32s, each of them written bad when bad is set.
func cidrs(n int, bad bool) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.%d/32", i>>16&0xff, i>>8&0xff, i&0xff)
		if bad {
			out[i] = fmt.Sprintf("10.%d.%d.%d/33", i>>16&0xff, i>>8&0xff, i&0xff)
		}
	}
	return out
}

// TestPeerAllowedIPsLimit: a Peer over Limits.PeerAllowedIPs is rejected
// with LimitExceeded and not converted; at the limit it converts; zero is
// no limit; bad CIDRs are reported one by one only up to maxListed.
func TestPeerAllowedIPsLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int
		ips       []string
		ok        bool
		reasons   map[topology.Reason]int
		converted int
	}{
		{"at the limit", 5, cidrs(5, false), true, nil, 5},
		{"one over", 5, cidrs(6, false), false, map[topology.Reason]int{topology.ReasonLimitExceeded: 1}, 0},
		{"duplicates count as entries", 5, append(cidrs(5, false), "10.0.0.0/32"), false, map[topology.Reason]int{topology.ReasonLimitExceeded: 1}, 0},
		{"100,000 over the default", DefaultLimits.PeerAllowedIPs, cidrs(100000, false), false, map[topology.Reason]int{topology.ReasonLimitExceeded: 1}, 0},
		{"no limit", 0, cidrs(100000, false), true, nil, 100000},
		{"duplicates merged", 0, append(cidrs(3, false), cidrs(3, false)...), true, nil, 3},
		{"a few bad CIDRs listed each", 0, cidrs(maxListed, true), false, map[topology.Reason]int{topology.ReasonInvalidCIDR: maxListed}, 0},
		{"many bad CIDRs: the first listed, the rest counted", 0, cidrs(5000, true), false, map[topology.Reason]int{topology.ReasonInvalidCIDR: maxListed + 1}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Peer{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: PeerSpec{PublicKey: limitsKey, AllowedIPs: tc.ips}}
			got, rejs, ok := Limits{PeerAllowedIPs: tc.limit}.PeerToTopology(p, "")
			reasons := map[topology.Reason]int{}
			for _, r := range rejs {
				reasons[r.Reason]++
				if r.Reason == topology.ReasonLimitExceeded && (r.Field != "spec.allowedIPs" || !strings.Contains(r.Message, "--max-peer-allowed-ips")) {
					t.Errorf("rejection %+v does not name the field and the flag", r)
				}
			}
			if ok != tc.ok || len(got.AllowedIPs) != tc.converted || fmt.Sprint(reasons) != fmt.Sprint(map[topology.Reason]int(tc.reasons)) {
				t.Errorf("ok=%v, %d allowed IPs, rejections %v; want ok=%v, %d, %v", ok, len(got.AllowedIPs), reasons, tc.ok, tc.converted, tc.reasons)
			}
		})
	}
}

// TestAllowedLocationIPsLimit: an allowed-location-ips annotation of more
// prefixes than the limit is ignored with one LimitExceeded; the rest of the
// node converts; messages about bad entries stay short.
func TestAllowedLocationIPsLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   int
		value   string
		want    int
		reasons map[topology.Reason]int
		maxMsg  int // bytes of the longest rejection message
	}{
		{"at the limit", 4, strings.Join(cidrs(4, false), ","), 4, nil, 0},
		{"over", 4, strings.Join(cidrs(5, false), ","), 0, map[topology.Reason]int{topology.ReasonLimitExceeded: 1}, 200},
		{"empty entries do not count", 4, ",,," + strings.Join(cidrs(4, false), ",,") + ",,", 4, nil, 0},
		{"256 KiB of prefixes", DefaultLimits.AllowedLocationIPs, strings.Join(cidrs(18000, false), ","), 0, map[topology.Reason]int{topology.ReasonLimitExceeded: 1}, 200},
		{"bad entries count", 4, strings.Join(append(cidrs(3, false), cidrs(2, true)...), ","), 0, map[topology.Reason]int{topology.ReasonLimitExceeded: 1}, 200},
		{"256 KiB of bad entries without a limit: one short message", 0, strings.Join(cidrs(18000, true), ","), 0,
			map[topology.Reason]int{topology.ReasonInvalidCIDR: 1}, 2000},
		{"no limit", 0, strings.Join(cidrs(18000, false), ","), 18000, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
				topology.AnnotationAllowedLocationIPs: tc.value, topology.AnnotationKey: limitsKey}}}
			r := Limits{AllowedLocationIPs: tc.limit}.ConvertNode(n, "")
			reasons := map[topology.Reason]int{}
			longest := 0
			for _, rj := range r.Rejections {
				reasons[rj.Reason]++
				longest = max(longest, len(rj.Message))
				if rj.Field != topology.AnnotationAllowedLocationIPs {
					t.Errorf("rejection of field %s", rj.Field)
				}
			}
			if len(r.Node.AllowedLocationIPs) != tc.want || fmt.Sprint(reasons) != fmt.Sprint(map[topology.Reason]int(tc.reasons)) {
				t.Errorf("%d prefixes, rejections %v; want %d, %v", len(r.Node.AllowedLocationIPs), reasons, tc.want, tc.reasons)
			}
			if longest > tc.maxMsg {
				t.Errorf("a rejection message of %d bytes, want at most %d", longest, tc.maxMsg)
			}
			if r.Node.PublicKey.IsZero() {
				t.Error("the rest of the node was not converted")
			}
		})
	}
}

// TestDiscoveredEndpointsErrorBounded: 256 KiB of unusable
// discovered-endpoints entries give one message of bounded size.
func TestDiscoveredEndpointsErrorBounded(t *testing.T) {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; b.Len() < 256<<10-100; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"bad-key-%d":{"IP":"127.0.0.1","Port":1}`, i)
	}
	b.WriteByte('}')
	_, err := ParseDiscoveredEndpoints(b.String())
	if err == nil || len(err.Error()) > 2000 || !strings.Contains(err.Error(), "more") {
		t.Fatalf("error of %d bytes: %.300v", len(fmt.Sprint(err)), err)
	}
}

// TestTransformsCutOverLimit: the informers' transforms keep only the first
// limit+1 entries of a Peer's allowedIPs or a node's allowed-location-ips
// (a watcher must not hold megabytes per object), which converts to the
// same result as the whole object; under the limit nothing is cut; a
// transformed object transforms to itself.
func TestTransformsCutOverLimit(t *testing.T) {
	lim := Limits{PeerAllowedIPs: 3, AllowedLocationIPs: 3}
	for _, tc := range []struct {
		name    string
		entries []string
		kept    int
	}{
		{"under", cidrs(2, false), 2},
		{"at", cidrs(3, false), 3},
		{"one over", cidrs(4, false), 4},
		{"far over", cidrs(100000, false), 4},
		{"empty entries are not counted", []string{"", "", "10.0.0.1/32", "", "10.0.0.2/32", "", "", "10.0.0.3/32", "", "10.0.0.4/32", "10.0.0.5/32"}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Peer{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: PeerSpec{PublicKey: limitsKey, AllowedIPs: tc.entries}}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
				topology.AnnotationAllowedLocationIPs: strings.Join(tc.entries, ","), topology.AnnotationKey: limitsKey}}}
			po, _ := lim.TransformPeer(p)
			no, _ := lim.TransformNode(n)
			tp, tn := po.(*Peer), no.(*corev1.Node)
			gotLoc, _ := ParseAllowedLocationIPs(tn.Annotations[topology.AnnotationAllowedLocationIPs])
			if len(gotLoc) != tc.kept || (len(tc.entries) > lim.PeerAllowedIPs+1) != (len(tp.Spec.AllowedIPs) < len(tc.entries)) {
				t.Errorf("kept %d location IPs (want %d), %d of %d allowed IPs", len(gotLoc), tc.kept, len(tp.Spec.AllowedIPs), len(tc.entries))
			}
			// The same verdict on the cut object as on the whole one.
			_, wholeRejs, wholeOK := lim.PeerToTopology(p, "")
			_, cutRejs, cutOK := lim.PeerToTopology(tp, "")
			if wholeOK != cutOK || fmt.Sprint(wholeRejs) != fmt.Sprint(cutRejs) {
				t.Errorf("Peer: whole %v %v, cut %v %v", wholeOK, wholeRejs, cutOK, cutRejs)
			}
			whole, cut := lim.ConvertNode(n, ""), lim.ConvertNode(tn, "")
			if fmt.Sprint(whole.Node.AllowedLocationIPs, whole.Rejections) != fmt.Sprint(cut.Node.AllowedLocationIPs, cut.Rejections) {
				t.Errorf("Node: whole %v %v, cut %v %v", whole.Node.AllowedLocationIPs, whole.Rejections, cut.Node.AllowedLocationIPs, cut.Rejections)
			}
			po2, _ := lim.TransformPeer(tp)
			no2, _ := lim.TransformNode(tn)
			if fmt.Sprint(po2) != fmt.Sprint(tp) || fmt.Sprint(no2) != fmt.Sprint(tn) {
				t.Error("a transformed object does not transform to itself")
			}
		})
	}
}
