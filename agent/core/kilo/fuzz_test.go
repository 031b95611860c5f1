package kilo

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Fuzz targets for every parser. Their seed corpus runs in plain `go test`;
// `go test -run='^$' -fuzz='^FuzzX$' -parallel=1 ./agent/core/kilo/`
// explores further (docs/security.md#fuzzing). Besides "no panic", each
// checks that whatever a parser accepts formats and parses back to the
// same value.

var endpointSeeds = []string{"", "1.2.3.4:51820", "[2001:db8::1]:51820", "vpn.example.com:1", "1.2.3.4", "[::ffff:1.2.3.4]:5",
	"[fe80::1%eth0]:1", ":0", "a:65536", "[1.2.3.4]:7", "1.2.3.4:00001"}

func FuzzParseEndpoint(f *testing.F) {
	for _, s := range endpointSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEndpoint(s)
		if err != nil {
			if !e.IsZero() {
				t.Fatalf("error with value %+v", e)
			}
			return
		}
		if e2, err := ParseEndpoint(FormatEndpoint(e)); err != nil || e2 != e {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, e, FormatEndpoint(e), e2, err)
		}
	})
}

func FuzzParsePrefix(f *testing.F) {
	for _, s := range []string{"", "192.168.1.34/24", "fd00::1/64", "1.2.3.4", "::ffff:1.2.3.4/120", "-", "1.2.3.4/33"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePrefix(s)
		if err != nil {
			return
		}
		if p2, err := ParsePrefix(topology.FormatPrefix(p)); err != nil || p2 != p {
			t.Fatalf("round trip of %q: %v -> %v, %v", s, p, p2, err)
		}
	})
}

func FuzzParseForceInternalIP(f *testing.F) {
	for _, s := range []string{"", "-", "10.0.0.1/24", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, none, err := ParseForceInternalIP(s)
		if err != nil {
			return
		}
		if p2, none2, err := ParseForceInternalIP(FormatForceInternalIP(p, none)); err != nil || p2 != p || none2 != none {
			t.Fatalf("round trip of %q: %v %v -> %v %v, %v", s, p, none, p2, none2, err)
		}
	})
}

func FuzzParsePersistentKeepalive(f *testing.F) {
	for _, s := range []string{"", "0", "25", "-1", "65536", "1e3", "abc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParsePersistentKeepalive(s)
		if n < 0 || n > 65535 || (err != nil && n != 0) {
			t.Fatalf("%q -> %d, %v", s, n, err)
		}
		if n2, err := ParsePersistentKeepalive(FormatPersistentKeepalive(n)); err != nil || n2 != n {
			t.Fatalf("round trip %d -> %d, %v", n, n2, err)
		}
	})
}

func FuzzParseLastSeen(f *testing.F) {
	for _, s := range []string{"", "0", "1700000000", "-5", "9223372036854775807", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := ParseLastSeen(s)
		if err != nil || ts.IsZero() {
			return
		}
		if ts2, err := ParseLastSeen(topology.FormatLastSeen(ts)); err != nil || ts2 != ts {
			t.Fatalf("round trip %v -> %v, %v", ts, ts2, err)
		}
	})
}

func FuzzParseKeyAnnotation(f *testing.F) {
	for _, s := range []string{"", testKey(1).String(), "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjh=", "short", "===="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKeyAnnotation(s)
		if err != nil {
			return
		}
		if k2, err := ParseKeyAnnotation(FormatKey(k)); err != nil || k2 != k {
			t.Fatalf("round trip %v -> %v, %v", k, k2, err)
		}
	})
}

func FuzzParseAllowedLocationIPs(f *testing.F) {
	for _, s := range []string{"", "10.0.0.0/8", "10.1.2.3/16, fd00::/8,,x", ",", "1.2.3.4/32,1.2.3.4/32"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, _ := ParseAllowedLocationIPs(s)
		for _, p := range ps {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("%q -> invalid or unmasked %v", s, p)
			}
		}
		// The formatter sorts by string; parse(format(x)) must give x sorted.
		want := slices.Clone(ps)
		slices.SortFunc(want, func(a, b netip.Prefix) int {
			switch as, bs := a.String(), b.String(); {
			case as < bs:
				return -1
			case as > bs:
				return 1
			}
			return 0
		})
		got, err := ParseAllowedLocationIPs(topology.FormatAllowedLocationIPs(ps))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip %v -> %v, %v", want, got, err)
		}
	})
}

