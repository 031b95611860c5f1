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
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
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
	// applied is the last successfully applied input, so Drifted can tell
	// whether someone changed the device since (e.g. `wg set ... remove`,
	// which raises no netlink event on a userspace device).
	applied *DiffInput
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
func (m *Manager) Apply(ctx context.Context, desired DeviceSpec) (Report, error) {
	m.mu.Lock()
	defer m.mu.Unlock()

	peers := m.resolve(ctx, desired.Peers)
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("wg: apply %s: %w", m.iface, err)
	}
	cur, err := m.client.Device(m.iface)
	if err != nil {
		return Report{}, fmt.Errorf("wg: read device %s: %w", m.iface, err)
	}
	cfg, rep := Diff(DiffInput{
		PrivateKey:    m.key,
		ListenPort:    desired.ListenPort,
		Peers:         peers,
		LastEndpoints: m.lastEndpoints,
		Names:         m.names,
	}, cur)
	rep.Interface = m.iface
	if rep.Changed() {
		if err := m.client.ConfigureDevice(m.iface, cfg); err != nil {
			return Report{}, fmt.Errorf("wg: configure device %s (%d peers): %w", m.iface, rep.PeersTouched(), err)
		}
	}
	// Only after success: remember what was applied. Peers whose endpoint did
	// not resolve keep their old memory so a later successful resolution
	// counts as a change only if the string really changed.
	names := make(map[wgtypes.Key]string, len(peers))
	last := make(map[wgtypes.Key]string, len(peers))
	for _, p := range peers {
		names[p.PublicKey] = p.Name
		if p.ResolveErr == nil {
			last[p.PublicKey] = p.Endpoint
		} else if prev, ok := m.lastEndpoints[p.PublicKey]; ok {
			last[p.PublicKey] = prev
		}
	}
	m.names, m.lastEndpoints = names, last
	m.applied = &DiffInput{PrivateKey: m.key, ListenPort: desired.ListenPort, Peers: peers}

	if rep.Changed() {
		m.log.LogAttrs(ctx, slog.LevelInfo, "wireguard peers applied",
			slog.String("interface", m.iface),
			slog.Any("added", changeNames(rep.Added)),
			slog.Any("updated", changeNames(rep.Updated)),
			slog.Any("removed", changeNames(rep.Removed)),
			slog.Bool("listenPortChanged", rep.ListenPort),
			slog.Bool("privateKeyChanged", rep.PrivateKey))
	}
	for _, u := range rep.Unresolved {
		m.log.LogAttrs(ctx, slog.LevelWarn, "wireguard endpoint not resolved; endpoint left unchanged",
			slog.String("interface", m.iface), slog.String("peer", u.Name),
			slog.String("endpoint", u.Endpoint), slog.String("error", u.Error))
	}
	return rep, nil
}

// Stats reads the device for metrics.
func (m *Manager) Stats(ctx context.Context) (DeviceStats, error) {
	if err := ctx.Err(); err != nil {
		return DeviceStats{}, err
	}
	d, err := m.client.Device(m.iface)
	if err != nil {
		return DeviceStats{}, fmt.Errorf("wg: read device %s: %w", m.iface, err)
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
// that peer's endpoint: the peer itself is still configured.
func (m *Manager) resolve(ctx context.Context, peers []PeerSpec) []ResolvedPeer {
	out := make([]ResolvedPeer, len(peers))
	for i, p := range peers {
		out[i].PeerSpec = p
		if p.Endpoint == "" {
			continue
		}
		addr, err := resolveEndpoint(ctx, m.resolver, p.Endpoint)
		if err != nil {
			out[i].ResolveErr = err
			continue
		}
		out[i].Addr = addr
	}
	return out
}

func resolveEndpoint(ctx context.Context, r Resolver, endpoint string) (*net.UDPAddr, error) {
	host, portStr, err := net.SplitHostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("endpoint %q: invalid port", endpoint)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(a.Unmap(), uint16(port))), nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolve endpoint %q: %w", endpoint, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve endpoint %q: no addresses", endpoint)
	}
	// Prefer IPv4 for determinism across nodes with and without IPv6.
	pick := addrs[0]
	for _, a := range addrs {
		if a.Unmap().Is4() {
			pick = a
			break
		}
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(pick.Unmap(), uint16(port))), nil
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
