package clustermesh

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// RemoteState is what the status writer's agent knows of one remote
// cluster: its watcher's state, and the remote leaders its plan peers with.
type RemoteState struct {
	Watched, Synced, Ready bool
	Nodes, Peers           int
	// Leaders are the remote cluster's leaders that are WireGuard peers of
	// this agent (a segment leader: every local leader has the same).
	Leaders int
	Error   string
}

// Reasons of the Ready condition.
const (
	ReasonClustersReady    = "ClustersReady"
	ReasonNotWatched       = "RemoteClusterNotWatched"
	ReasonNotSynced        = "RemoteClusterNotSynced"
	ReasonNotReady         = "RemoteClusterNotReady"
	ReasonNoOverlap        = "NoOverlap"
	ReasonRejectedMesh     = "Rejected"
	conditionMessageLength = 1024
)

// BuildStatus is the status of mesh m as seen from cluster clusterName
// ("" = the entry marked local): one entry per remote cluster with what its
// watcher knows (remotes, by cluster name), the operator's counts —
// registeredPeers, to meshlet the remote leaders peered with (the operator's
// Peers are the WireGuard peers of that cluster, meshlet's are its
// leaders), and skippedNodes, the remote nodes rejected (rejections of Node
// objects of that cluster) — and a Ready condition (the mesh
// is accepted and every remote cluster is synced and reachable) and the
// operator's NetworksOverlap condition. Conditions keep their transition
// time while their status does not change.
func BuildStatus(m *ClusterMesh, clusterName string, remotes map[string]RemoteState, rejections []topology.Rejection, now time.Time) ClusterMeshStatus {
	var st ClusterMeshStatus
	meshRejections, skipped := sortRejections(m, rejections)
	var notWatched, notSynced, notReady []string
	for _, c := range m.Spec.Clusters {
		if c.Name == clusterName || (clusterName == "" && c.Local) {
			continue
		}
		r := remotes[c.Name]
		cs := ClusterStatus{Name: c.Name, RegisteredPeers: r.Leaders, SkippedNodes: len(skipped[c.Name]), Synced: r.Synced, Ready: r.Ready,
			Nodes: r.Nodes, Peers: r.Peers, Message: r.Error}
		switch {
		case !r.Watched:
			notWatched = append(notWatched, c.Name)
		case !r.Synced:
			notSynced = append(notSynced, describe(c.Name, r.Error))
		case !r.Ready:
			notReady = append(notReady, describe(c.Name, r.Error))
		}
		st.Clusters = append(st.Clusters, cs)
	}

	readyCount := 0
	for _, c := range st.Clusters {
		if c.Synced && c.Ready {
			readyCount++
		}
	}
	st.ReadyClusters = fmt.Sprintf("%d/%d", readyCount, len(st.Clusters))
	ready, overlap := readiness(len(st.Clusters), meshRejections, notWatched, notSynced, notReady)
	st.Conditions = append([]metav1.Condition(nil), m.Status.Conditions...)
	for _, c := range []metav1.Condition{ready, overlap} {
		c.ObservedGeneration = m.Generation
		c.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
		if r := []rune(c.Message); len(r) > conditionMessageLength {
			c.Message = string(r[:conditionMessageLength-1]) + "…"
		}
		meta.SetStatusCondition(&st.Conditions, c)
	}
	sort.Slice(st.Conditions, func(i, j int) bool { return st.Conditions[i].Type < st.Conditions[j].Type })
	return st
}

// sortRejections picks the rejections of mesh m itself and, per remote
// cluster, the names of its nodes rejected.
func sortRejections(m *ClusterMesh, rejections []topology.Rejection) ([]topology.Rejection, map[string]map[string]bool) {
	var mesh []topology.Rejection
	skipped := map[string]map[string]bool{}
	for _, r := range rejections {
		switch {
		case r.Object.Kind == "ClusterMesh" && r.Object.Namespace == m.Namespace && r.Object.Name == m.Name:
			mesh = append(mesh, r)
		case r.Object.Kind == "Node" && r.Object.Cluster != "":
			if skipped[r.Object.Cluster] == nil {
				skipped[r.Object.Cluster] = map[string]bool{}
			}
			skipped[r.Object.Cluster][r.Object.Name] = true
		}
	}
	return mesh, skipped
}

// readiness is the Ready and NetworksOverlap conditions: the mesh's own
// rejections first, then the first kind of remote cluster not yet usable.
func readiness(clusters int, meshRejections []topology.Rejection, notWatched, notSynced, notReady []string) (ready, overlap metav1.Condition) {
	ready = metav1.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonClustersReady,
		Message: fmt.Sprintf("%d remote clusters synced and reachable", clusters)}
	overlap = metav1.Condition{Type: ConditionNetworksOverlap, Status: metav1.ConditionFalse, Reason: ReasonNoOverlap,
		Message: "no networks overlap"}
	switch {
	case len(meshRejections) > 0:
		var msgs []string
		for _, r := range meshRejections {
			msgs = append(msgs, r.Message)
			if r.Reason == topology.ReasonNetworksOverlap {
				overlap.Status, overlap.Reason, overlap.Message = metav1.ConditionTrue, string(r.Reason), r.Message
			}
		}
		ready.Status, ready.Reason = metav1.ConditionFalse, string(meshRejections[0].Reason)
		ready.Message = "rejected, the last accepted version (if any) stays in force: " + strings.Join(msgs, "; ")
	case len(notWatched) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonNotWatched
		ready.Message = "not watched yet (no segment leader has started its watcher, or its kubeconfig Secret is missing): " + strings.Join(notWatched, ", ")
	case len(notSynced) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonNotSynced
		ready.Message = "not listed yet: " + strings.Join(notSynced, "; ")
	case len(notReady) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonNotReady
		ready.Message = "API server unreachable (the last known peers and routes stay in force): " + strings.Join(notReady, "; ")
	}
	return ready, overlap
}

func describe(name, err string) string {
	if err == "" {
		return name
	}
	return name + " (" + err + ")"
}
