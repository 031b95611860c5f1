package kilo

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Peer is Kilo's cluster-scoped Peer: a WireGuard peer outside the cluster
// (a laptop, a VM) that the segment leaders add to kilo0.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type Peer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PeerSpec `json:"spec"`
}

// PeerSpec is the Peer's spec, field for field Kilo 0.7's JSON.
//
// Numbers are plain ints (Kilo uses uint32 for the port) so that a negative or
// out-of-range value still decodes and is then rejected with a reason, instead
// of failing to decode the whole list.
//
// +k8s:deepcopy-gen=true
type PeerSpec struct {
	// AllowedIPs are the CIDRs routed to the peer. Required.
	AllowedIPs []string `json:"allowedIPs"`
	// Endpoint is where the peer can be reached; nil means it roams.
	Endpoint *PeerEndpoint `json:"endpoint,omitempty"`
	// PersistentKeepalive is the keepalive interval in seconds; 0 = off.
	PersistentKeepalive int `json:"persistentKeepalive,omitempty"`
	// PresharedKey is an optional base64 WireGuard preshared key.
	PresharedKey string `json:"presharedKey,omitempty"`
	// PublicKey is the peer's base64 WireGuard public key. Required.
	PublicKey string `json:"publicKey"`
}

// PeerEndpoint is Kilo's nested endpoint: {dnsOrIP: {dns, ip}, port}.
//
// +k8s:deepcopy-gen=true
type PeerEndpoint struct {
	DNSOrIP DNSOrIP `json:"dnsOrIP"`
	Port    int     `json:"port"`
}

// DNSOrIP holds a DNS name or an IP address; Kilo uses the name when both are
// set.
//
// +k8s:deepcopy-gen=true
type DNSOrIP struct {
	DNS string `json:"dns,omitempty"`
	IP  string `json:"ip,omitempty"`
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
