package kilo

import (
	"encoding/json"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/topology"
)

const docPeer = `
apiVersion: kilo.squat.ai/v1alpha1
kind: Peer
metadata: {name: laptop}
spec:
  allowedIPs: [10.5.0.1/32]
  endpoint: {dnsOrIP: {ip: 203.0.113.7}, port: 51820}
  persistentKeepalive: 25
  publicKey: GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=
`

// TestPeerWireFormat decodes docs/kilo-api.md's Peer fields through a scheme codec and
// checks the JSON shape on the way back.
func TestPeerWireFormat(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON([]byte(docPeer))
	if err != nil {
		t.Fatal(err)
	}
	obj, gvk, err := serializer.NewCodecFactory(s).UniversalDeserializer().Decode(j, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if gvk.Kind != "Peer" || gvk.GroupVersion() != SchemeGroupVersion {
		t.Fatalf("gvk %v", gvk)
	}
	p := obj.(*Peer)
	want := PeerSpec{AllowedIPs: []string{"10.5.0.1/32"}, Endpoint: &PeerEndpoint{DNSOrIP: DNSOrIP{IP: "203.0.113.7"}, Port: 51820},
		PersistentKeepalive: 25, PublicKey: "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg="}
	if !reflect.DeepEqual(p.Spec, want) {
		t.Fatalf("spec %+v", p.Spec)
	}
	out, err := json.Marshal(p.Spec)
	if err != nil {
		t.Fatal(err)
	}
	const wantJSON = `{"allowedIPs":["10.5.0.1/32"],"endpoint":{"dnsOrIP":{"ip":"203.0.113.7"},"port":51820},"persistentKeepalive":25,"publicKey":"GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg="}`
	if string(out) != wantJSON {
		t.Fatalf("json %s", out)
	}
	// PeerList is registered too.
	if _, err := s.New(SchemeGroupVersion.WithKind("PeerList")); err != nil {
		t.Fatal(err)
	}
}

func TestPeerDeepCopy(t *testing.T) {
	p := &Peer{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"a": "b"}},
		Spec: PeerSpec{AllowedIPs: []string{"10.0.0.1/32"}, Endpoint: &PeerEndpoint{Port: 1}}}
	c := p.DeepCopyObject().(*Peer)
	c.Spec.AllowedIPs[0] = "x"
	c.Spec.Endpoint.Port = 2
	c.Annotations["a"] = "c"
	if p.Spec.AllowedIPs[0] != "10.0.0.1/32" || p.Spec.Endpoint.Port != 1 || p.Annotations["a"] != "b" {
		t.Fatal("DeepCopy shares memory")
	}
	l := &PeerList{Items: []Peer{*p}}
	lc := l.DeepCopyObject().(*PeerList)
	lc.Items[0].Spec.AllowedIPs[0] = "y"
	if p.Spec.AllowedIPs[0] != "10.0.0.1/32" {
		t.Fatal("PeerList DeepCopy shares memory")
	}
	var nilPeer *Peer
	if nilPeer.DeepCopy() != nil {
		t.Fatal("nil DeepCopy")
	}
}

func validSpec() PeerSpec {
	return PeerSpec{AllowedIPs: []string{"10.5.0.1/32"}, PublicKey: testKey(1).String()}
}

