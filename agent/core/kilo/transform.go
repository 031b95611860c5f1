package kilo

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Transforms for client-go informers (cache.TransformFunc has this signature;
// the package does not import client-go). A watcher of every Node of ten
// clusters would otherwise keep managedFields, images and node info of
// thousands of nodes in memory for nothing. Each transform returns a new,
// stripped object holding exactly what ConvertNode or PeerToTopology read,
// plus the metadata an informer and Events need (name, UID, resource
// version, creation and deletion timestamps). Objects of other types, such as client-go's
// DeletedFinalStateUnknown tombstones, are returned unchanged, and a
// transformed object transforms to itself: client-go may call the transform
// on an object twice (Replace after a relist).

// keepAnnotation reports whether an annotation matters to meshlet.
func keepAnnotation(key string) bool {
	return strings.HasPrefix(key, "kilo.squat.ai/") || strings.HasPrefix(key, "meshlet.io/")
}

func stripMeta(in *metav1.ObjectMeta, keepLabels bool) metav1.ObjectMeta {
	out := metav1.ObjectMeta{
		Name:              in.Name,
		Namespace:         in.Namespace,
		UID:               in.UID,
		ResourceVersion:   in.ResourceVersion,
		Generation:        in.Generation,
		CreationTimestamp: in.CreationTimestamp, // the oldest objects are kept over a limit (Limits)
		DeletionTimestamp: in.DeletionTimestamp.DeepCopy(),
	}
	if keepLabels && in.Labels != nil {
		out.Labels = make(map[string]string, len(in.Labels))
		for k, v := range in.Labels {
			out.Labels[k] = v
		}
	}
	for k, v := range in.Annotations {
		if keepAnnotation(k) {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	return out
}

// TransformNode strips a *corev1.Node to what ConvertNode needs: labels,
// kilo.squat.ai/* and meshlet.io/* annotations, pod CIDRs, ExternalIP
// addresses and the Ready condition (status and reason only).
func TransformNode(obj interface{}) (interface{}, error) {
	n, ok := obj.(*corev1.Node)
	if !ok || n == nil {
		return obj, nil
	}
	out := &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: stripMeta(&n.ObjectMeta, true),
	}
	out.Spec.PodCIDR = n.Spec.PodCIDR
	if n.Spec.PodCIDRs != nil {
		out.Spec.PodCIDRs = append([]string(nil), n.Spec.PodCIDRs...)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeExternalIP {
			out.Status.Addresses = append(out.Status.Addresses, a)
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			// Heartbeat times change every few seconds; dropping them
			// also avoids needless update events downstream.
			out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status, Reason: c.Reason}}
			break
		}
	}
	return out, nil
}

// TransformPeer strips a *Peer to what PeerToTopology needs: the spec and the
// kilo.squat.ai/* and meshlet.io/* annotations (kubectl's
// last-applied-configuration copy of the spec is dropped).
func TransformPeer(obj interface{}) (interface{}, error) {
	p, ok := obj.(*Peer)
	if !ok || p == nil {
		return obj, nil
	}
	out := &Peer{TypeMeta: p.TypeMeta, ObjectMeta: stripMeta(&p.ObjectMeta, false)}
	keepOperatorLabels(p, out) // PeerToTopology ignores kilo-clustermesh-operator's Peers
	p.Spec.DeepCopyInto(&out.Spec)
	return out, nil
}
