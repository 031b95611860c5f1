package topology

import "time"

// Kilo's timing and the agent's intervals derived from it, in one place:
// every other package refers to these (docs/architecture.md#one-clock).
const (
	// CheckInPeriod is how often kg refreshes its node's last-seen.
	CheckInPeriod = 30 * time.Second
	// ReadyWindow: a node whose last-seen is older than this is not Ready
	// (Kilo: twice the check-in period).
	ReadyWindow = 2 * CheckInPeriod
	// LastSeenRefresh is how old meshlet lets its own last-seen become
	// before it writes a new one: inside the check-in period, so a node
	// that misses one refresh stays Ready.
	LastSeenRefresh = 25 * time.Second
	// HeardRefresh: a watched node heard unchanged for longer than this
	// counts as heard again (its heard-at is restamped), a little under the
	// ready window so a quiet remote node is never judged by a stale stamp.
	HeardRefresh = ReadyWindow * 3 / 4
	// ExpirySlack is how long after a node's last-seen leaves the ready
	// window the loop plans again, so the plan sees it stale.
	ExpirySlack = 100 * time.Millisecond
	// RejectAfterTime is WireGuard's REJECT_AFTER_TIME: a session whose
	// last handshake is older is dead on this side too, and WireGuard
	// handshakes anew by itself on the next packet (docs/wireguard.md).
	// Peer health (agent/runtime/metrics) and the half-dead session rule
	// (agent/core/sessions) judge with it.
	RejectAfterTime = 180 * time.Second
)

// Earliest is the earliest of the moments that are set (non-zero), zero when
// none is: how the planner, failover and the Elector combine the times at
// which something next changes.
func Earliest(ts ...time.Time) time.Time {
	var next time.Time
	for _, t := range ts {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}