func TestPeerToTopology(t *testing.T) {
	psk := testKey(9)
	tests := []struct {
		name     string
		spec     func(*PeerSpec)
		ann      map[string]string
		want     *topology.Peer // nil = not ok
		rejected []string
	}{
		{name: "minimal", want: &topology.Peer{Name: "p", AllowedIPs: prefixes("10.5.0.1/32"), PublicKey: testKey(1)}},
		{
			name: "full, masked and deduplicated allowedIPs, dns wins",
			spec: func(s *PeerSpec) {
				s.AllowedIPs = []string{"10.5.0.1/24", "10.5.0.0/24", "fd00::1/128"}
				s.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{DNS: "vpn.example.com", IP: "203.0.113.7"}, Port: 51820}
				s.PersistentKeepalive = 25
				s.PresharedKey = psk.String()
			},
			want: &topology.Peer{Name: "p", AllowedIPs: prefixes("10.5.0.0/24", "fd00::1/128"), Endpoint: "vpn.example.com:51820",
				PersistentKeepalive: 25, PresharedKey: &psk, PublicKey: testKey(1)},
		},
		{
			name: "ipv6 endpoint",
			spec: func(s *PeerSpec) { s.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{IP: "2001:db8::7"}, Port: 1} },
			want: &topology.Peer{Name: "p", AllowedIPs: prefixes("10.5.0.1/32"), Endpoint: "[2001:db8::7]:1", PublicKey: testKey(1)},
		},
		{
			name: "keepalive rules",
			ann:  map[string]string{topology.AnnotationNodePersistentKeepalive: `[{"value":25,"location":"nat"},{"value":0,"nodeSelector":{"a":"b"}}]`},
			want: &topology.Peer{Name: "p", AllowedIPs: prefixes("10.5.0.1/32"), PublicKey: testKey(1),
				NodeKeepalive: []topology.KeepaliveRule{{Value: 25, Location: "nat"}, {Value: 0, NodeSelector: map[string]string{"a": "b"}}}},
		},
		{
			name:     "malformed keepalive annotation rejects only the annotation",
			spec:     func(s *PeerSpec) { s.PersistentKeepalive = 10 },
			ann:      map[string]string{topology.AnnotationNodePersistentKeepalive: `[{"value":25}]`},
			want:     &topology.Peer{Name: "p", AllowedIPs: prefixes("10.5.0.1/32"), PublicKey: testKey(1), PersistentKeepalive: 10},
			rejected: []string{topology.AnnotationNodePersistentKeepalive + "=InvalidAnnotation"},
		},
		{name: "missing allowedIPs", spec: func(s *PeerSpec) { s.AllowedIPs = nil }, rejected: []string{"spec.allowedIPs=InvalidPeer"}},
		// Kilo leaves a Peer without allowed IPs out (not ready); meshlet
		// also says why.
		{name: "empty allowedIPs: not configured, as Kilo", spec: func(s *PeerSpec) { s.AllowedIPs = []string{} },
			rejected: []string{"spec.allowedIPs=InvalidPeer"}},
		{name: "bad CIDR", spec: func(s *PeerSpec) { s.AllowedIPs = []string{"10.5.0.1/32", "10.5.0.2"} }, rejected: []string{"spec.allowedIPs[1]=InvalidCIDR"}},
		{name: "missing key", spec: func(s *PeerSpec) { s.PublicKey = "" }, rejected: []string{"spec.publicKey=NoPublicKey"}},
		{name: "short key", spec: func(s *PeerSpec) { s.PublicKey = "dG9vIHNob3J0" }, rejected: []string{"spec.publicKey=InvalidKey"}},
		{name: "bad psk", spec: func(s *PeerSpec) { s.PresharedKey = "secret" }, rejected: []string{"spec.presharedKey=InvalidKey"}},
		{name: "negative keepalive", spec: func(s *PeerSpec) { s.PersistentKeepalive = -1 }, rejected: []string{"spec.persistentKeepalive=InvalidPeer"}},
		{name: "huge keepalive", spec: func(s *PeerSpec) { s.PersistentKeepalive = 65536 }, rejected: []string{"spec.persistentKeepalive=InvalidPeer"}},
		{name: "port 0", spec: func(s *PeerSpec) { s.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{IP: "1.2.3.4"}} }, rejected: []string{"spec.endpoint=InvalidEndpoint"}},
		{name: "port too big", spec: func(s *PeerSpec) { s.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{IP: "1.2.3.4"}, Port: 70000} }, rejected: []string{"spec.endpoint=InvalidEndpoint"}},
		{name: "empty dnsOrIP", spec: func(s *PeerSpec) { s.Endpoint = &PeerEndpoint{Port: 1} }, rejected: []string{"spec.endpoint=InvalidEndpoint"}},
		{name: "bad ip", spec: func(s *PeerSpec) { s.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{IP: "1.2.3"}, Port: 1} }, rejected: []string{"spec.endpoint=InvalidEndpoint"}},
		{name: "bad ip next to dns", spec: func(s *PeerSpec) { s.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{DNS: "a.b", IP: "x"}, Port: 1} }, rejected: []string{"spec.endpoint=InvalidEndpoint"}},
		{name: "bad dns", spec: func(s *PeerSpec) { s.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{DNS: "UPPER_case"}, Port: 1} }, rejected: []string{"spec.endpoint=InvalidEndpoint"}},
		{name: "every problem reported", spec: func(s *PeerSpec) { *s = PeerSpec{AllowedIPs: []string{"x"}, PublicKey: "y", PersistentKeepalive: -5} },
			rejected: []string{"spec.allowedIPs[0]=InvalidCIDR", "spec.persistentKeepalive=InvalidPeer", "spec.publicKey=InvalidKey"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Peer{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: tt.ann}, Spec: validSpec()}
			if tt.spec != nil {
				tt.spec(&p.Spec)
			}
			got, rejs, ok := PeerToTopology(p, "c1")
			if ok != (tt.want != nil) {
				t.Fatalf("ok = %v, rejections %v", ok, rejs)
			}
			if tt.want != nil && !reflect.DeepEqual(got, *tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, *tt.want)
			}
			if !ok && !reflect.DeepEqual(got, topology.Peer{}) {
				t.Fatalf("invalid peer leaked fields: %+v", got)
			}
			if f := fields(rejs); !reflect.DeepEqual(f, tt.rejected) {
				t.Fatalf("rejections %v, want %v", f, tt.rejected)
			}
			for _, r := range rejs {
				if r.Object != (topology.ObjectRef{Kind: "Peer", Cluster: "c1", Name: "p"}) {
					t.Fatalf("object %+v", r.Object)
				}
			}
			if v := ValidatePeer(p, "c1"); ok != (len(v) == 0) && tt.ann == nil {
				t.Fatalf("ValidatePeer disagrees: %v", v)
			}
		})
	}
	if _, rejs, ok := PeerToTopology(nil, ""); ok || rejs != nil {
		t.Fatal("nil peer")
	}
}