func FuzzParseGranularity(f *testing.F) {
	for _, s := range []string{"", "location", "full", "cross", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGranularity(s)
		if (err == nil) != (string(g) == s) {
			t.Fatalf("%q -> %q, %v", s, g, err)
		}
	})
}

func FuzzParseDiscoveredEndpoints(f *testing.F) {
	k := testKey(1).String()
	for _, s := range []string{"", "{}", "null", `{"` + k + `":{"IP":"203.0.113.7","Port":51820,"Zone":""}}`,
		`{"` + k + `":{"IP":"2001:db8::1","Port":1,"Zone":"eth0"}}`, `{"` + k + `":{"IP":"127.0.0.1","Port":1}}`,
		`{"` + k + `":null}`, `{"x":{}}`, `[1]`, `{"` + k + `":{"IP":"::ffff:1.2.3.4","Port":65535}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, _ := ParseDiscoveredEndpoints(s)
		for _, ap := range m {
			if a := ap.Addr(); !ap.IsValid() || ap.Port() == 0 || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() {
				t.Fatalf("%q -> unusable endpoint %v", s, ap)
			}
		}
		m2, err := ParseDiscoveredEndpoints(topology.FormatDiscoveredEndpoints(m))
		if err != nil || !reflect.DeepEqual(m2, m) {
			t.Fatalf("round trip %v -> %v, %v", m, m2, err)
		}
	})
}

func FuzzParseKeepaliveRules(f *testing.F) {
	for _, s := range []string{`[]`, `null`, `[{"value":25,"location":"eu"}]`, `[{"value":0,"nodeSelector":{}}]`,
		`[{"value":1,"nodeSelector":{"a":"b"}},{"value":2,"location":"x"}]`, `[{"value":1}]`, `[null]`, `[{"VALUE":1,"location":"x"}]`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rules, err := ParseKeepaliveRules(s)
		if err != nil {
			if rules != nil {
				t.Fatal("rules with error")
			}
			return
		}
		for _, r := range rules {
			if r.Value < 0 || r.Value > 65535 || (r.Location != "") == (r.NodeSelector != nil) {
				t.Fatalf("%q -> invalid rule %+v", s, r)
			}
		}
		got, err := ParseKeepaliveRules(FormatKeepaliveRules(rules))
		if err != nil || !reflect.DeepEqual(got, rules) {
			t.Fatalf("round trip %+v -> %+v, %v", rules, got, err)
		}
	})
}

// FuzzPeerJSON decodes a Peer from JSON and converts it: an invalid peer
// never comes out half-converted, and the transform never changes the result.
func FuzzPeerJSON(f *testing.F) {
	k := testKey(1).String()
	for _, s := range []string{
		`{"metadata":{"name":"p"},"spec":{"allowedIPs":["10.5.0.1/32"],"publicKey":"` + k + `"}}`,
		`{"metadata":{"name":"p","annotations":{"meshlet.io/node-persistent-keepalive":"[{\"value\":5,\"location\":\"a\"}]"}},"spec":{"allowedIPs":["10.5.0.1/32"],"endpoint":{"dnsOrIP":{"dns":"a.b","ip":"1.2.3.4"},"port":51820},"persistentKeepalive":25,"presharedKey":"` + k + `","publicKey":"` + k + `"}}`,
		`{"spec":{"allowedIPs":["x"],"endpoint":{"port":-1},"persistentKeepalive":-1,"publicKey":"y"}}`,
		`{"spec":{"endpoint":{"dnsOrIP":{"ip":"fe80::1%lo"},"port":1}}}`,
		`{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Peer
		if json.Unmarshal(b, &p) != nil {
			return
		}
		tp, rejs, ok := PeerToTopology(&p, "c")
		if !ok {
			if len(rejs) == 0 || !reflect.DeepEqual(tp, topology.Peer{}) {
				t.Fatalf("invalid peer: %+v, %v", tp, rejs)
			}
		} else {
			if _, err := topology.ParseKey(p.Spec.PublicKey); err != nil {
				t.Fatalf("accepted bad key %q", p.Spec.PublicKey)
			}
			if tp.Endpoint != "" {
				if _, err := ParseEndpoint(tp.Endpoint); err != nil {
					t.Fatalf("peer endpoint %q does not parse: %v", tp.Endpoint, err)
				}
			}
		}
		if len(ValidatePeer(&p, "c")) > 0 == ok {
			t.Fatal("ValidatePeer disagrees with PeerToTopology")
		}
		s, _ := TransformPeer(&p)
		tp2, rejs2, ok2 := PeerToTopology(s.(*Peer), "c")
		if ok2 != ok || !reflect.DeepEqual(tp2, tp) || !reflect.DeepEqual(rejs2, rejs) {
			t.Fatal("transform changed the conversion")
		}
	})
}

