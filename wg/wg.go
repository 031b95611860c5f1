// Package wg is meshlet's WireGuard actuator: it ensures the device exists
// (kernel or in-process userspace WireGuard) and reconciles its peers with the
// plan through wgctrl, changing only what differs so established sessions
// survive every apply.
//
// Typical use by the agent (netlinkx handles MTU, addresses and link state):
//
//	key, _, err := wg.LoadOrCreateKey(wg.DefaultKeyPath)
//	dev, err := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: "kilo0", Mode: wg.ModeAuto})
//	defer dev.Close()
//	client, err := wgctrl.New()
//	m, err := wg.NewManager(wg.Config{Interface: "kilo0", PrivateKey: key, Client: client})
//	rep, err := m.Apply(ctx, plan.WireGuard) // on every reconcile
//	stats, err := m.Stats(ctx)               // at scrape time
//
// The device and the wgctrl client live in the agent's own network namespace
// (hostNetwork). An in-process userspace device cannot live in another
// namespace: wireguard-go opens its UDP sockets from arbitrary goroutines.
// Tests therefore run each device in a child process (see
// integration_test.go).
package wg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"k8s.io/utils/clock"
)

// Client is the part of *wgctrl.Client the actuator uses; tests inject fakes.
type Client interface {
	Device(name string) (*wgtypes.Device, error)
	ConfigureDevice(name string, cfg wgtypes.Config) error
}

// Resolver resolves endpoint host names; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// PeerStats is one peer as the device reports it, for metrics.
type PeerStats struct {
	PublicKey wgtypes.Key
	// Endpoint is the current (possibly learned) endpoint; zero = none.
	Endpoint netip.AddrPort
	// LastHandshake is zero when the peer never completed a handshake.
	LastHandshake       time.Time
	ReceiveBytes        int64
	TransmitBytes       int64
	PersistentKeepalive time.Duration
	AllowedIPs          []netip.Prefix
}

// DeviceStats is the device as read at one moment.
type DeviceStats struct {
	Interface  string
	Type       string // "Linux kernel" or "userspace"
	PublicKey  wgtypes.Key
	ListenPort int
	Peers      []PeerStats // sorted by public key
}

// Config configures a Manager.
type Config struct {
	Interface  string      // the device name, e.g. kilo0
	PrivateKey wgtypes.Key // from LoadOrCreateKey
	Client     Client      // usually *wgctrl.Client
	Resolver   Resolver    // nil = net.DefaultResolver
	Logger     *slog.Logger
}

// Manager applies desired devices to one WireGuard interface. It is safe for
// concurrent use; applies are serialised.
type Manager struct {
	iface    string
	key      wgtypes.Key
	client   Client
	resolver Resolver
	log      *slog.Logger

	mu sync.Mutex
	// lastEndpoints is the configured endpoint string last applied per peer
	// (the roaming rule needs to know whether the operator changed it).
	lastEndpoints map[wgtypes.Key]string
	// names remembers peer names so removals can be reported by name.
	names map[wgtypes.Key]string
	// applied is what this process last wrote to the device: applies are
	// diffed against it, and the watch compares device reads with it. nil
	// before the first apply.
	applied *appliedState
	// stale: the device may differ from applied (drift seen, a write
	// failed); the next apply reads the device and diffs against it.
	stale bool
	// changed wakes the watch when an apply changed what it watches.
	changed chan struct{}
	// resolved is resolve's buffer.
	resolved []ResolvedPeer
	// subscribeFn replaces subscribeChanges in tests.
	subscribeFn func() (*changeSub, error)
	// handshakes are the peers added since the last InitiateHandshakes that
	// WireGuard might not reach by itself (handshake.go).
	handshakes map[wgtypes.Key]struct{}
	// unresolved are the endpoints the last apply could not resolve,
	// under their own lock: `meshlet status` reads them while an apply
	// may be waiting on a slow name server.
	unresolvedMu sync.Mutex
	unresolved   []UnresolvedEndpoint
	// sessions is what the watch saw of the sessions under the half-dead
	// rule and what ActOnSessions did (session.go); probe and onRepair are
	// Watch's options for them.
	sessions sessionWatch
	probe    func(ctx context.Context, addr netip.Addr) error
	onRepair func(peer string)
	// writes counts this process's writes to the device twice, as they
	// begin and end (configure): a reading taken across or during one is
	// not offered to the watch. Atomic, so Stats never waits for mu.
	writes atomic.Uint64
	// offered wakes the watch for the reading Stats last took (offer.go).
	offered chan struct{}
	// offerMu guards offer and watchClock (never held with mu's work).
	offerMu sync.Mutex
	offer   *offer
	// watchClock stamps offered readings; nil until Watch runs (no offer
	// is kept before).
	watchClock clock.Clock
}