func TestParseKeepaliveRules(t *testing.T) {
	tests := []struct {
		in      string
		want    []topology.KeepaliveRule
		wantErr bool
	}{
		{in: `[]`},
		{in: `null`},
		{in: `[{"value":25,"location":"eu"}]`, want: []topology.KeepaliveRule{{Value: 25, Location: "eu"}}},
		{in: `[{"value":5,"nodeSelector":{}}]`, want: []topology.KeepaliveRule{{Value: 5, NodeSelector: map[string]string{}}}},
		{in: ` [{"nodeSelector":{"k":"v"},"value":65535}] `, want: []topology.KeepaliveRule{{Value: 65535, NodeSelector: map[string]string{"k": "v"}}}},
		{in: ``, wantErr: true},
		{in: `{"value":1,"location":"x"}`, wantErr: true},
		{in: `[{"location":"x"}]`, wantErr: true},
		{in: `[{"value":-1,"location":"x"}]`, wantErr: true},
		{in: `[{"value":65536,"location":"x"}]`, wantErr: true},
		{in: `[{"value":1.5,"location":"x"}]`, wantErr: true},
		{in: `[{"value":1}]`, wantErr: true},
		{in: `[{"value":1,"location":"x","nodeSelector":{"a":"b"}}]`, wantErr: true},
		{in: `[{"value":1,"nodeselector":{"a":"b"}}]`, wantErr: true},
		{in: `[{"value":1,"location":"x"},{"value":2}]`, wantErr: true},
		{in: `[{"value":1,"location":"x"}] []`, wantErr: true},
		{in: `[{"value":1,"location":"x"}]]`, wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseKeepaliveRules(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseKeepaliveRules(%q) = %+v, %v; want %+v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestTransformPeer(t *testing.T) {
	p := &Peer{
		ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u", ResourceVersion: "3", Labels: map[string]string{"l": "v"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}",
				topology.AnnotationNodePersistentKeepalive: `[{"value":25,"location":"eu"}]`}},
		Spec: validSpec(),
	}
	p.Spec.Endpoint = &PeerEndpoint{DNSOrIP: DNSOrIP{IP: "1.2.3.4"}, Port: 5}
	obj, err := TransformPeer(p)
	if err != nil {
		t.Fatal(err)
	}
	s := obj.(*Peer)
	if len(s.ManagedFields) != 0 || len(s.Annotations) != 1 || s.Labels != nil || s.UID != "u" || s.ResourceVersion != "3" {
		t.Fatalf("not stripped: %+v", s.ObjectMeta)
	}
	s.Spec.Endpoint.Port = 9
	if p.Spec.Endpoint.Port != 5 {
		t.Fatal("transform shares the spec")
	}
	s.Spec.Endpoint.Port = 5
	a, ar, aok := PeerToTopology(p, "")
	b, br, bok := PeerToTopology(s, "")
	if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(ar, br) || aok != bok {
		t.Fatal("conversion changed by transform")
	}
	if again, _ := TransformPeer(s); !reflect.DeepEqual(again, s) {
		t.Fatal("not idempotent")
	}
	if o, _ := TransformPeer("x"); o != "x" {
		t.Fatal("non-Peer not passed through")
	}
}
