package kilo

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The CRD generated from these types (manifests/crds) checks types and
// required fields only, like Kilo's own: keys, CIDRs and ranges are
// validated by meshlet, which rejects a bad Peer visibly (Event, log,
// meshlet_rejections_total) and keeps every other peer working. A stricter
// schema would behave differently on clusters that carry Kilo's CRD, which
// is the same (group, version, kind, scope, field names and nesting), so
// applying meshlet's over Kilo's is harmless.

// Peer is a WireGuard peer that should have access to the mesh.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Allowed IPs",type=string,JSONPath=`.spec.allowedIPs`
// +kubebuilder:printcolumn:name="Keepalive",type=integer,JSONPath=`.spec.persistentKeepalive`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Peer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Specification of the desired behavior of the Kilo Peer.
	Spec PeerSpec `json:"spec"`
}

// Numbers in these types are plain ints (Kilo uses uint32 for the port) so
// that a negative or out-of-range value still decodes and is then rejected
// with a reason, instead of failing to decode the whole list.

// PeerSpec is the Peer's spec, field for field Kilo 0.7's JSON.
//
// +k8s:deepcopy-gen=true
type PeerSpec struct {
	// AllowedIPs is the list of IP addresses (CIDRs) that are allowed for
	// the given peer's tunnel.
	AllowedIPs []string `json:"allowedIPs"`
	// Endpoint is the initial endpoint for connections to the peer; without
	// one the peer roams.
	// +optional
	Endpoint *PeerEndpoint `json:"endpoint,omitempty"`
	// PersistentKeepalive is the interval in seconds of the keepalive
	// packets; 0 disables it. meshlet applies it on the nodes' side too.
	// +optional
	PersistentKeepalive int `json:"persistentKeepalive,omitempty"`
	// PresharedKey is the optional symmetric encryption key for the peer
	// (base64 of 32 bytes).
	// +optional
	PresharedKey string `json:"presharedKey,omitempty"`
	// PublicKey is the WireGuard public key for the peer (base64 of 32
	// bytes).
	PublicKey string `json:"publicKey"`
}

// PeerEndpoint is Kilo's nested endpoint: {dnsOrIP: {dns, ip}, port}.
//
// +k8s:deepcopy-gen=true
type PeerEndpoint struct {
	// DNSOrIP is a DNS name or an IP address; when both are set, DNS is
	// used.
	DNSOrIP DNSOrIP `json:"dnsOrIP"`
	// Port must be a valid port number (1-65535).
	// +kubebuilder:validation:Format=int32
	Port int `json:"port"`
}

// DNSOrIP holds a DNS name or an IP address; Kilo uses the name when both are
// set.
//
// +k8s:deepcopy-gen=true
type DNSOrIP struct {
	// DNS must be a valid RFC 1123 subdomain.
	// +optional
	DNS string `json:"dns,omitempty"`
	// IP must be a valid IP address.
	// +optional
	IP string `json:"ip,omitempty"`
}

// PeerList is a list of Peers.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type PeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []Peer `json:"items"`
}
