package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// Source assembles the planner's snapshot from the local and remote
// watchers.
type Source struct {
	Local       *Local
	Remotes     *Remotes
	ClusterName string
}

// Synced reports whether the local caches listed once.
func (s *Source) Synced() bool { return s.Local.Synced() }

// Snapshot implements reconcile.Snapshotter: the planner's input, and the
// remote clusters' credentials the accepted ClusterMeshes name (for the
// remote watchers, which follow the plan).
func (s *Source) Snapshot() (topology.Snapshot, []clustermesh.Kubeconfig) {
	st := s.Local.State(s.ClusterName)
	snap := topology.Snapshot{Nodes: st.Nodes, Peers: st.Peers, Meshes: st.Mesh.Meshes, Rejections: st.Rejections}
	if n := s.Local.SelfNode(); n != nil {
		snap.Published = maps.Clone(n.Annotations)
	}
	if s.Remotes != nil {
		rcs, rejs := s.Remotes.State()
		snap.Remotes = rcs
		snap.Rejections = append(snap.Rejections, rejs...)
	}
	return snap, st.Mesh.Kubeconfigs
}

// Publisher is the one writer of Node objects while the agent runs: it
// writes this node's annotations (Kilo's, meshlet's marks, the leader mark
// of the Lease's holder) with a merge patch of the values that differ from
// what the Node has, and removes meshlet's leader mark from the nodes the
// plan names (Unmark). When last-seen is refreshed is the plan's
// (topology.WithLastSeen): a quiet cluster sees one patch per node every
// ~30 s, as with kg.
type Publisher struct {
	Client kubernetes.Interface
	Local  *Local
	Node   string
	// Log says when this node's leader mark goes out (nil: not said).
	Log *slog.Logger
}

// Publish implements reconcile.Publisher.
func (p *Publisher) Publish(ctx context.Context, want map[string]string) (bool, error) {
	cur := p.Local.SelfNode()
	if cur == nil {
		return false, fmt.Errorf("node %s not found in the local cluster", p.Node)
	}
	diff := AnnotationDiff(cur, want)
	if len(diff) == 0 {
		return false, nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": diff}})
	if err != nil {
		return false, fmt.Errorf("encoding annotation patch: %w", err)
	}
	if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.Node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return false, fmt.Errorf("patching node %s: %w", p.Node, err)
	}
	if _, ok := diff[topology.AnnotationLeader]; ok && p.Log != nil {
		p.Log.Info("marked this node as its location's leader", "annotation", topology.AnnotationLeader, "value", diff[topology.AnnotationLeader])
	}
	return true, nil
}

// Unmark removes meshlet's leader mark from the nodes the plan names (a
// new holder clears the old one's; a location back under Kilo's rule
// clears its own). The JSON patch tests the value first, so a user's
// leader annotation (any other value) is never removed, even one written
// since this node last saw it (docs/failover.md#marks). It reports the
// marks removed.
func (p *Publisher) Unmark(ctx context.Context, nodes []string) (int, error) {
	var errs []error
	removed := 0
	for _, n := range nodes {
		if a, ok := p.Local.NodeAnnotations(n); ok && a[topology.AnnotationLeader] != topology.LeaderLeaseValue {
			continue
		}
		ok, err := unmark(ctx, p.Client, n)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// unmarkPatch removes the leader annotation only while its value is
// meshlet's: the API server tests it in the same request.
var unmarkPatch = func() []byte {
	path := "/metadata/annotations/" + jsonPointer(topology.AnnotationLeader)
	b, _ := json.Marshal([]map[string]any{ // a literal of strings: cannot fail
		{"op": "test", "path": path, "value": topology.LeaderLeaseValue},
		{"op": "remove", "path": path},
	})
	return b
}()

// unmark removes meshlet's leader mark from node; false when there was
// none (the node gone, no mark, or a user's value).
func unmark(ctx context.Context, client kubernetes.Interface, node string) (bool, error) {
	_, err := client.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType, unmarkPatch, metav1.PatchOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err), apierrors.IsInvalid(err):
		// Gone, or the value is not meshlet's (none, or a user's).
		return false, nil
	}
	return false, fmt.Errorf("removing the leader mark of node %s: %w", node, err)
}

// jsonPointer escapes a key for a JSON patch path (RFC 6901).
func jsonPointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// AnnotationDiff returns the annotations of want whose value the Node
// does not have.
func AnnotationDiff(cur *corev1.Node, want map[string]string) map[string]string {
	diff := map[string]string{}
	for k, v := range want {
		if old, ok := cur.Annotations[k]; !ok || old != v {
			diff[k] = v
		}
	}
	return diff
}

// kiloPublished are the annotations of Kilo's the agent writes on its Node
// (kg's own set, which kg's graceful exit removes), meshletMarks its own;
// Unpublish removes them.
var (
	kiloPublished = []string{
		topology.AnnotationEndpoint, topology.AnnotationInternalIP, topology.AnnotationKey, topology.AnnotationLastSeen,
		topology.AnnotationWireGuardIP, topology.AnnotationDiscoveredEndpoints, topology.AnnotationGranularity,
		topology.AnnotationCNICompatibilityIP,
	}
	meshletMarks = []string{topology.AnnotationVersion, topology.AnnotationTunnels, topology.AnnotationDegraded, topology.AnnotationSeen}
)

// Unpublish removes what the agent published on node: meshlet's marks, the
// leader annotation when it is meshlet's mark (a user's stays: the API
// server tests the value, as for Unmark), and unless keepKilo Kilo's
// annotations too (keepKilo: kg takes the node over and publishes them
// again). It reads nothing (kg's grants have no get on nodes).
func Unpublish(ctx context.Context, client kubernetes.Interface, node string, keepKilo bool) error {
	if _, err := unmark(ctx, client, node); err != nil {
		return err
	}
	remove := map[string]any{}
	for _, k := range meshletMarks {
		remove[k] = nil
	}
	if !keepKilo {
		for _, k := range kiloPublished {
			remove[k] = nil
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": remove}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("removing node %s's annotations: %w", node, err)
	}
	return nil
}
