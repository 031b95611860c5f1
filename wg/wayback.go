package wg

import (
	"context"
	"fmt"
	"log/slog"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// ForgetLearnedEndpoints readies the device for kg, which takes it over
// when meshlet leaves a node on the way back (docs/dropin.md#the-way-back).
// kg compares kilo0 with its own configuration at its first sync and, when
// they differ, rewrites the whole device, which forgets every session —
// including the ones the other leaders have just (re-)established with
// this node, which then go half-dead until they are repaired
// (docs/kilo-compatibility.md#half-dead). One difference is meshlet's on
// purpose: a roaming peer kg configures without an endpoint (a Peer with
// neither endpoint nor keepalive, e.g. a laptop) keeps on meshlet's device
// the endpoint it learned (kg 0.7's Conf.Equal: nil against an endpoint is
// a difference). Each such peer is removed and added back without it, in
// one configuration: its own session goes (kg's rewrite would take it as
// well), every other peer's stays, and kg finds nothing to rewrite for it.
// It returns the names of the peers re-added.
func (m *Manager) ForgetLearnedEndpoints(ctx context.Context) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applied == nil {
		return nil, nil
	}
	cur, err := m.client.Device(m.iface)
	if err != nil {
		return nil, fmt.Errorf("wg: read device %s: %w", m.iface, err)
	}
	learned := map[wgtypes.Key]bool{}
	for _, p := range cur.Peers {
		learned[p.PublicKey] = p.Endpoint != nil
	}
	var cfg wgtypes.Config
	var names []string
	for _, p := range m.applied.peers {
		if p.Endpoint != "" || p.PersistentKeepalive > 0 || !learned[p.PublicKey] {
			continue
		}
		pc := newPeerConfig(p.ResolvedPeer)
		pc.Endpoint = nil
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: p.PublicKey, Remove: true}, pc)
		names = append(names, p.Name)
	}
	if len(names) == 0 {
		return nil, nil
	}
	m.stale = true
	if err := m.configure(cfg); err != nil {
		return nil, fmt.Errorf("wg: forget learned endpoints on %s: %w", m.iface, err)
	}
	m.log.LogAttrs(ctx, slog.LevelInfo, "forgot the endpoints roaming peers taught the device, as kg configures them (none)",
		slog.String("interface", m.iface), slog.Any("peers", names))
	return names, nil
}