// NewManager returns a Manager for cfg.Interface.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Interface == "" {
		return nil, errors.New("wg: interface name is required")
	}
	if cfg.Client == nil {
		return nil, errors.New("wg: a wgctrl client is required")
	}
	if cfg.PrivateKey == (wgtypes.Key{}) {
		return nil, errors.New("wg: private key is required")
	}
	m := &Manager{
		iface:         cfg.Interface,
		key:           cfg.PrivateKey,
		client:        cfg.Client,
		resolver:      cfg.Resolver,
		log:           cfg.Logger,
		lastEndpoints: map[wgtypes.Key]string{},
		names:         map[wgtypes.Key]string{},
		changed:       make(chan struct{}, 1),
		offered:       make(chan struct{}, 1),
	}
	if m.resolver == nil {
		m.resolver = net.DefaultResolver
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	return m, nil
}

// PublicKey is the public key of the managed device's private key.
func (m *Manager) PublicKey() wgtypes.Key { return m.key.PublicKey() }

// Interface is the managed device's name.
func (m *Manager) Interface() string { return m.iface }

// Apply reconciles the device with desired and reports what it changed.
// It diffs desired against what it applied last (diffApplied), so a change
// costs what it changes whatever the size of the device; the device is read
// only on the first apply, after drift or a failed write, and when the
// memory cannot decide (see diffApplied).
func (m *Manager) Apply(ctx context.Context, desired DeviceSpec) (Report, error) {
	m.mu.Lock()
	defer m.mu.Unlock()

	var d appliedDiff
	read := m.applied == nil || m.stale
	if !read {
		// Only the peers that differ from what was applied are resolved
		// and copied (diffApplied): the rest cost a comparison each.
		d = diffApplied(planInput{PrivateKey: m.key, ListenPort: desired.ListenPort, Peers: desired.Peers,
			LastEndpoints: m.lastEndpoints, Resolve: func(p PeerSpec, prev *appliedPeer) ResolvedPeer {
				return m.resolvePeer(ctx, p, prev)
			}}, m.applied)
		read = d.needRead
	}
	var in DiffInput
	cfg, rep := d.cfg, d.rep
	port := 0
	if read {
		in = DiffInput{PrivateKey: m.key, ListenPort: desired.ListenPort, Peers: m.resolve(ctx, desired.Peers),
			LastEndpoints: m.lastEndpoints, Names: m.names}
		if err := ctx.Err(); err != nil {
			return Report{}, fmt.Errorf("wg: apply %s: %w", m.iface, err)
		}
		cur, err := m.client.Device(m.iface)
		if err != nil {
			return Report{}, fmt.Errorf("wg: read device %s: %w", m.iface, err)
		}
		cfg, rep = Diff(in, cur)
		port = cur.ListenPort
	} else if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("wg: apply %s: %w", m.iface, err)
	}
	m.unresolvedMu.Lock()
	m.unresolved = append(m.unresolved[:0], rep.Unresolved...)
	m.unresolvedMu.Unlock()
	rep.Interface = m.iface
	if rep.Changed() {
		if err := m.configure(cfg); err != nil {
			// What part of cfg reached the device is unknown: read it next time.
			m.stale = true
			return Report{}, fmt.Errorf("wg: configure device %s (%d peers): %w", m.iface, rep.PeersTouched(), err)
		}
	}
	if read {
		m.rememberRead(in, rep, port)
	} else {
		m.rememberChanged(desired.ListenPort, rep, d.changed)
	}
	m.noteHandshakes(rep.Added)

	if rep.Changed() {
		m.log.LogAttrs(ctx, slog.LevelInfo, "wireguard peers applied",
			slog.String("interface", m.iface),
			slog.Any("added", changeNames(rep.Added)),
			slog.Any("updated", changeNames(rep.Updated)),
			slog.Any("removed", changeNames(rep.Removed)),
			slog.Bool("listenPortChanged", rep.ListenPort),
			slog.Bool("privateKeyChanged", rep.PrivateKey),
			slog.Bool("deviceRead", read))
	}
	for _, u := range rep.Unresolved {
		m.log.LogAttrs(ctx, slog.LevelWarn, "wireguard endpoint not resolved; endpoint left unchanged",
			slog.String("interface", m.iface), slog.String("peer", u.Name),
			slog.String("endpoint", u.Endpoint), slog.String("error", u.Error))
	}
	return rep, nil
}

