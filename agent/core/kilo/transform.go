package kilo

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
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
// kilo.squat.ai/* and meshlet.io/* annotations, pod CIDRs, unschedulable,
// the InternalIP and ExternalIP addresses and the Ready condition (status
// and reason only).
func TransformNode(obj interface{}) (interface{}, error) { return Limits{}.TransformNode(obj) }

// TransformNode is the function TransformNode that also cuts an
// allowed-location-ips annotation over l.AllowedLocationIPs to its first
// l.AllowedLocationIPs+1 entries: the conversion rejects it all the same,
// and a watcher does not hold 256 KiB per Node for it.
func (l Limits) TransformNode(obj interface{}) (interface{}, error) {
	n, ok := obj.(*corev1.Node)
	if !ok || n == nil {
		return obj, nil
	}
	out := &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: stripMeta(&n.ObjectMeta, true),
	}
	if v, ok := out.Annotations[topology.AnnotationAllowedLocationIPs]; ok && l.AllowedLocationIPs > 0 {
		out.Annotations[topology.AnnotationAllowedLocationIPs], _ = firstEntries(v, l.AllowedLocationIPs+1)
	}
	out.Spec.PodCIDR = n.Spec.PodCIDR
	out.Spec.Unschedulable = n.Spec.Unschedulable
	if n.Spec.PodCIDRs != nil {
		out.Spec.PodCIDRs = append([]string(nil), n.Spec.PodCIDRs...)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeExternalIP || a.Type == corev1.NodeInternalIP {
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
func TransformPeer(obj interface{}) (interface{}, error) { return Limits{}.TransformPeer(obj) }

// TransformPeer is the function TransformPeer that also cuts a
// spec.allowedIPs over l.PeerAllowedIPs to its first l.PeerAllowedIPs+1
// entries: the conversion rejects the Peer all the same, and a watcher does
// not hold a megabyte per Peer for it.
func (l Limits) TransformPeer(obj interface{}) (interface{}, error) {
	p, ok := obj.(*Peer)
	if !ok || p == nil {
		return obj, nil
	}
	out := &Peer{TypeMeta: p.TypeMeta, ObjectMeta: stripMeta(&p.ObjectMeta, false)}
	keepOperatorLabels(p, out) // PeerToTopology ignores kilo-clustermesh-operator's Peers
	spec := p.Spec
	if l.PeerAllowedIPs > 0 && len(spec.AllowedIPs) > l.PeerAllowedIPs+1 {
		spec.AllowedIPs = spec.AllowedIPs[:l.PeerAllowedIPs+1]
	}
	spec.DeepCopyInto(&out.Spec)
	return out, nil
}

// firstEntries is s, a comma-separated list, cut after its first n
// non-empty entries, and whether it had more.
func firstEntries(s string, n int) (string, bool) {
	if strings.Count(s, ",") < n {
		return s, false
	}
	seen := 0
	for i := 0; i < len(s); i++ {
		if s[i] != ',' {
			continue
		}
		if i > 0 && s[i-1] != ',' {
			seen++
		}
		if seen == n {
			return s[:i], strings.Trim(s[i:], ",") != ""
		}
	}
	return s, false
}
