package clustermesh

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
)

func TestBuildStatus(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	mesh := func() *ClusterMesh {
		return &ClusterMesh{ObjectMeta: metav1.ObjectMeta{Namespace: "kilo-system", Name: "prod", Generation: 3}, Spec: ClusterMeshSpec{Clusters: []Cluster{
			{Name: "a", Local: true}, {Name: "b"}, {Name: "c"},
		}}}
	}
	good := map[string]RemoteState{"b": {Watched: true, Synced: true, Ready: true, Nodes: 4, Peers: 1, Leaders: 4}, "c": {Watched: true, Synced: true, Ready: true, Nodes: 2, Leaders: 2}}
	nodeRej := func(cluster, name string) topology.Rejection {
		return topology.Rejection{Object: topology.ObjectRef{Kind: "Node", Cluster: cluster, Name: name}, Reason: topology.ReasonOutsideAllowed}
	}
	for _, tc := range []struct {
		name       string
		cluster    string
		remotes    map[string]RemoteState
		rejections []topology.Rejection
		previous   []metav1.Condition
		ready      metav1.ConditionStatus
		reason     string
		overlap    metav1.ConditionStatus
		clusters   []ClusterStatus
		since      time.Time // Ready's transition time
	}{
		{name: "all ready", remotes: good, ready: "True", reason: ReasonClustersReady, overlap: "False", since: now,
			clusters: []ClusterStatus{{Name: "b", RegisteredPeers: 4, Synced: true, Ready: true, Nodes: 4, Peers: 1}, {Name: "c", RegisteredPeers: 2, Synced: true, Ready: true, Nodes: 2}}},
		{name: "by cluster name, skipped nodes counted once", cluster: "b", remotes: map[string]RemoteState{"a": {Watched: true, Synced: true, Ready: true, Nodes: 3, Leaders: 2}, "c": {Watched: true, Synced: true, Ready: true, Nodes: 2, Leaders: 1}},
			rejections: []topology.Rejection{nodeRej("a", "a-1"), nodeRej("a", "a-1"), nodeRej("c", "c-9"), nodeRej("", "local")},
			ready:      "True", reason: ReasonClustersReady, overlap: "False", since: now,
			clusters: []ClusterStatus{{Name: "a", RegisteredPeers: 2, SkippedNodes: 1, Synced: true, Ready: true, Nodes: 3}, {Name: "c", RegisteredPeers: 1, SkippedNodes: 1, Synced: true, Ready: true, Nodes: 2}}},
		{name: "remote down keeps counts", remotes: map[string]RemoteState{"b": {Watched: true, Synced: true, Nodes: 4, Leaders: 4, Error: "connection refused"}, "c": good["c"]},
			ready: "False", reason: ReasonNotReady, overlap: "False", since: now,
			clusters: []ClusterStatus{{Name: "b", RegisteredPeers: 4, Synced: true, Nodes: 4, Message: "connection refused"}, {Name: "c", RegisteredPeers: 2, Synced: true, Ready: true, Nodes: 2}}},
		{name: "not watched", remotes: map[string]RemoteState{"b": good["b"]}, ready: "False", reason: ReasonNotWatched, overlap: "False", since: now,
			clusters: []ClusterStatus{{Name: "b", RegisteredPeers: 4, Synced: true, Ready: true, Nodes: 4, Peers: 1}, {Name: "c"}}},
		{name: "overlap", remotes: good, rejections: []topology.Rejection{{Object: topology.ObjectRef{Kind: "ClusterMesh", Namespace: "kilo-system", Name: "prod"},
			Reason: topology.ReasonNetworksOverlap, Message: "b and c overlap"}, {Object: topology.ObjectRef{Kind: "ClusterMesh", Namespace: "kilo-system", Name: "other"}, Reason: topology.ReasonInvalidClusterMesh}},
			ready: "False", reason: "NetworksOverlap", overlap: "True", since: now,
			clusters: []ClusterStatus{{Name: "b", RegisteredPeers: 4, Synced: true, Ready: true, Nodes: 4, Peers: 1}, {Name: "c", RegisteredPeers: 2, Synced: true, Ready: true, Nodes: 2}}},
		{name: "unchanged condition keeps its transition time", remotes: good,
			previous: []metav1.Condition{{Type: ConditionReady, Status: "True", Reason: ReasonClustersReady, LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))}},
			ready:    "True", reason: ReasonClustersReady, overlap: "False", since: now.Add(-time.Hour),
			clusters: []ClusterStatus{{Name: "b", RegisteredPeers: 4, Synced: true, Ready: true, Nodes: 4, Peers: 1}, {Name: "c", RegisteredPeers: 2, Synced: true, Ready: true, Nodes: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mesh()
			m.Status.Conditions = tc.previous
			st := BuildStatus(m, tc.cluster, tc.remotes, tc.rejections, now)
			if len(st.Clusters) != len(tc.clusters) {
				t.Fatalf("clusters %+v, want %+v", st.Clusters, tc.clusters)
			}
			for i := range st.Clusters {
				if st.Clusters[i] != tc.clusters[i] {
					t.Errorf("cluster %d: %+v, want %+v", i, st.Clusters[i], tc.clusters[i])
				}
			}
			if len(st.Conditions) != 2 || st.Conditions[0].Type != ConditionNetworksOverlap || st.Conditions[1].Type != ConditionReady {
				t.Fatalf("conditions %+v", st.Conditions)
			}
			r, o := st.Conditions[1], st.Conditions[0]
			if r.Status != tc.ready || r.Reason != tc.reason || o.Status != tc.overlap || r.ObservedGeneration != 3 || !r.LastTransitionTime.Time.Equal(tc.since) {
				t.Errorf("Ready %s/%s (gen %d, since %v), NetworksOverlap %s; want %s/%s since %v, %s: %s",
					r.Status, r.Reason, r.ObservedGeneration, r.LastTransitionTime, o.Status, tc.ready, tc.reason, tc.since, tc.overlap, r.Message)
			}
		})
	}
}
