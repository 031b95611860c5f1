package wg

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// WatchOptions configures Watch.
type WatchOptions struct {
	// Interval between device reads (drift and sessions).
	Interval time.Duration
	// FastInterval is used while a watched session has traffic going
	// unanswered, so a half-dead session is settled within a second.
	FastInterval time.Duration
	// Sessions enables the half-dead session rule for peers with a
	// SessionProbe; Probe sends the probe (ICMP echo).
	Sessions bool
	Policy   SessionPolicy
	Probe    func(ctx context.Context, addr netip.Addr) error
	// OnRepair is called for every session re-established (metrics).
	OnRepair func(peer string)
	Now      func() time.Time
}

// Watch reads the device every Interval until ctx ends. It signals
// (coalesced) when the device no longer matches the last apply — a peer
// removed, added or changed by someone else (`wg set ... remove` raises no
// netlink event, never on a userspace device) — so the agent re-applies at
// once; a read error counts as drift (a vanished device must be recreated).
// In the same read it applies the half-dead session rule (session.go).
func (m *Manager) Watch(ctx context.Context, o WatchOptions) <-chan struct{} {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.FastInterval <= 0 || o.FastInterval > o.Interval {
		o.FastInterval = o.Interval
	}
	if o.Policy == (SessionPolicy{}) {
		o.Policy = DefaultSessionPolicy
	}
	out := make(chan struct{}, 1)
	sw := &sessionWatch{policy: o.Policy}
	go func() {
		t := time.NewTimer(o.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			drifted, probes, err := m.watchOnce(ctx, sw, o)
			if drifted || (err != nil && ctx.Err() == nil) {
				select {
				case out <- struct{}{}:
				default:
				}
			}
			for _, a := range probes {
				if err := o.Probe(ctx, a); err != nil && ctx.Err() == nil {
					m.log.Warn("probing a WireGuard session failed", "interface", m.iface, "address", a.String(), "error", err)
				}
			}
			next := o.Interval
			if sw.pending() {
				next = o.FastInterval
			}
			t.Reset(next)
		}
	}()
	return out
}

// watchOnce reads the device once: drift against the last apply, and the
// session rule, re-establishing half-dead sessions in place. It returns the
// addresses to probe.
func (m *Manager) watchOnce(ctx context.Context, sw *sessionWatch, o WatchOptions) (drifted bool, probes []netip.Addr, err error) {
	if err := ctx.Err(); err != nil {
		return false, nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applied == nil {
		return false, nil, nil
	}
	cur, err := m.client.Device(m.iface)
	if err != nil {
		return false, nil, fmt.Errorf("wg: read device %s: %w", m.iface, err)
	}
	in := *m.applied
	in.LastEndpoints, in.Names = m.lastEndpoints, m.names
	_, rep := Diff(in, cur)
	if rep.Changed() || !o.Sessions {
		// Drift first: the re-apply restores the device, the sessions are
		// looked at on the next read.
		return rep.Changed(), nil, nil
	}
	onDevice := make(map[wgtypes.Key]*wgtypes.Peer, len(cur.Peers))
	for i := range cur.Peers {
		onDevice[cur.Peers[i].PublicKey] = &cur.Peers[i]
	}
	var samples []watched
	byKey := map[wgtypes.Key]ResolvedPeer{}
	for _, p := range m.applied.Peers {
		d := onDevice[p.PublicKey]
		if !p.SessionProbe.IsValid() || d == nil {
			continue
		}
		byKey[p.PublicKey] = p
		hs := d.LastHandshakeTime
		if hs.Unix() <= 0 {
			hs = time.Time{}
		}
		samples = append(samples, watched{key: p.PublicKey, sample: sessionSample{rx: d.ReceiveBytes, tx: d.TransmitBytes, handshake: hs}})
	}
	probe, repair := sw.assess(o.Now(), samples)
	for _, k := range probe {
		probes = append(probes, byKey[k].SessionProbe)
	}
	if len(repair) == 0 {
		return false, probes, nil
	}
	var cfg wgtypes.Config
	for _, k := range repair {
		p := byKey[k]
		pc := newPeerConfig(p)
		if d := onDevice[k]; d.Endpoint != nil {
			pc.Endpoint = d.Endpoint // keep where the peer is now
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true}, pc)
	}
	if err := m.client.ConfigureDevice(m.iface, cfg); err != nil {
		return false, probes, fmt.Errorf("wg: re-establish sessions on %s: %w", m.iface, err)
	}
	for _, k := range repair {
		m.log.LogAttrs(ctx, slog.LevelInfo, "re-established a half-dead WireGuard session (the peer forgot it)",
			slog.String("interface", m.iface), slog.String("peer", byKey[k].Name))
		if o.OnRepair != nil {
			o.OnRepair(byKey[k].Name)
		}
	}
	return false, probes, nil
}
