package cluster

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// e2eNodes are Nodes as the e2e harness registers them (e2e/harness:
// createNode's kubelet-like registration, AddFakeNode's annotations of a
// Kilo agent) and as meshlet publishes its own node.
func e2eNodes() []*corev1.Node {
	now := metav1.NewTime(time.Unix(1_796_111_407, 0))
	status := corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.20.0.2"}, {Type: corev1.NodeHostName, Address: "a-0"}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now}},
	}
	spec := corev1.NodeSpec{PodCIDR: "10.1.0.0/24", PodCIDRs: []string{"10.1.0.0/24"}}
	fake := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b-fake-1", Labels: map[string]string{"kubernetes.io/hostname": "b-fake-1"},
		Annotations: map[string]string{
			topology.AnnotationKey: "AAEAAQABAAEAAQABAAEAAQABAAEAAQABAAEAAQABAAE=", topology.AnnotationEndpoint: "198.51.100.7:51820",
			topology.AnnotationInternalIP: "", topology.AnnotationLastSeen: "1796111407", topology.AnnotationLocation: "b-west",
			topology.AnnotationWireGuardIP: "100.66.1.1/16", topology.AnnotationGranularity: "location",
		}}, Spec: spec, Status: status}
	meshletNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a-0", ResourceVersion: "1234", UID: "6f9c1c0e-0000-4000-8000-000000000001",
		Labels: map[string]string{"kubernetes.io/hostname": "a-0", "topology.kubernetes.io/region": "a"},
		Annotations: map[string]string{
			topology.AnnotationKey: "AAIAAgACAAIAAgACAAIAAgACAAIAAgACAAIAAgACAAI=", topology.AnnotationEndpoint: "10.20.0.2:51820",
			topology.AnnotationInternalIP: "10.20.0.2/24", topology.AnnotationLastSeen: "1796111407", topology.AnnotationLeader: "",
			topology.AnnotationWireGuardIP: "100.66.0.1/16", topology.AnnotationGranularity: "location",
			topology.AnnotationDiscoveredEndpoints: `{"AAEAAQABAAEAAQABAAEAAQABAAEAAQABAAEAAQABAAE=":{"IP":"198.51.100.7","Port":51820,"Zone":""}}`,
			topology.AnnotationPersistentKeepalive: "25", topology.AnnotationAllowedLocationIPs: "192.168.50.0/24",
		}}, Spec: spec, Status: status}
	return []*corev1.Node{fake, meshletNode}
}

// FuzzNodeCodec feeds the Node codec the protobuf an API server sends: a
// Node, a NodeList, or any bytes as a whole envelope. It never panics; for
// any input the full decoder (client-go's protobuf serializer) accepts, the
// codec accepts it too and agrees with it on everything meshlet reads
// (kilo.TransformNode's result, and every label and annotation).
//
//	go test -run='^$' -fuzz='^FuzzNodeCodec$' -parallel=1 ./agent/runtime/cluster/
func FuzzNodeCodec(f *testing.F) {
	pb := protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme)
	enc := clientscheme.Codecs.EncoderForVersion(pb, corev1.SchemeGroupVersion)
	ours := nodeSerializer{pb}
	encode := func(obj runtime.Object) []byte {
		data, err := runtime.Encode(enc, obj)
		if err != nil {
			f.Fatal(err)
		}
		return data
	}
	nodes := append(codecNodes(), e2eNodes()...)
	list := &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "77", Continue: "c"}}
	for _, n := range nodes {
		list.Items = append(list.Items, *n)
		f.Add(rawMessage(f, encode(n)), uint8(0))
	}
	f.Add(rawMessage(f, encode(list)), uint8(1))
	f.Add(encode(nodes[len(nodes)-1]), uint8(2))
	f.Add(encode(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}}), uint8(2))

	f.Fuzz(func(t *testing.T, b []byte, mode uint8) {
		var data []byte
		switch mode % 3 {
		case 0:
			data = envelope("Node", b)
		case 1:
			data = envelope("NodeList", b)
		default:
			data = b
		}
		got, _, gotErr := ours.Decode(data, nil, nil)
		want, _, err := pb.Decode(data, nil, nil)
		if err != nil {
			return
		}
		if gotErr != nil {
			t.Fatalf("the full decoder accepts what the codec refuses: %v", gotErr)
		}
		switch w := want.(type) {
		case *corev1.Node:
			compareDecodedNode(t, got.(*corev1.Node), w)
		case *corev1.NodeList:
			g := got.(*corev1.NodeList)
			if g.ResourceVersion != w.ResourceVersion || g.Continue != w.Continue || !reflect.DeepEqual(g.RemainingItemCount, w.RemainingItemCount) ||
				len(g.Items) != len(w.Items) {
				t.Fatalf("list meta or length: codec %+v %d, full %+v %d", g.ListMeta, len(g.Items), w.ListMeta, len(w.Items))
			}
			for i := range g.Items {
				compareDecodedNode(t, &g.Items[i], &w.Items[i])
			}
		default:
			if reflect.TypeOf(got) != reflect.TypeOf(want) {
				t.Fatalf("another kind decoded as %T, want %T", got, want)
			}
		}
	})
}

