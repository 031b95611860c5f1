package wg

import (
	"bytes"
	"net"
	"net/netip"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Peer fields named in PeerChange.Fields.
const (
	FieldEndpoint     = "endpoint"
	FieldKeepalive    = "keepalive"
	FieldAllowedIPs   = "allowed-ips"
	FieldPresharedKey = "preshared-key"
)

// ResolvedPeer is a desired peer whose "host:port" endpoint the actuator has
// already resolved, so Diff stays free of I/O.
type ResolvedPeer struct {
	PeerSpec
	// Addr is the resolved endpoint; nil when the plan has none or it could
	// not be resolved (then ResolveErr says why).
	Addr       *net.UDPAddr
	ResolveErr error
}

// DiffInput is everything Diff compares against the device.
type DiffInput struct {
	PrivateKey wgtypes.Key
	ListenPort int // 0 = leave as is
	Peers      []ResolvedPeer
	// LastEndpoints holds, per peer, the configured endpoint string this
	// process applied last. It is nil/empty after a restart: then a roaming
	// peer's existing endpoint is never overwritten.
	LastEndpoints map[wgtypes.Key]string
	// Names labels removed peers in the report (the plan no longer has them).
	Names map[wgtypes.Key]string
}

// PeerChange names one peer in a Report.
type PeerChange struct {
	Name      string      `json:"name,omitempty"`
	PublicKey wgtypes.Key `json:"publicKey"`
	// Fields lists what changed for an updated peer.
	Fields []string `json:"fields,omitempty"`
}

// UnresolvedEndpoint is a desired endpoint that could not be resolved; the
// peer is still configured, only its endpoint is left alone.
type UnresolvedEndpoint struct {
	Name      string      `json:"name,omitempty"`
	PublicKey wgtypes.Key `json:"publicKey"`
	Endpoint  string      `json:"endpoint"`
	Error     string      `json:"error"`
}

// Report says what an Apply changed on the device (for logs and metrics).
// It never contains the private key.
type Report struct {
	Interface  string       `json:"interface"`
	Added      []PeerChange `json:"added,omitempty"`
	Updated    []PeerChange `json:"updated,omitempty"`
	Removed    []PeerChange `json:"removed,omitempty"`
	ListenPort bool         `json:"listenPortChanged,omitempty"`
	PrivateKey bool         `json:"privateKeyChanged,omitempty"`
	// KeptEndpoints are roaming peers whose learned endpoint differs from the
	// plan's and was deliberately kept.
	KeptEndpoints []PeerChange         `json:"keptEndpoints,omitempty"`
	Unresolved    []UnresolvedEndpoint `json:"unresolved,omitempty"`
}

// PeersTouched is the number of peers the apply sent to the device.
func (r Report) PeersTouched() int { return len(r.Added) + len(r.Updated) + len(r.Removed) }

// Counts is how many objects the apply changed, by kind ("peer", "device"),
// in the form every actuator reports (meshlet_dataplane_changes_total).
func (r Report) Counts() map[string]int {
	c := map[string]int{"peer": r.PeersTouched()}
	if r.ListenPort || r.PrivateKey {
		c["device"] = 1
	}
	return c
}

// Changed reports whether the device was changed at all.
func (r Report) Changed() bool { return r.PeersTouched() > 0 || r.ListenPort || r.PrivateKey }

// Diff computes the minimal configuration that turns the device cur into the
// desired state, and the report of it. It is pure: no I/O, no clock.
//
// Rules (docs/architecture.md, "Applying WireGuard"): peers missing on the
// device are added, peers absent from the plan are removed, the others get
// UpdateOnly with only their changed fields; ReplaceAllowedIPs is set only
// when the allowed IPs changed, ReplacePeers never. Untouched peers do not
// appear in the config, so their sessions survive.
func Diff(in DiffInput, cur *wgtypes.Device) (wgtypes.Config, Report) {
	var cfg wgtypes.Config
	var rep Report
	if cur == nil {
		cur = &wgtypes.Device{}
	}
	rep.Interface = cur.Name

	if in.PrivateKey != (wgtypes.Key{}) && in.PrivateKey != cur.PrivateKey {
		k := in.PrivateKey
		cfg.PrivateKey = &k
		rep.PrivateKey = true
	}
	if in.ListenPort != 0 && in.ListenPort != cur.ListenPort {
		p := in.ListenPort
		cfg.ListenPort = &p
		rep.ListenPort = true
	}

	current := make(map[wgtypes.Key]*wgtypes.Peer, len(cur.Peers))
	for i := range cur.Peers {
		current[cur.Peers[i].PublicKey] = &cur.Peers[i]
	}
	seen := make(map[wgtypes.Key]bool, len(in.Peers))

	for _, d := range in.Peers {
		key := d.PublicKey
		if seen[key] {
			continue // the planner rejects duplicates; be safe anyway
		}
		seen[key] = true
		if d.ResolveErr != nil {
			rep.Unresolved = append(rep.Unresolved, UnresolvedEndpoint{
				Name: d.Name, PublicKey: d.PublicKey, Endpoint: d.Endpoint, Error: d.ResolveErr.Error(),
			})
		}
		c, ok := current[key]
		if !ok {
			cfg.Peers = append(cfg.Peers, newPeerConfig(d))
			rep.Added = append(rep.Added, PeerChange{Name: d.Name, PublicKey: d.PublicKey})
			continue
		}

		pc, fields, kept := updatePeer(d, c, in.LastEndpoints)
		if kept {
			rep.KeptEndpoints = append(rep.KeptEndpoints, PeerChange{Name: d.Name, PublicKey: d.PublicKey})
		}
		if len(fields) > 0 {
			cfg.Peers = append(cfg.Peers, pc)
			rep.Updated = append(rep.Updated, PeerChange{Name: d.Name, PublicKey: d.PublicKey, Fields: fields})
		}
	}

	// Removals in device order, which is stable for a given device.
	for i := range cur.Peers {
		p := &cur.Peers[i]
		if seen[p.PublicKey] {
			continue
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: p.PublicKey, Remove: true})
		rep.Removed = append(rep.Removed, PeerChange{Name: in.Names[p.PublicKey], PublicKey: p.PublicKey})
	}
	return cfg, rep
}

