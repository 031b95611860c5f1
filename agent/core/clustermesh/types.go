// Package clustermesh holds the ClusterMesh API (kilo.squat.ai/v1alpha1,
// schema-compatible with kilo-clustermesh-operator: 0.6.x's allowedNetworks
// and the later podCIDRs / wireguardCIDR / serviceCIDR / additionalCIDRs,
// see docs/clustermesh.md), its validation, and its conversion into the
// planner's topology.Mesh. A mesh that fails validation never reaches the
// planner: it becomes topology.Rejections and changes nothing on the data
// plane. The package imports no client-go.
//
// The markers below and on the ClusterMesh types generate its
// CustomResourceDefinition (manifests/crds, make generate).
//
// +groupName=kilo.squat.ai
// +versionName=v1alpha1
package clustermesh

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group ClusterMesh shares with Kilo's Peer.
const GroupName = "kilo.squat.ai"

// SchemeGroupVersion is kilo.squat.ai/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource is the ClusterMesh resource (plural), for dynamic and REST clients.
var Resource = SchemeGroupVersion.WithResource("clustermeshes")

var (
	// SchemeBuilder registers ClusterMesh and ClusterMeshList.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds ClusterMesh and ClusterMeshList to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &ClusterMesh{}, &ClusterMeshList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// DefaultWireGuardPort is the wireguardPort of an entry that sets none.
const DefaultWireGuardPort = 51820

// The CRD generated from these types (manifests/crds) checks types and
// required fields only, like Kilo's Peer CRD: CIDRs, ranges, overlaps and
// the single local entry are validated by meshlet, which reports a bad mesh
// (Event, log, metric) and leaves the data plane untouched. So every object
// kilo-clustermesh-operator's CRD accepts, this one accepts as it is
// (nothing pruned, the same meaning); this one accepts more: 0.6's form,
// which is why it cannot require podCIDRs and wireguardCIDR as the
// operator's does, and values the operator's patterns and ranges refuse,
// which meshlet refuses with an Event instead (manifests/crds_test.go).

// ClusterMesh joins several clusters into one WireGuard mesh.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Namespaced,shortName=cm
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Clusters",type=string,JSONPath=`.status.readyClusters`,description="Remote clusters synced and reachable / all (kubectl prints only the first element of a list, so no list of names)."
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterMesh struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec lists the clusters of the mesh.
	Spec ClusterMeshSpec `json:"spec"`
	// Status is written by one elected writer (or the operator).
	// +optional
	Status ClusterMeshStatus `json:"status,omitempty"`
}

// ClusterMeshSpec lists the clusters of the mesh.
//
// +k8s:deepcopy-gen=true
type ClusterMeshSpec struct {
	// Clusters of the mesh; exactly one is the local cluster (by
	// --cluster-name, else local=true).
	Clusters []Cluster `json:"clusters"`
}

// An entry's networks are written in either of the operator's two forms, or
// both: 0.6's flat AllowedNetworks, or the later PodCIDRs, WireguardCIDR,
// ServiceCIDR and AdditionalCIDRs. They add up: the cluster's networks are
// AllowedNetworks ∪ PodCIDRs ∪ {WireguardCIDR} ∪ {ServiceCIDR} ∪
// AdditionalCIDRs (see Validate). Numbers are plain ints so that
// out-of-range values decode and are then rejected with a reason rather
// than failing the decoding of a whole list.

