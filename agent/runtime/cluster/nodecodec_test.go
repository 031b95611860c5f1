package cluster

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/meshlet/meshlet/agent/core/kilo"
)

// codecNodes are Nodes with everything meshlet reads and much it does not.
func codecNodes() []*corev1.Node {
	del := metav1.NewTime(time.Unix(1_800_000_000, 123_000_000))
	full := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n-1", UID: "uid-1", ResourceVersion: "42", Generation: 3,
			CreationTimestamp: metav1.NewTime(time.Unix(1_700_000_000, 0)), DeletionTimestamp: &del,
			Labels: map[string]string{"topology.kubernetes.io/region": "fsn1", "kubernetes.io/hostname": "n-1"},
			Annotations: map[string]string{"kilo.squat.ai/key": "k", "kilo.squat.ai/last-seen": "1800000000",
				"meshlet.io/version": "v1", "node.alpha.kubernetes.io/ttl": "0", "k8s.io/initial-events-end": "true"},
			Finalizers:    []string{"example.com/x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: "Update", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{}}`)}},
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.1.2.0/24", PodCIDRs: []string{"10.1.2.0/24", "fd00::/64"}, ProviderID: "hcloud://1", Unschedulable: true,
			Taints: []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: "False", Reason: "KubeletHasSufficientMemory", Message: "ok"},
				{Type: corev1.NodeReady, Status: "True", Reason: "KubeletReady", Message: "ready", LastHeartbeatTime: metav1.Now()},
				{Type: corev1.NodeReady, Status: "False", Reason: "second"},
			},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}, {Type: corev1.NodeExternalIP, Address: "203.0.113.1"},
				{Type: corev1.NodeHostName, Address: "n-1"}, {Type: corev1.NodeExternalIP, Address: "2001:db8::1"}},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
			Images:   []corev1.ContainerImage{{Names: []string{"a@sha256:00", "a:1"}, SizeBytes: 1}},
		},
	}
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	notReady := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "nr", Annotations: map[string]string{"kilo.squat.ai/location": "x"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: "Unknown", Reason: "NodeStatusUnknown"}}}}
	// A watch bookmark: a Node holding only a resource version and the
	// annotations the reflector reads.
	bookmark := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "99",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	return []*corev1.Node{full, bare, notReady, bookmark}
}

// TestNodeCodecKeepsWhatTheTransformKeeps: a Node decoded by the codec
// and transformed is exactly the Node decoded in full and transformed, for
// single objects and lists; the codec keeps every label and annotation
// (the reflector reads bookmarks' annotations).
func TestNodeCodecKeepsWhatTheTransformKeeps(t *testing.T) {
	pb := protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme)
	enc := clientscheme.Codecs.EncoderForVersion(pb, corev1.SchemeGroupVersion)
	ours := nodeSerializer{pb}
	transformed := func(obj runtime.Object) *corev1.Node {
		n := obj.(*corev1.Node).DeepCopy()
		n.TypeMeta = metav1.TypeMeta{}
		out, _ := kilo.TransformNode(n)
		return out.(*corev1.Node)
	}
	list := &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "77", Continue: "c"}}
	for _, n := range codecNodes() {
		list.Items = append(list.Items, *n)
		data, err := runtime.Encode(enc, n)
		if err != nil {
			t.Fatal(err)
		}
		want, _, err := pb.Decode(data, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := ours.Decode(data, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := transformed(got), transformed(want); !reflect.DeepEqual(g, w) {
			t.Errorf("%s:\n codec %+v\n  full %+v", n.Name, g, w)
		}
		if gn := got.(*corev1.Node); !reflect.DeepEqual(gn.Labels, n.Labels) || !reflect.DeepEqual(gn.Annotations, n.Annotations) {
			t.Errorf("%s: labels/annotations %v %v, want all of them", n.Name, gn.Labels, gn.Annotations)
		}
	}
	data, err := runtime.Encode(enc, list)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := ours.Decode(data, nil, &corev1.NodeList{})
	if err != nil {
		t.Fatal(err)
	}
	full, _, err := pb.Decode(data, nil, &corev1.NodeList{})
	if err != nil {
		t.Fatal(err)
	}
	gl, fl := got.(*corev1.NodeList), full.(*corev1.NodeList)
	if gl.ResourceVersion != "77" || gl.Continue != "c" || len(gl.Items) != len(fl.Items) {
		t.Fatalf("list: %+v", gl.ListMeta)
	}
	for i := range gl.Items {
		if g, w := transformed(&gl.Items[i]), transformed(&fl.Items[i]); !reflect.DeepEqual(g, w) {
			t.Errorf("list item %d:\n codec %+v\n  full %+v", i, g, w)
		}
	}
	// Other kinds pass through.
	data, _ = runtime.Encode(enc, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Data: map[string][]byte{"k": []byte("v")}})
	if obj, _, err := ours.Decode(data, nil, nil); err != nil || string(obj.(*corev1.Secret).Data["k"]) != "v" {
		t.Fatalf("a Secret through the codec: %v %v", obj, err)
	}
	// JSON (a server that does not speak protobuf) is decoded in full by
	// the client's codecs, unchanged.
	jsNode := codecNodes()[0]
	jsNode.DeletionTimestamp = &metav1.Time{Time: jsNode.DeletionTimestamp.Truncate(time.Second)} // JSON keeps seconds
	js, err := runtime.Encode(clientscheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), jsNode)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := runtime.SerializerInfoForMediaType(nodeCodecs{clientscheme.Codecs.WithoutConversion()}.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		t.Fatal("no JSON serializer")
	}
	if obj, _, err := info.Serializer.Decode(js, nil, nil); err != nil || len(obj.(*corev1.Node).Status.Images) != 1 ||
		!reflect.DeepEqual(transformed(obj), transformed(jsNode)) {
		t.Fatalf("a Node in JSON: %v", err)
	}
	// Garbage is an error, not a panic.
	for i := 5; i < 40; i += 7 {
		bad := append([]byte(nil), protobufMagic...)
		bad = append(bad, []byte(fmt.Sprintf("%040d", i))[:i]...)
		_, _, _ = ours.Decode(bad, nil, nil)
	}
}