// rememberRead records a successful apply of in after a device read: the
// memory is rebuilt (the device had what it had). Peers whose endpoint did
// not resolve keep their endpoint memory, so a later successful resolution
// counts as a change only if the string changed.
func (m *Manager) rememberRead(in DiffInput, rep Report, port int) {
	probes := 0
	if m.applied != nil {
		probes = m.applied.probes
	}
	names := make(map[wgtypes.Key]string, len(in.Peers))
	last := make(map[wgtypes.Key]string, len(in.Peers))
	for _, p := range in.Peers {
		names[p.PublicKey] = p.Name
		if p.ResolveErr == nil {
			last[p.PublicKey] = p.Endpoint
		} else if prev, ok := m.lastEndpoints[p.PublicKey]; ok {
			last[p.PublicKey] = prev
		}
	}
	m.names, m.lastEndpoints = names, last
	m.applied, m.stale = newApplied(in, port), false
	m.wakeWatch(rep.Changed() || m.applied.probes != probes)
}

// rememberChanged records a successful apply against memory: only the
// changed peers are written over and the removed ones forgotten, so an
// apply costs nothing for the peers that did not change.
func (m *Manager) rememberChanged(listenPort int, rep Report, changed []ResolvedPeer) {
	probes := m.applied.probes
	for _, r := range rep.Removed {
		delete(m.names, r.PublicKey)
		delete(m.lastEndpoints, r.PublicKey)
		m.applied.remove(r.PublicKey)
	}
	for _, p := range changed {
		m.names[p.PublicKey] = p.Name
		if p.ResolveErr == nil {
			m.lastEndpoints[p.PublicKey] = p.Endpoint
		}
		m.applied.set(p)
	}
	m.applied.privateKey = m.key
	if listenPort != 0 {
		m.applied.listenPort = listenPort
	}
	m.wakeWatch(rep.Changed() || m.applied.probes != probes)
}

