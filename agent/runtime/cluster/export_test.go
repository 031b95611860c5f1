package cluster

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Store exposes a cluster's converted objects to the external tests.
type Store struct{ o objects }

func NewStore(cluster string) *Store { return &Store{o: newObjects(cluster)} }

func (o *Store) SetNode(n *corev1.Node, deleted bool, now time.Time) bool {
	return o.o.setNode(n, deleted, now)
}