// Cluster is one cluster of the mesh.
//
// +k8s:deepcopy-gen=true
type Cluster struct {
	// Name of the cluster, a DNS label unique in the mesh.
	Name string `json:"name"`
	// Local marks the cluster this object lives in (meshlet prefers its
	// --cluster-name, see Resolve).
	// +optional
	Local bool `json:"local,omitempty"`
	// AllowedNetworks are every CIDR of the cluster (pods, WireGuard
	// subnet, services, hosts); nothing outside them is accepted from it
	// (kilo-clustermesh-operator 0.6's form).
	// +optional
	AllowedNetworks []string `json:"allowedNetworks,omitempty"`
	// PodCIDRs are the pod network CIDRs of the cluster (with
	// wireguardCIDR, serviceCIDR and additionalCIDRs, the later operator's
	// form of allowedNetworks; they add up with it).
	// +optional
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// WireguardCIDR is the CIDR of the WireGuard (kilo0) addresses of the
	// cluster's nodes.
	// +optional
	WireguardCIDR string `json:"wireguardCIDR,omitempty"`
	// ServiceCIDR is the service network CIDR of the cluster.
	// +optional
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// AdditionalCIDRs are other CIDRs of the cluster (host networks,
	// external subnets).
	// +optional
	AdditionalCIDRs []string `json:"additionalCIDRs,omitempty"`
	// WireguardPort is the WireGuard port of the cluster's nodes (0:
	// 51820).
	// +optional
	WireguardPort int `json:"wireguardPort,omitempty"`
	// PersistentKeepalive in seconds towards this cluster's leaders,
	// 0-65535 (0: the nodes' keepalive annotations decide), e.g. 25 for a
	// cluster behind NAT.
	// +optional
	PersistentKeepalive int `json:"persistentKeepalive,omitempty"`
	// KubeconfigSecretRef names the Secret in the same namespace holding a
	// read-only kubeconfig for a remote cluster; required for remote
	// entries.
	// +optional
	KubeconfigSecretRef *SecretKeyRef `json:"kubeconfigSecretRef,omitempty"`
}

// SecretKeyRef names one key of a Secret in the ClusterMesh's namespace.
//
// +k8s:deepcopy-gen=true
type SecretKeyRef struct {
	// Name of the Secret.
	Name string `json:"name"`
	// Key of the kubeconfig in the Secret (default kubeconfig).
	// +optional
	Key string `json:"key"`
}

// ClusterMeshStatus is written by one elected writer (or the operator).
//
// +k8s:deepcopy-gen=true
type ClusterMeshStatus struct {
	// ReadyClusters is "ready/remote clusters" (a printer column: kubectl
	// prints only the first element of a list).
	// +optional
	ReadyClusters string `json:"readyClusters,omitempty"`
	// Clusters is the state of each remote cluster.
	// +optional
	Clusters []ClusterStatus `json:"clusters,omitempty"`
	// Conditions: Ready, NetworksOverlap.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// registeredPeers and skippedNodes are the operator's fields (its
// registered Peers are the WireGuard peers it made for the cluster's nodes;
// meshlet's are the cluster's leaders it peers with; skipped nodes are the
// remote nodes rejected); the others are meshlet's watcher's state, which
// kilo-clustermesh-operator's CRD does not keep (and meshlet writes no more
// than that CRD keeps where it is installed, schema.go).

// ClusterStatus counts what was taken from one remote cluster.
//
// +k8s:deepcopy-gen=true
type ClusterStatus struct {
	// Name of the cluster.
	Name string `json:"name"`
	// RegisteredPeers are the cluster's leaders meshlet peers with (the
	// operator's Peers for the cluster's nodes).
	// +optional
	RegisteredPeers int `json:"registeredPeers"`
	// SkippedNodes are the cluster's nodes rejected.
	// +optional
	SkippedNodes int `json:"skippedNodes"`
	// Synced: meshlet's watcher of the cluster has listed it.
	// +optional
	Synced bool `json:"synced"`
	// Ready: the cluster is synced and its API server reachable.
	// +optional
	Ready bool `json:"ready"`
	// Nodes is the number of the cluster's Nodes watched.
	// +optional
	Nodes int `json:"nodes"`
	// Peers is the number of the cluster's Peers watched.
	// +optional
	Peers int `json:"peers"`
	// Message says why the cluster is not ready.
	// +optional
	Message string `json:"message,omitempty"`
}

// Condition types of ClusterMeshStatus.
const (
	ConditionReady           = "Ready"
	ConditionNetworksOverlap = "NetworksOverlap"
)

// ClusterMeshList is a list of ClusterMeshes.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ClusterMeshList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ClusterMesh `json:"items"`
}