func compareDecodedNode(t *testing.T, got, want *corev1.Node) {
	t.Helper()
	tr := func(n *corev1.Node) *corev1.Node {
		n = n.DeepCopy()
		n.TypeMeta = metav1.TypeMeta{}
		out, _ := kilo.TransformNode(n)
		return out.(*corev1.Node)
	}
	if g, w := tr(got), tr(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("codec and full decode differ:\n codec %#v\n  full %#v", g, w)
	}
	if !reflect.DeepEqual(got.Labels, want.Labels) || !reflect.DeepEqual(got.Annotations, want.Annotations) {
		t.Fatalf("labels/annotations: codec %v %v, full %v %v", got.Labels, got.Annotations, want.Labels, want.Annotations)
	}
}

// envelope wraps a raw v1 message of kind in Kubernetes' protobuf
// envelope (magic, runtime.Unknown).
func envelope(kind string, raw []byte) []byte {
	u := &runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: kind}, Raw: raw}
	b, err := u.Marshal()
	if err != nil {
		panic(err)
	}
	return append(append([]byte(nil), protobufMagic...), b...)
}

// rawMessage is the message an encoded object's envelope carries.
func rawMessage(f *testing.F, data []byte) []byte {
	gvk, raw, ok := unknownEnvelope(data)
	if !ok {
		f.Fatalf("not an envelope: %v", gvk)
	}
	return append([]byte(nil), raw...)
}

// TestNodeCodecReadsTheWireAsTheFullDecoder: what FuzzNodeCodec found the
// full decoder (k8s.io/api's generated code) takes and the codec refused
// or read otherwise (testdata/fuzz/FuzzNodeCodec): both take it, and agree.
func TestNodeCodecReadsTheWireAsTheFullDecoder(t *testing.T) {
	pb := protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme)
	ours := nodeSerializer{pb}
	msg := func(num protowire.Number, b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), b)
	}
	str := func(num protowire.Number, s string) []byte { return msg(num, []byte(s)) }
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	name := str(1, "n-1")
	for _, c := range []struct {
		name string
		kind string
		raw  []byte
	}{
		// A group opened as field 8 and closed as field 4.
		{"mismatched group", "NodeList", []byte("C$")},
		// A generation of ten bytes whose last has bits past the 64th.
		{"varint overflow bits", "Node", msg(1, cat(name, []byte{7 << 3, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7f}))},
		// Field number 2^32+1: truncated to 1 (the name).
		{"field number past 32 bits", "Node", msg(1, cat(protowire.AppendVarint(nil, (1<<32+1)<<3|uint64(protowire.BytesType)), []byte{2}, []byte("xy")))},
		// A label whose key says varint and whose value runs past its entry.
		{"map entry quirks", "Node", msg(1, cat(name, []byte{11<<3 | 2, 3, 1 << 3, 1, 'k', 2<<3 | 2, 4, 'v'}, []byte("alu")))},
		{"empty deletion timestamp", "Node", msg(1, cat(name, msg(9, nil)))},
		{"deletion timestamp with nanoseconds", "Node", msg(1, cat(name, msg(9, []byte{1 << 3, 5, 2 << 3, 9})))},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := envelope(c.kind, c.raw)
			want, _, err := pb.Decode(data, nil, nil)
			if err != nil {
				t.Fatalf("the full decoder refuses it (the case is wrong): %v", err)
			}
			got, _, err := ours.Decode(data, nil, nil)
			if err != nil {
				t.Fatalf("the codec refuses it: %v", err)
			}
			if c.kind == "Node" {
				compareDecodedNode(t, got.(*corev1.Node), want.(*corev1.Node))
			} else if len(got.(*corev1.NodeList).Items) != len(want.(*corev1.NodeList).Items) {
				t.Fatal("items differ")
			}
		})
	}
}
