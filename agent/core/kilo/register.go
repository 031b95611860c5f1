package kilo

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is Kilo's API group.
const GroupName = "kilo.squat.ai"

// SchemeGroupVersion is the group/version of Kilo's Peer (and meshlet's
// ClusterMesh, which lives in the same group but registers itself).
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// PeerResource is the resource (plural) of Peer, for dynamic and REST clients.
var PeerResource = SchemeGroupVersion.WithResource("peers")

var (
	// SchemeBuilder registers Peer and PeerList.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds Peer and PeerList to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &Peer{}, &PeerList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
