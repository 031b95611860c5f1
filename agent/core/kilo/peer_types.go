package kilo

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Peer is Kilo's cluster-scoped Peer: a WireGuard peer outside the cluster
// (a laptop, a VM) that the segment leaders add to kilo0.
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
type PeerEndpoint struct {
	DNSOrIP DNSOrIP `json:"dnsOrIP"`
	Port    int     `json:"port"`
}

// DNSOrIP holds a DNS name or an IP address; Kilo uses the name when both are
// set.
type DNSOrIP struct {
	DNS string `json:"dns,omitempty"`
	IP  string `json:"ip,omitempty"`
}

// PeerList is a list of Peers.
type PeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []Peer `json:"items"`
}

// DeepCopyInto copies in into out.
func (in *DNSOrIP) DeepCopyInto(out *DNSOrIP) { *out = *in }

// DeepCopyInto copies in into out.
func (in *PeerEndpoint) DeepCopyInto(out *PeerEndpoint) { *out = *in }

// DeepCopy returns a copy of in.
func (in *PeerEndpoint) DeepCopy() *PeerEndpoint {
	if in == nil {
		return nil
	}
	out := new(PeerEndpoint)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *PeerSpec) DeepCopyInto(out *PeerSpec) {
	*out = *in
	if in.AllowedIPs != nil {
		out.AllowedIPs = make([]string, len(in.AllowedIPs))
		copy(out.AllowedIPs, in.AllowedIPs)
	}
	out.Endpoint = in.Endpoint.DeepCopy()
}

// DeepCopy returns a copy of in.
func (in *PeerSpec) DeepCopy() *PeerSpec {
	if in == nil {
		return nil
	}
	out := new(PeerSpec)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies in into out.
func (in *Peer) DeepCopyInto(out *Peer) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
}

// DeepCopy returns a copy of in.
func (in *Peer) DeepCopy() *Peer {
	if in == nil {
		return nil
	}
	out := new(Peer)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *Peer) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies in into out.
func (in *PeerList) DeepCopyInto(out *PeerList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Peer, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of in.
func (in *PeerList) DeepCopy() *PeerList {
	if in == nil {
		return nil
	}
	out := new(PeerList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *PeerList) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}
