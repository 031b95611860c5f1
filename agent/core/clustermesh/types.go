// Package clustermesh holds the ClusterMesh API (kilo.squat.ai/v1alpha1,
// schema-compatible with kilo-clustermesh-operator: 0.6.x's allowedNetworks
// and the later podCIDRs / wireguardCIDR / serviceCIDR / additionalCIDRs,
// see docs/clustermesh.md), its validation, and its conversion into the
// planner's topology.Mesh. A mesh that fails validation never reaches the
// planner: it becomes topology.Rejections and changes nothing on the data
// plane. The package imports no client-go.
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

// ClusterMesh declares a set of clusters joined into one WireGuard mesh. It
// is namespaced and has a status subresource.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ClusterMesh struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterMeshSpec   `json:"spec"`
	Status ClusterMeshStatus `json:"status,omitempty"`
}

// ClusterMeshSpec lists the clusters of the mesh.
//
// +k8s:deepcopy-gen=true
type ClusterMeshSpec struct {
	Clusters []Cluster `json:"clusters"`
}

// Cluster is one entry of spec.clusters.
//
// Its networks are written in either of the operator's two forms, or both:
// 0.6's flat AllowedNetworks, or the later PodCIDRs, WireguardCIDR,
// ServiceCIDR and AdditionalCIDRs. They add up: the cluster's networks are
// AllowedNetworks ∪ PodCIDRs ∪ {WireguardCIDR} ∪ {ServiceCIDR} ∪
// AdditionalCIDRs (see Validate).
//
// Numbers are plain ints so that out-of-range values decode and are then
// rejected with a reason rather than failing the decoding of a whole list.
//
// +k8s:deepcopy-gen=true
type Cluster struct {
	// Name is a DNS label (≤ 63 characters), unique in the mesh.
	Name string `json:"name"`
	// Local marks the cluster the object lives in; meshlet prefers its
	// --cluster-name (see Resolve).
	Local bool `json:"local,omitempty"`
	// AllowedNetworks are every CIDR of the cluster (pods, WireGuard subnet,
	// services, hosts); nothing outside them is accepted from it. The
	// operator's 0.6 form.
	AllowedNetworks []string `json:"allowedNetworks,omitempty"`
	// PodCIDRs, WireguardCIDR, ServiceCIDR and AdditionalCIDRs are the
	// later operator's form of the same: the pod networks, the WireGuard
	// (kilo0) subnet, the service network and any other (host networks).
	// To meshlet they are networks of the cluster like AllowedNetworks.
	PodCIDRs        []string `json:"podCIDRs,omitempty"`
	WireguardCIDR   string   `json:"wireguardCIDR,omitempty"`
	ServiceCIDR     string   `json:"serviceCIDR,omitempty"`
	AdditionalCIDRs []string `json:"additionalCIDRs,omitempty"`
	// WireguardPort is the port its nodes listen on; 0 means 51820.
	WireguardPort int `json:"wireguardPort,omitempty"`
	// PersistentKeepalive in seconds, 0–65535, 0 = off (the later
	// operator's form has none: the nodes' keepalive annotations then
	// decide, docs/architecture.md#keepalive).
	PersistentKeepalive int `json:"persistentKeepalive,omitempty"`
	// KubeconfigSecretRef names the Secret (same namespace) holding a
	// kubeconfig for the cluster; required for remote entries.
	KubeconfigSecretRef *SecretKeyRef `json:"kubeconfigSecretRef,omitempty"`
}

// SecretKeyRef names one key of a Secret in the ClusterMesh's namespace.
//
// +k8s:deepcopy-gen=true
type SecretKeyRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// ClusterMeshStatus is written by one elected writer (or the operator).
//
// +k8s:deepcopy-gen=true
type ClusterMeshStatus struct {
	// ReadyClusters is "ready/remote clusters" (a printer column: kubectl
	// prints only the first element of a list).
	ReadyClusters string             `json:"readyClusters,omitempty"`
	Clusters      []ClusterStatus    `json:"clusters,omitempty"`
	Conditions    []metav1.Condition `json:"conditions,omitempty"`
}

// ClusterStatus counts what was taken from one remote cluster.
// registeredPeers and skippedNodes are the operator's fields (its
// registered Peers are the WireGuard peers it made for the cluster's nodes;
// meshlet's are the cluster's leaders it peers with; skipped nodes are the
// remote nodes rejected); the others are meshlet's watcher's state, which
// kilo-clustermesh-operator's CRD does not keep.
//
// +k8s:deepcopy-gen=true
type ClusterStatus struct {
	Name            string `json:"name"`
	RegisteredPeers int    `json:"registeredPeers"`
	SkippedNodes    int    `json:"skippedNodes"`
	Synced          bool   `json:"synced"`
	Ready           bool   `json:"ready"`
	Nodes           int    `json:"nodes"`
	Peers           int    `json:"peers"`
	Message         string `json:"message,omitempty"`
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
