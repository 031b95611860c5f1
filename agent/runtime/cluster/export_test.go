package cluster

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/meshlet/meshlet/agent/core/kilo"
)

// NodeDecoder is the informers' protobuf decoder of Nodes (nodecodec.go).
func NodeDecoder() runtime.Decoder {
	return nodeSerializer{protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme)}
}

// Store exposes a cluster's converted objects to the external tests.
type Store struct{ o objects }

func NewStore(cluster string) *Store { return &Store{o: newObjects(cluster, kilo.Limits{})} }

func (o *Store) SetNode(n *corev1.Node, deleted bool, now time.Time) bool {
	return o.o.setNode(n, deleted, now)
}
