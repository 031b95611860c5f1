package metrics

import (
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/wg"
)

// Peer health, grounded in WireGuard's timers (docs/wireguard.md).
//
// A session whose last handshake is older than REJECT_AFTER_TIME (180 s) is
// unusable, so the next packet this side sends starts a new handshake. A
// peer with persistent keepalive K sends at least every K seconds: a healthy
// one therefore handshakes again at most 180 s + K after the last time,
// plus the handshake's retries (REKEY_TIMEOUT 5 s) and jitter. A peer
// without keepalive is judged only while this side sends to it, and only
// from when it sent; an idle one is not broken. A peer that never completed
// a handshake is judged down only once it had that long to do so.

// Health is one peer's state.
type Health struct {
	// State: "up", "down", "never" (judged, never handshaked), "new" (too
	// early to judge), "idle" (no keepalive, nothing sent: not judged).
	State string
	// Allowed is how old its last handshake may be (judged states only).
	Allowed time.Duration
}

// Judged reports whether the state says up or down (meshlet_peer_up).
func (h Health) Judged() bool { return h.State == "up" || h.State == "down" || h.State == "never" }

// Up reports whether a judged peer is up.
func (h Health) Up() bool { return h.State == "up" }

const (
	// handshakeSlack covers the handshake's own retries and jitter.
	handshakeSlack = 15 * time.Second
)

// Judge applies the rule to one peer read at now: first is when this
// process first saw it, sent when it last saw its transmit counter grow
// (zero = not since first seen).
func Judge(p wg.PeerStats, now, first, sent time.Time) Health {
	var allowed time.Duration
	switch {
	case p.PersistentKeepalive > 0:
		allowed = topology.RejectAfterTime + p.PersistentKeepalive + handshakeSlack
	case !sent.IsZero() && now.Sub(sent) < topology.RejectAfterTime:
		allowed = topology.RejectAfterTime + handshakeSlack + now.Sub(sent)
	default:
		return Health{State: "idle"}
	}
	if p.LastHandshake.IsZero() {
		if now.Sub(first) < allowed {
			return Health{State: "new", Allowed: allowed}
		}
		return Health{State: "never", Allowed: allowed}
	}
	if now.Sub(p.LastHandshake) <= allowed {
		return Health{State: "up", Allowed: allowed}
	}
	return Health{State: "down", Allowed: allowed}
}