// updatePeer is the configuration that turns the device's peer c into d:
// only the fields that differ (their names in fields); kept reports a
// roaming peer's learned endpoint deliberately left in place.
func updatePeer(d ResolvedPeer, c *wgtypes.Peer, last map[wgtypes.Key]string) (pc wgtypes.PeerConfig, fields []string, kept bool) {
	pc = wgtypes.PeerConfig{PublicKey: d.PublicKey, UpdateOnly: true}
	if d.Addr != nil && !sameUDPAddr(d.Addr, c.Endpoint) {
		if overwriteEndpoint(d, c, last) {
			pc.Endpoint = d.Addr
			fields = append(fields, FieldEndpoint)
		} else {
			kept = true
		}
	}
	if keepalive := d.PersistentKeepalive; keepalive != c.PersistentKeepaliveInterval {
		pc.PersistentKeepaliveInterval = &keepalive
		fields = append(fields, FieldKeepalive)
	}
	if !samePrefixes(d.AllowedIPs, c.AllowedIPs) {
		pc.ReplaceAllowedIPs = true
		pc.AllowedIPs = toIPNets(d.AllowedIPs)
		fields = append(fields, FieldAllowedIPs)
	}
	var wantPSK wgtypes.Key
	if d.PresharedKey != nil {
		wantPSK = *d.PresharedKey
	}
	if wantPSK != c.PresharedKey {
		pc.PresharedKey = &wantPSK // the zero key removes it
		fields = append(fields, FieldPresharedKey)
	}
	return pc, fields, kept
}

// newPeerConfig is the configuration that adds peer d.
func newPeerConfig(d ResolvedPeer) wgtypes.PeerConfig {
	pc := wgtypes.PeerConfig{
		PublicKey:         d.PublicKey,
		Endpoint:          d.Addr,
		ReplaceAllowedIPs: true,
		AllowedIPs:        toIPNets(d.AllowedIPs),
	}
	if d.PersistentKeepalive > 0 {
		keepalive := d.PersistentKeepalive
		pc.PersistentKeepaliveInterval = &keepalive
	}
	if d.PresharedKey != nil {
		psk := *d.PresharedKey
		pc.PresharedKey = &psk
	}
	return pc
}

// overwriteEndpoint decides whether the plan's endpoint may replace the one
// on the device. WireGuard updates a peer's endpoint to the source of its
// latest authenticated packet; for a peer behind NAT that learned address is
// the only one that works, so writing the configured one back would cut it
// off. Therefore a roaming peer that already has an endpoint keeps it, unless
// the operator changed the configured endpoint since this process last
// applied it (a deliberate move). After a restart there is no memory, and the
// learned endpoint wins.
func overwriteEndpoint(d ResolvedPeer, c *wgtypes.Peer, last map[wgtypes.Key]string) bool {
	if !d.Roaming || c.Endpoint == nil {
		return true
	}
	prev, ok := last[d.PublicKey]
	return ok && prev != d.Endpoint
}

func sameUDPAddr(a, b *net.UDPAddr) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Port == b.Port && a.IP.Equal(b.IP)
}

func toIPNets(ps []netip.Prefix) []net.IPNet {
	out := make([]net.IPNet, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		bits := 32
		if p.Addr().Is6() {
			bits = 128
		}
		out = append(out, net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)})
	}
	return out
}

// prefixFromIPNet converts a device allowed IP; IPv4 may come back as a
// 16-byte IP, which must compare equal to the plan's 4-byte form.
func prefixFromIPNet(n net.IPNet) (netip.Prefix, bool) {
	ones, bits := n.Mask.Size()
	ip := n.IP
	if bits == 32 {
		ip = ip.To4()
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok || (bits != 32 && bits != 128) {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

func samePrefixes(want []netip.Prefix, have []net.IPNet) bool {
	a := make([]netip.Prefix, 0, len(want))
	for _, p := range want {
		a = append(a, p.Masked())
	}
	b := make([]netip.Prefix, 0, len(have))
	for _, n := range have {
		p, ok := prefixFromIPNet(n)
		if !ok {
			return false
		}
		b = append(b, p)
	}
	cmp := func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	}
	slices.SortFunc(a, cmp)
	slices.SortFunc(b, cmp)
	a = slices.Compact(a)
	b = slices.Compact(b)
	return slices.Equal(a, b)
}

// keyLess orders keys for deterministic output.
func keyLess(a, b wgtypes.Key) int { return bytes.Compare(a[:], b[:]) }
