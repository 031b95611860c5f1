package wg

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// A peer without a persistent keepalive sends nothing until there is
// traffic for it. When this device was re-created (a userspace device that
// died with its pod in a rolling update) while the other side kept its
// session, the other side's packets are dropped here as unknown, and it
// starts a new handshake only when its own timers give up on the old
// session: up to 15 s (docs/wireguard.md). Turning a peer's persistent
// keepalive on sends a keepalive at once — a handshake initiation when there
// is no session, in the kernel module and in wireguard-go alike — so
// InitiateHandshakes turns it on for one write and off again in the next,
// leaving every peer as planned.

// handshakeKeepalive is the interval set for the instant between the two
// writes; the value does not matter as long as it is not 0.
const handshakeKeepalive = time.Second

// noteHandshakes records the peers an apply added.
func (m *Manager) noteHandshakes(added []PeerChange) {
	for _, a := range added {
		if m.handshakes == nil {
			m.handshakes = make(map[wgtypes.Key]struct{}, len(added))
		}
		m.handshakes[a.PublicKey] = struct{}{}
	}
}

// InitiateHandshakes starts a handshake with every peer added since the
// last call that has an endpoint and no persistent keepalive, and returns
// how many. Call it once the link is up: a device that is down sends
// nothing. It costs nothing when no peer was added.
func (m *Manager) InitiateHandshakes(ctx context.Context) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.handshakes) == 0 || m.applied == nil {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	on, off := handshakeKeepalive, time.Duration(0)
	var start, restore wgtypes.Config
	for k := range m.handshakes {
		// Only what WireGuard would not reach by itself: a peer with an
		// endpoint and no persistent keepalive, as last applied.
		p := m.applied.peers[k]
		if p == nil || p.Addr == nil || p.PersistentKeepalive != 0 {
			continue
		}
		// UpdateOnly: a peer removed from the device behind our back is
		// not re-created here.
		start.Peers = append(start.Peers, wgtypes.PeerConfig{PublicKey: k, UpdateOnly: true, PersistentKeepaliveInterval: &on})
		restore.Peers = append(restore.Peers, wgtypes.PeerConfig{PublicKey: k, UpdateOnly: true, PersistentKeepaliveInterval: &off})
	}
	m.handshakes = nil
	n := len(start.Peers)
	if n == 0 {
		return 0, nil
	}
	if err := m.configure(start); err != nil {
		m.stale = true
		return 0, fmt.Errorf("wg: start handshakes on %s (%d peers): %w", m.iface, n, err)
	}
	if err := m.configure(restore); err != nil {
		// Keepalives may be left on: the next apply must read the device.
		m.stale = true
		return n, fmt.Errorf("wg: turn keepalive back off on %s (%d peers): %w", m.iface, n, err)
	}
	m.log.LogAttrs(ctx, slog.LevelDebug, "started WireGuard handshakes with added peers",
		slog.String("interface", m.iface), slog.Int("peers", n))
	return n, nil
}
