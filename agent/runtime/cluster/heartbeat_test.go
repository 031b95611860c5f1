package cluster_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
)

// BenchmarkHeartbeat is what one heartbeat (a remote Node whose last-seen
// alone changed) costs a leader's watcher, step by step: decoding the
// kubelet-sized object from the watch (JSON, client-go's default;
// protobuf; protobuf keeping only what meshlet reads, as the informers
// do), the informer's transform, and the store's comparison that keeps it
// from waking the loop.
func BenchmarkHeartbeat(b *testing.B) {
	node := fatNode(7)
	node.APIVersion, node.Kind = "v1", "Node"
	js, err := runtime.Encode(scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), node)
	if err != nil {
		b.Fatal(err)
	}
	pbSer := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	pb, err := runtime.Encode(scheme.Codecs.EncoderForVersion(pbSer, corev1.SchemeGroupVersion), node)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		data    []byte
		decoder runtime.Decoder
	}{
		{"decode-json", js, scheme.Codecs.UniversalDeserializer()},
		{"decode-protobuf", pb, scheme.Codecs.UniversalDeserializer()},
		{"decode-protobuf-meshlet", pb, cluster.NodeDecoder()},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			for b.Loop() {
				if _, _, err := c.decoder.Decode(c.data, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("transform", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = kilo.TransformNode(node)
		}
	})
	b.Run("store", func(b *testing.B) {
		objs := cluster.NewStore("remote")
		now := time.Now()
		stripped, _ := kilo.TransformNode(node)
		n := stripped.(*corev1.Node)
		objs.SetNode(n, false, now)
		beats := make([]*corev1.Node, 2)
		for i := range beats {
			beats[i] = n.DeepCopy()
			beats[i].Annotations[topology.AnnotationLastSeen] = strconv.FormatInt(now.Unix()+int64(i), 10)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if objs.SetNode(beats[i%2], false, now) {
				b.Fatal("a heartbeat woke the loop")
			}
			i++
		}
	})
}

// TestHeartbeatDoesNotWake: last-seen alone never wakes the loop, while
// the node stays inside the window; any other change does.
func TestHeartbeatDoesNotWake(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	stripped, _ := kilo.TransformNode(fatNode(3))
	n := stripped.(*corev1.Node)
	n.Annotations[topology.AnnotationLastSeen] = fmt.Sprint(now.Unix())
	objs := cluster.NewStore("remote")
	if !objs.SetNode(n, false, now) {
		t.Fatal("a new node did not wake the loop")
	}
	for i := 1; i <= 5; i++ {
		beat := n.DeepCopy()
		beat.ResourceVersion = fmt.Sprint(i)
		beat.Annotations[topology.AnnotationLastSeen] = fmt.Sprint(now.Unix() + int64(30*i))
		if objs.SetNode(beat, false, now.Add(time.Duration(30*i)*time.Second)) {
			t.Fatalf("heartbeat %d woke the loop", i)
		}
	}
	moved := n.DeepCopy()
	moved.Annotations[topology.AnnotationEndpoint] = "10.9.9.9:51820"
	moved.Annotations[topology.AnnotationLastSeen] = fmt.Sprint(now.Unix() + 180)
	if !objs.SetNode(moved, false, now.Add(180*time.Second)) {
		t.Fatal("an endpoint change did not wake the loop")
	}
}
