package wg

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"time"

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
	// literal: Endpoint is an address, so Addr is reused while the
	// endpoint does not change (no parse, no lookup).
	literal bool
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
	// plan's and was deliberately kept. Only an apply that read the device
	// knows them (Diff); one against meshlet's memory (diffApplied) does not.
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

		pc, fields, kept, _ := updatePeer(&d, onDevice(c), in.LastEndpoints)
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

// peerState is a peer as a diff knows it: read from the device (onDevice)
// or as meshlet last wrote it (inMemory). updatePeer, the one per-peer
// rule, compares a planned peer with either.
type peerState struct {
	endpoint *net.UDPAddr
	// learned: the device may hold an endpoint WireGuard learned that this
	// state does not show (a peer written roaming or without an endpoint,
	// known from memory); read: the state is a device read.
	learned, read bool
	keepalive     time.Duration
	allowedIPs    []netip.Prefix
	// badAllowedIP: the device holds an allowed IP that is no prefix.
	badAllowedIP bool
	psk          wgtypes.Key
}

// onDevice is the device's peer c.
func onDevice(c *wgtypes.Peer) peerState {
	h := peerState{endpoint: c.Endpoint, read: true, keepalive: c.PersistentKeepaliveInterval, psk: c.PresharedKey,
		allowedIPs: make([]netip.Prefix, 0, len(c.AllowedIPs))}
	for _, n := range c.AllowedIPs {
		p, ok := prefixFromIPNet(n)
		h.badAllowedIP = h.badAllowedIP || !ok
		h.allowedIPs = append(h.allowedIPs, p)
	}
	return h
}

// inMemory is peer p as meshlet last wrote it.
func inMemory(p *appliedPeer) peerState {
	return peerState{endpoint: p.Addr, learned: p.Roaming || p.Addr == nil, keepalive: p.PersistentKeepalive,
		allowedIPs: p.AllowedIPs, psk: pskOf(p.PresharedKey)}
}

// updatePeer is the configuration that turns peer h into d: only the
// fields that differ (their names in fields). kept reports a roaming
// peer's endpoint deliberately left in place (known only from a device
// read); needRead, that memory cannot decide and the device must be read.
func updatePeer(d *ResolvedPeer, h peerState, last map[wgtypes.Key]string) (pc wgtypes.PeerConfig, fields []string, kept, needRead bool) {
	pc = wgtypes.PeerConfig{PublicKey: d.PublicKey, UpdateOnly: true}
	write, kept, needRead := writeEndpoint(d, h, last)
	if needRead {
		return pc, nil, false, true
	}
	if write {
		pc.Endpoint = d.Addr
		fields = append(fields, FieldEndpoint)
	}
	if d.PersistentKeepalive != h.keepalive {
		keepalive := d.PersistentKeepalive
		pc.PersistentKeepaliveInterval = &keepalive
		fields = append(fields, FieldKeepalive)
	}
	if h.badAllowedIP || !slices.Equal(d.AllowedIPs, h.allowedIPs) && !slices.Equal(canonical(d.AllowedIPs), canonical(h.allowedIPs)) {
		pc.ReplaceAllowedIPs = true
		pc.AllowedIPs = toIPNets(d.AllowedIPs)
		fields = append(fields, FieldAllowedIPs)
	}
	if want := pskOf(d.PresharedKey); want != h.psk {
		pc.PresharedKey = &want // the zero key removes it
		fields = append(fields, FieldPresharedKey)
	}
	return pc, fields, kept, false
}

