package kilo

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// KindPeer is the ObjectRef kind of rejections about Peers.
const KindPeer = "Peer"

// PeerToTopology validates a Peer of cluster ("" = local) with the default
// limits; see Limits.PeerToTopology.
func PeerToTopology(p *Peer, cluster string) (topology.Peer, []topology.Rejection, bool) {
	return DefaultLimits.PeerToTopology(p, cluster)
}

// PeerToTopology validates a Peer of cluster ("" = local) and converts it for
// the planner. An invalid spec yields ok = false and one Rejection per
// problem: the peer never reaches the planner half-valid (Kilo drops it
// silently; meshlet reports it and keeps every other peer).
//
// The meshlet.io/node-persistent-keepalive annotation is optional tuning on
// top of a valid spec, so a malformed annotation only rejects the annotation:
// the peer is still ok and falls back to spec.persistentKeepalive. Dropping
// the whole peer for a typo in a tuning knob would cut a working tunnel.
//
// A Peer with more than l.PeerAllowedIPs allowed IPs is rejected before
// they are parsed.
func (l Limits) PeerToTopology(p *Peer, cluster string) (peer topology.Peer, rejections []topology.Rejection, ok bool) {
	if p == nil {
		return topology.Peer{}, nil, false
	}
	ref := topology.ObjectRef{Kind: KindPeer, Cluster: cluster, Name: p.Name}
	if keys := operatorLabels(p); len(keys) > 0 {
		return topology.Peer{}, []topology.Rejection{operatorPeerRejection(p, ref, keys)}, false
	}
	out, rejections := l.convertPeerSpec(p.Name, &p.Spec, ref)
	if len(rejections) > 0 {
		return topology.Peer{}, rejections, false
	}
	out.Created = p.CreationTimestamp.Time
	if s, present := p.Annotations[topology.AnnotationNodePersistentKeepalive]; present {
		rules, err := ParseKeepaliveRules(s)
		if err != nil {
			rejections = append(rejections, topology.Rejection{Object: ref, Field: topology.AnnotationNodePersistentKeepalive,
				Reason: topology.ReasonInvalidAnnotation, Message: err.Error() + " (annotation ignored, spec.persistentKeepalive applies)"})
		}
		out.NodeKeepalive = rules
	}
	return out, rejections, true
}

// ValidatePeer returns the problems of p's spec; none means Kilo would accept
// it. The keepalive annotation is not part of it (see PeerToTopology).
func ValidatePeer(p *Peer, cluster string) []topology.Rejection {
	if p == nil {
		return nil
	}
	_, rejs := DefaultLimits.convertPeerSpec(p.Name, &p.Spec, topology.ObjectRef{Kind: KindPeer, Cluster: cluster, Name: p.Name})
	return rejs
}