// wakeWatch wakes the watch when an apply changed what it watches (the
// device, or whether any peer is under the half-dead rule).
func (m *Manager) wakeWatch(changed bool) {
	if !changed {
		return
	}
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Unresolved returns the endpoints the last apply could not resolve
// (`meshlet status`).
func (m *Manager) Unresolved() []UnresolvedEndpoint {
	m.unresolvedMu.Lock()
	defer m.unresolvedMu.Unlock()
	return slices.Clone(m.unresolved)
}

// Stats reads the device for metrics and the health probes. The reading is
// offered to the watch, which uses it in place of a read of its own
// (offer.go).
func (m *Manager) Stats(ctx context.Context) (DeviceStats, error) {
	if err := ctx.Err(); err != nil {
		return DeviceStats{}, err
	}
	clk := m.offerClock()
	writes := m.writes.Load()
	var at time.Time
	if clk != nil {
		at = clk.Now()
	}
	d, err := m.client.Device(m.iface)
	if err != nil {
		return DeviceStats{}, fmt.Errorf("wg: read device %s: %w", m.iface, err)
	}
	if clk != nil {
		m.keepOffer(d, at, writes)
	}
	return StatsFromDevice(d), nil
}

// StatsFromDevice converts a wgctrl device into DeviceStats.
func StatsFromDevice(d *wgtypes.Device) DeviceStats {
	s := DeviceStats{
		Interface:  d.Name,
		Type:       d.Type.String(),
		PublicKey:  d.PublicKey,
		ListenPort: d.ListenPort,
		Peers:      make([]PeerStats, 0, len(d.Peers)),
	}
	for _, p := range d.Peers {
		ps := PeerStats{
			PublicKey:           p.PublicKey,
			ReceiveBytes:        p.ReceiveBytes,
			TransmitBytes:       p.TransmitBytes,
			PersistentKeepalive: p.PersistentKeepaliveInterval,
		}
		if p.Endpoint != nil {
			ps.Endpoint = p.Endpoint.AddrPort()
			ps.Endpoint = netip.AddrPortFrom(ps.Endpoint.Addr().Unmap(), ps.Endpoint.Port())
		}
		// wgctrl already returns the zero time for "never" on both backends;
		// normalise the Unix epoch too so nobody exports 1970.
		if !p.LastHandshakeTime.IsZero() && p.LastHandshakeTime.Unix() > 0 {
			ps.LastHandshake = p.LastHandshakeTime
		}
		for _, n := range p.AllowedIPs {
			if pr, ok := prefixFromIPNet(n); ok {
				ps.AllowedIPs = append(ps.AllowedIPs, pr)
			}
		}
		s.Peers = append(s.Peers, ps)
	}
	slices.SortFunc(s.Peers, func(a, b PeerStats) int { return keyLess(a.PublicKey, b.PublicKey) })
	return s
}

// resolve turns "host:port" endpoints into addresses. A failure affects only
// that peer's endpoint: the peer itself is still configured. An address
// literal applied before is not parsed again; names are looked up on every
// apply.
func (m *Manager) resolve(ctx context.Context, peers []PeerSpec) []ResolvedPeer {
	// The slice is reused from apply to apply (applies are serialised and
	// nothing keeps it): a large device costs no allocation per apply.
	out := slices.Grow(m.resolved[:0], len(peers))[:len(peers)]
	m.resolved = out
	for i, p := range peers {
		var prev *appliedPeer
		if m.applied != nil {
			prev = m.applied.lookup(i, p.PublicKey)
		}
		out[i] = m.resolvePeer(ctx, p, prev)
	}
	return out
}

// resolvePeer resolves p's endpoint; prev is p as last applied (nil: none),
// whose address is reused while a literal endpoint stays the same.
func (m *Manager) resolvePeer(ctx context.Context, p PeerSpec, prev *appliedPeer) ResolvedPeer {
	out := ResolvedPeer{PeerSpec: p}
	if p.Endpoint == "" {
		return out
	}
	if prev != nil && prev.literal && prev.Endpoint == p.Endpoint {
		out.Addr, out.literal = prev.Addr, true
		return out
	}
	addr, literal, err := resolveEndpoint(ctx, m.resolver, p.Endpoint)
	if err != nil {
		out.ResolveErr = err
		return out
	}
	out.Addr, out.literal = addr, literal
	return out
}

// ResolveTimeout bounds the lookup of one endpoint's name: a name server
// answers in milliseconds, and a name it does not answer for is reported
// (Report.Unresolved) and tried again at the next apply.
const ResolveTimeout = 2 * time.Second

// resolveEndpoint resolves endpoint; literal says it was an address.
func resolveEndpoint(ctx context.Context, r Resolver, endpoint string) (addr *net.UDPAddr, literal bool, err error) {
	host, portStr, err := net.SplitHostPort(endpoint)
	if err != nil {
		return nil, false, fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, false, fmt.Errorf("endpoint %q: invalid port", endpoint)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(a.Unmap(), uint16(port))), true, nil
	}
	// Bounded: a name server that never answers would otherwise hold every
	// apply for the resolver's own timeouts (5 s, twice), and so every
	// change of the node (e2e TestPeerDNSUnresolvable).
	lctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	addrs, err := r.LookupNetIP(lctx, "ip", host)
	if err != nil {
		return nil, false, fmt.Errorf("resolve endpoint %q: %w", endpoint, err)
	}
	if len(addrs) == 0 {
		return nil, false, fmt.Errorf("resolve endpoint %q: no addresses", endpoint)
	}
	// Prefer IPv4 for determinism across nodes with and without IPv6.
	pick := addrs[0]
	for _, a := range addrs {
		if a.Unmap().Is4() {
			pick = a
			break
		}
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(pick.Unmap(), uint16(port))), false, nil
}

func changeNames(cs []PeerChange) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		if c.Name != "" {
			out = append(out, c.Name)
		} else {
			out = append(out, c.PublicKey.String())
		}
	}
	return out
}