// FuzzNodeAnnotations converts a Node whose annotations are fuzzed.
func FuzzNodeAnnotations(f *testing.F) {
	f.Add("1.2.3.4:51820", "", "", "192.168.1.34/24", "-", testKey(1).String(), "100.66.0.1/16", "25", "10.0.0.0/8,x", "{}", "location", "1700000000", "10.244.0.0/24")
	f.Add("x", "y", "z", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10")
	f.Add("", "[::1]:1", "a.b:2", "", "", "", "", "", "", `{"a":null}`, "cross", "-1", "")
	f.Fuzz(func(t *testing.T, endpoint, force, cm, internal, forceInternal, key, wgIP, keepalive, allowed, discovered, gran, lastSeen, podCIDR string) {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
				topology.AnnotationEndpoint: endpoint, topology.AnnotationForceEndpoint: force, topology.AnnotationClusterMeshEndpoint: cm,
				topology.AnnotationInternalIP: internal, topology.AnnotationForceInternalIP: forceInternal, topology.AnnotationKey: key,
				topology.AnnotationWireGuardIP: wgIP, topology.AnnotationPersistentKeepalive: keepalive,
				topology.AnnotationAllowedLocationIPs: allowed, topology.AnnotationDiscoveredEndpoints: discovered,
				topology.AnnotationGranularity: gran, topology.AnnotationLastSeen: lastSeen, topology.AnnotationLeader: "",
			}},
			Spec: corev1.NodeSpec{PodCIDR: podCIDR},
		}
		r := ConvertNode(n, "c")
		for _, ep := range []string{r.Node.Endpoint, r.Node.ForceEndpoint, r.Node.ClusterMeshEndpoint} {
			if _, err := ParseEndpoint(ep); err != nil {
				t.Fatalf("converted endpoint %q does not parse", ep)
			}
		}
		s, _ := TransformNode(n)
		r2 := ConvertNode(s.(*corev1.Node), "c")
		if !reflect.DeepEqual(r, r2) {
			t.Fatal("transform changed the conversion")
		}
	})
}

// FuzzDualStackNode converts a Node whose second-family fields are fuzzed:
// spec.podCIDRs (comma-separated here) and meshlet's dual-stack
// annotations. The second pod CIDR is masked and of the other family than
// the first, and what converts formats back to the same annotations.
func FuzzDualStackNode(f *testing.F) {
	f.Add("10.2.0.0/24,fd00:2::/64", "fd00::1/64", "fd4b::1/64")
	f.Add("fd00:2::/64,10.2.0.0/24", "10.0.0.1/24", "10.5.0.1/16")
	f.Add("10.2.0.0/24,10.3.0.0/24", "x", "")
	f.Add(",fd00::/64", "fd00::1", "::/0")
	f.Fuzz(func(t *testing.T, podCIDRs, internal, wgIP string) {
		cidrs := strings.Split(podCIDRs, ",")
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
				topology.AnnotationDualStackInternalIP: internal, topology.AnnotationDualStackWireGuardIP: wgIP,
			}},
			Spec: corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
		}
		r := ConvertNode(n, "c")
		if d := r.Node.DualStackPodCIDR; d.IsValid() {
			if d != d.Masked() || len(r.Node.PodCIDRs) != 1 || d.Addr().Is4() == r.Node.PodCIDRs[0].Addr().Is4() {
				t.Fatalf("second pod CIDR %s beside %v", d, r.Node.PodCIDRs)
			}
		}
		a := NodeAnnotations(r.Node)
		for _, k := range []string{topology.AnnotationDualStackInternalIP, topology.AnnotationDualStackWireGuardIP} {
			back := ConvertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{k: a[k]}}}, "c")
			if back.Node.DualStackInternalIP != r.Node.DualStackInternalIP && k == topology.AnnotationDualStackInternalIP ||
				back.Node.DualStackWireGuardIP != r.Node.DualStackWireGuardIP && k == topology.AnnotationDualStackWireGuardIP {
				t.Fatalf("%s: %q does not convert back", k, a[k])
			}
		}
		s, _ := TransformNode(n)
		if r2 := ConvertNode(s.(*corev1.Node), "c"); !reflect.DeepEqual(r, r2) {
			t.Fatal("transform changed the conversion")
		}
	})
}