// writeEndpoint decides whether the plan's endpoint may replace the one
// on the device. WireGuard updates a peer's endpoint to the source of its
// latest authenticated packet; for a peer behind NAT that learned address
// is the only one that works, so writing the configured one back would
// cut it off. Therefore a roaming peer that already has an endpoint keeps
// it, unless the operator changed the configured endpoint since this
// process last applied it (a deliberate move). After a restart there is no
// memory, and the learned endpoint wins; memory alone cannot tell whether
// there is one (needRead). A non-roaming peer gets the plan's endpoint
// whenever it may differ. An endpoint WireGuard moved is not seen in
// memory; the watch's device read finds it as drift.
func writeEndpoint(d *ResolvedPeer, h peerState, last map[wgtypes.Key]string) (write, kept, needRead bool) {
	switch {
	case d.Addr == nil, !h.learned && sameUDPAddr(d.Addr, h.endpoint):
		return false, false, false
	case !d.Roaming, !h.learned && h.endpoint == nil:
		return true, false, false
	}
	prev, ok := last[d.PublicKey]
	switch {
	case ok && prev != d.Endpoint:
		return true, false, false
	case !ok && h.learned:
		return false, false, true
	}
	return false, h.read, false
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

// keyLess orders keys for deterministic output.
func keyLess(a, b wgtypes.Key) int { return bytes.Compare(a[:], b[:]) }

// appliedState is what meshlet last wrote to the device, kept in memory so
// that an apply costs what it changes: diffApplied compares the plan with
// it, without reading the device (docs/architecture.md, "Applying
// WireGuard").
type appliedState struct {
	privateKey wgtypes.Key
	listenPort int
	peers      map[wgtypes.Key]*appliedPeer
	// order is a cache of peers by their position in the last plan
	// (lookup): plans keep their order from apply to apply, so a lookup by
	// position is a pointer and a key compare where the map costs a hash
	// and a probe — what made a one-peer apply grow with the device's size
	// (docs/performance.md#apply). A slot may be stale (nil, another key, a
	// removed peer); lookup then falls back to the map and diffApplied
	// writes the slot.
	order []*appliedPeer
	// probes counts the peers with a SessionProbe (the watch reads their
	// counters only while there are any).
	probes int
	// epoch numbers diffApplied's passes; a peer's seen is the last pass
	// that planned it, so duplicates and removals are found without
	// building a set of the plan's keys.
	epoch uint64
}

// appliedPeer is one peer as last written. Addr is the endpoint written
// (nil: none yet); Endpoint is the plan's string it came from.
type appliedPeer struct {
	ResolvedPeer
	seen    uint64
	removed bool // gone from peers; a stale order slot may still hold it
}

// newApplied records in as written to a device whose listen port is port
// when the plan leaves it alone (ListenPort 0).
func newApplied(in DiffInput, port int) *appliedState {
	a := &appliedState{privateKey: in.PrivateKey, listenPort: port, peers: make(map[wgtypes.Key]*appliedPeer, len(in.Peers))}
	if in.ListenPort != 0 {
		a.listenPort = in.ListenPort
	}
	a.order = make([]*appliedPeer, len(in.Peers))
	for i, p := range in.Peers {
		a.set(p)
		a.order[i] = a.peers[p.PublicKey]
	}
	return a
}

// lookup is the peer applied as key (nil: none), where the last plan had
// it at position i or elsewhere.
func (a *appliedState) lookup(i int, key wgtypes.Key) *appliedPeer {
	if i < len(a.order) {
		if p := a.order[i]; p != nil && !p.removed && sameKey(&p.PublicKey, &key) {
			return p
		}
	}
	return a.peers[key]
}

// set records peer p as written. A peer whose endpoint did not resolve
// keeps the endpoint written before (the device still has it).
func (a *appliedState) set(p ResolvedPeer) {
	prev := a.peers[p.PublicKey]
	if prev == nil {
		prev = &appliedPeer{}
		a.peers[p.PublicKey] = prev
	} else if prev.SessionProbe.IsValid() {
		a.probes--
	}
	if p.ResolveErr != nil {
		p.Addr, p.Endpoint, p.literal = prev.Addr, prev.Endpoint, prev.literal
	}
	if p.SessionProbe.IsValid() {
		a.probes++
	}
	prev.ResolvedPeer = p
}

func (a *appliedState) remove(k wgtypes.Key) {
	if prev, ok := a.peers[k]; ok {
		if prev.SessionProbe.IsValid() {
			a.probes--
		}
		prev.removed = true
		delete(a.peers, k)
	}
}

// sameKey is a == b as four word compares: the compiler calls memequal
// for a 32-byte array, which costs a one-peer apply a tenth of its
// per-peer time on a large device (docs/performance.md#apply).
func sameKey(a, b *wgtypes.Key) bool {
	le := binary.LittleEndian
	return le.Uint64(a[0:]) == le.Uint64(b[0:]) && le.Uint64(a[8:]) == le.Uint64(b[8:]) &&
		le.Uint64(a[16:]) == le.Uint64(b[16:]) && le.Uint64(a[24:]) == le.Uint64(b[24:])
}

// input is the applied state as a DiffInput, to compare a device read with
// (drift) by the same rules as an apply.
func (a *appliedState) input(last, names map[wgtypes.Key]string) DiffInput {
	in := DiffInput{PrivateKey: a.privateKey, ListenPort: a.listenPort, LastEndpoints: last, Names: names,
		Peers: make([]ResolvedPeer, 0, len(a.peers))}
	for _, p := range a.peers {
		in.Peers = append(in.Peers, p.ResolvedPeer)
	}
	return in
}

// planInput is a plan as diffApplied takes it: the planned peers as the
// caller gave them, and how to resolve one. Resolve is called only for
// the peers that are not settled (settled), so an apply resolves and
// copies what changed, whatever the size of the device.
type planInput struct {
	PrivateKey    wgtypes.Key
	ListenPort    int // 0 = leave as is
	Peers         []PeerSpec
	LastEndpoints map[wgtypes.Key]string
	// Resolve resolves p's endpoint; prev is p as applied (nil: new).
	Resolve func(p PeerSpec, prev *appliedPeer) ResolvedPeer
}

// appliedDiff is the result of diffApplied.
type appliedDiff struct {
	cfg wgtypes.Config
	rep Report
	// changed are the planned peers, resolved, that differ in any way
	// from what was applied (new ones too): only they need remembering.
	changed []ResolvedPeer
	// needRead: the memory cannot decide, read the device (Diff).
	needRead bool
}

// diffApplied is Diff against what meshlet last applied instead of a device
// read, by the same per-peer rule (updatePeer on inMemory): what only the
// device knows — a learned endpoint of a roaming peer with no memory of its
// configured one — sets needRead.
//
// It does no I/O but in.Resolve, and costs a lookup and a comparison per
// planned peer; nothing is copied or allocated for a peer that is settled.
// It only advances a's pass marks.
func diffApplied(in planInput, a *appliedState) appliedDiff {
	var r appliedDiff
	if in.PrivateKey != (wgtypes.Key{}) && in.PrivateKey != a.privateKey {
		k := in.PrivateKey
		r.cfg.PrivateKey = &k
		r.rep.PrivateKey = true
	}
	if in.ListenPort != 0 && in.ListenPort != a.listenPort {
		p := in.ListenPort
		r.cfg.ListenPort = &p
		r.rep.ListenPort = true
	}
	a.epoch++
	planned := 0
	var added map[wgtypes.Key]bool
	if len(a.order) != len(in.Peers) {
		a.order = slices.Grow(a.order[:0], len(in.Peers))[:len(in.Peers)]
	}
	for i := range in.Peers {
		s := &in.Peers[i]
		key := s.PublicKey
		prev := a.lookup(i, key)
		a.order[i] = prev
		switch {
		case prev != nil && prev.seen == a.epoch, prev == nil && added[key]:
			continue // the planner rejects duplicates; be safe anyway
		case prev != nil:
			prev.seen = a.epoch
			planned++
			if settled(s, prev) {
				continue
			}
		}
		d := in.Resolve(*s, prev)
		if d.ResolveErr != nil {
			r.rep.Unresolved = append(r.rep.Unresolved, UnresolvedEndpoint{
				Name: d.Name, PublicKey: key, Endpoint: d.Endpoint, Error: d.ResolveErr.Error(),
			})
		}
		if prev == nil {
			if added == nil {
				added = map[wgtypes.Key]bool{}
			}
			added[key] = true
			r.changed = append(r.changed, d)
			r.cfg.Peers = append(r.cfg.Peers, newPeerConfig(d))
			r.rep.Added = append(r.rep.Added, PeerChange{Name: d.Name, PublicKey: key})
			continue
		}
		if sameSpec(&d, prev) {
			continue
		}
		r.changed = append(r.changed, d)
		pc, fields, _, read := updatePeer(&d, inMemory(prev), in.LastEndpoints)
		if read {
			return appliedDiff{needRead: true}
		}
		if len(fields) > 0 {
			r.cfg.Peers = append(r.cfg.Peers, pc)
			r.rep.Updated = append(r.rep.Updated, PeerChange{Name: d.Name, PublicKey: key, Fields: fields})
		}
	}
	if planned < len(a.peers) {
		var gone []wgtypes.Key
		for k, p := range a.peers {
			if p.seen != a.epoch {
				gone = append(gone, k)
			}
		}
		slices.SortFunc(gone, keyLess)
		for _, k := range gone {
			r.cfg.Peers = append(r.cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
			r.rep.Removed = append(r.rep.Removed, PeerChange{Name: a.peers[k].Name, PublicKey: k})
		}
	}
	return r
}

// settled reports whether s, as planned, is what was applied as p with
// nothing to resolve: its endpoint is none or the same literal address,
// and the last resolution did not fail. Then sameSpec would hold after
// resolving, so s is neither resolved nor copied.
func settled(s *PeerSpec, p *appliedPeer) bool {
	return p.ResolveErr == nil && (s.Endpoint == "" || p.literal) && s.Endpoint == p.Endpoint && s.Name == p.Name &&
		s.PersistentKeepalive == p.PersistentKeepalive && s.Roaming == p.Roaming &&
		s.SessionProbe == p.SessionProbe && samePSK(s.PresharedKey, p.PresharedKey) &&
		slices.Equal(s.AllowedIPs, p.AllowedIPs)
}

// sameSpec reports whether d is exactly what was applied as p: then
// nothing is to be written nor remembered.
func sameSpec(d *ResolvedPeer, p *appliedPeer) bool {
	return d.ResolveErr == nil && p.ResolveErr == nil && d.Name == p.Name && d.Endpoint == p.Endpoint &&
		sameUDPAddr(d.Addr, p.Addr) && d.PersistentKeepalive == p.PersistentKeepalive && d.Roaming == p.Roaming &&
		d.SessionProbe == p.SessionProbe && samePSK(d.PresharedKey, p.PresharedKey) &&
		slices.Equal(d.AllowedIPs, p.AllowedIPs)
}

// samePSK compares two preshared keys, nil being the zero key. Most peers
// have none: two nils are equal without comparing 64 bytes (a one-peer
// apply compares every planned peer's, docs/performance.md#apply).
func samePSK(a, b *wgtypes.Key) bool {
	if a == b {
		return true
	}
	return pskOf(a) == pskOf(b)
}

func pskOf(k *wgtypes.Key) wgtypes.Key {
	if k == nil {
		return wgtypes.Key{}
	}
	return *k
}

// canonical is a prefix list as a set: masked, sorted, without repeats.
func canonical(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

func comparePrefix(x, y netip.Prefix) int {
	if c := x.Addr().Compare(y.Addr()); c != 0 {
		return c
	}
	return x.Bits() - y.Bits()
}