func (l Limits) convertPeerSpec(name string, s *PeerSpec, ref topology.ObjectRef) (topology.Peer, []topology.Rejection) {
	var rejs []topology.Rejection
	reject := func(field string, reason topology.Reason, format string, args ...any) {
		rejs = append(rejs, topology.Rejection{Object: ref, Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	out := topology.Peer{Name: name}

	if len(s.AllowedIPs) == 0 {
		// Kilo treats such a Peer as not ready and leaves it out.
		reject("spec.allowedIPs", topology.ReasonInvalidPeer, "spec.allowedIPs is empty: the Peer is not configured")
	}
	if l.PeerAllowedIPs > 0 && len(s.AllowedIPs) > l.PeerAllowedIPs {
		// Not parsed: the count alone decides.
		rejs = append(rejs, limitRejection(ref, "spec.allowedIPs", l.PeerAllowedIPs, "max-peer-allowed-ips",
			"the Peer is not configured (its last accepted version, if any, stays in force)"))
		return topology.Peer{}, rejs
	}
	seen := make(map[netip.Prefix]bool, len(s.AllowedIPs))
	invalid := 0
	for i, a := range s.AllowedIPs {
		p, err := netip.ParsePrefix(a)
		if err == nil && p.Addr().Is4In6() {
			err = fmt.Errorf("IPv4-mapped IPv6 address")
		}
		if err != nil {
			// The first few are listed, one rejection each; the count of
			// the rest in one more.
			if invalid++; invalid <= maxListed {
				reject(fmt.Sprintf("spec.allowedIPs[%d]", i), topology.ReasonInvalidCIDR, "invalid CIDR %s: %v", quote(a), err)
			}
			continue
		}
		// Masked: Kilo passes host bits on (10.5.0.1/24), which the kernel
		// refuses as a route (docs/kilo-compatibility.md).
		if p = p.Masked(); !seen[p] {
			seen[p] = true
			out.AllowedIPs = append(out.AllowedIPs, p)
		}
	}
	if invalid > maxListed {
		reject("spec.allowedIPs", topology.ReasonInvalidCIDR, "%d more invalid CIDRs", invalid-maxListed)
	}

	if e := s.Endpoint; e != nil {
		ep, err := peerEndpoint(e)
		if err != nil {
			reject("spec.endpoint", topology.ReasonInvalidEndpoint, "%v", err)
		}
		out.Endpoint = ep
	}

	if s.PersistentKeepalive < 0 || s.PersistentKeepalive > maxKeepalive {
		reject("spec.persistentKeepalive", topology.ReasonInvalidPeer, "persistentKeepalive %d out of range 0-%d", s.PersistentKeepalive, maxKeepalive)
	}
	out.PersistentKeepalive = s.PersistentKeepalive

	if s.PublicKey == "" {
		reject("spec.publicKey", topology.ReasonNoPublicKey, "spec.publicKey is required")
	} else if k, err := topology.ParseKey(s.PublicKey); err != nil {
		reject("spec.publicKey", topology.ReasonInvalidKey, "public key %s: %v", quote(s.PublicKey), err)
	} else {
		out.PublicKey = k
	}
	if s.PresharedKey != "" {
		if k, err := topology.ParseKey(s.PresharedKey); err != nil {
			// The PSK is secret: never echo it.
			reject("spec.presharedKey", topology.ReasonInvalidKey, "preshared key: %v", err)
		} else {
			out.PresharedKey = &k
		}
	}
	if len(rejs) > 0 {
		return topology.Peer{}, rejs
	}
	return out, nil
}

// peerEndpoint validates Kilo's nested endpoint and formats it as host:port;
// the DNS name wins when both are set (Kilo 0.7), but both must be valid.
func peerEndpoint(e *PeerEndpoint) (string, error) {
	if e.Port < 1 || e.Port > 65535 {
		return "", fmt.Errorf("endpoint port %d out of range 1-65535", e.Port)
	}
	d := e.DNSOrIP
	if d.DNS == "" && d.IP == "" {
		return "", fmt.Errorf("endpoint.dnsOrIP needs dns or ip")
	}
	var ip netip.Addr
	if d.IP != "" {
		var err error
		if ip, err = netip.ParseAddr(d.IP); err != nil || ip.Zone() != "" {
			return "", fmt.Errorf("endpoint.dnsOrIP.ip %s is not an IP address", quote(d.IP))
		}
		ip = ip.Unmap()
	}
	host := ip.String()
	if d.DNS != "" {
		if errs := validation.IsDNS1123Subdomain(d.DNS); len(errs) > 0 {
			return "", fmt.Errorf("endpoint.dnsOrIP.dns %s: %s", quote(d.DNS), strings.Join(errs, "; "))
		}
		host = d.DNS
	}
	return net.JoinHostPort(host, strconv.Itoa(e.Port)), nil
}

// keepaliveRule is the JSON form of one meshlet.io/node-persistent-keepalive
// entry.
type keepaliveRule struct {
	Value        *int              `json:"value"`
	Location     string            `json:"location,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitzero"` // omitzero: {} (every node) must survive a round trip
}

// ParseKeepaliveRules parses a Peer's meshlet.io/node-persistent-keepalive
// annotation: a JSON list of {"value": N, "location": "..."} or {"value": N,
// "nodeSelector": {labels}}, first match wins. Each entry needs a value
// 0–65535 (0 turns keepalive off for those nodes) and exactly one of location
// and nodeSelector ({} selects every node). Unknown fields are errors, so a
// typo such as "nodeselector" is reported instead of matching every node.
// The annotation is one unit: any bad entry rejects all of it, because
// dropping one entry would silently change which later entry matches.
func ParseKeepaliveRules(s string) ([]topology.KeepaliveRule, error) {
	const key = topology.AnnotationNodePersistentKeepalive
	// Decode the entries as raw objects first: encoding/json matches field
	// names case-insensitively, and "nodeselector" must be an error, not a
	// match.
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("%s is not a JSON list of keepalive rules: %w", key, err)
	}
	var out []topology.KeepaliveRule
	for i, obj := range raw {
		var r keepaliveRule
		for f, v := range obj {
			var err error
			switch f {
			case "value":
				err = json.Unmarshal(v, &r.Value)
			case "location":
				err = json.Unmarshal(v, &r.Location)
			case "nodeSelector":
				err = json.Unmarshal(v, &r.NodeSelector)
			default:
				err = fmt.Errorf("unknown field %s", quote(f))
			}
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %s: %w", key, i, f, err)
			}
		}
		switch {
		case r.Value == nil:
			return nil, fmt.Errorf("%s[%d]: value is required", key, i)
		case *r.Value < 0 || *r.Value > maxKeepalive:
			return nil, fmt.Errorf("%s[%d]: value %d out of range 0-%d", key, i, *r.Value, maxKeepalive)
		case (r.Location != "") == (r.NodeSelector != nil):
			return nil, fmt.Errorf("%s[%d]: needs exactly one of location and nodeSelector", key, i)
		}
		out = append(out, topology.KeepaliveRule{Value: *r.Value, Location: r.Location, NodeSelector: r.NodeSelector})
	}
	return out, nil
}

// FormatKeepaliveRules formats rules as the meshlet.io/node-persistent-keepalive
// annotation.
func FormatKeepaliveRules(rules []topology.KeepaliveRule) string {
	raw := make([]keepaliveRule, 0, len(rules))
	for _, r := range rules {
		v := r.Value
		kr := keepaliveRule{Value: &v, Location: r.Location, NodeSelector: r.NodeSelector}
		if r.Location == "" && kr.NodeSelector == nil {
			kr.NodeSelector = map[string]string{}
		}
		raw = append(raw, kr)
	}
	b, _ := json.Marshal(raw) // ints, strings and string maps cannot fail
	return string(b)
}
