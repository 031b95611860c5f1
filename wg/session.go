package wg

import (
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Half-dead sessions (docs/kilo-compatibility.md#half-dead).
//
// kg applies every change by rewriting its whole device, which forgets the
// sessions it had. This side's half of such a session stays valid, so it
// goes on sending into a session the peer no longer knows; the peer drops
// those packets silently, and WireGuard notices only after
// KEEPALIVE_TIMEOUT + REKEY_TIMEOUT (15 s) without a reply. For peers with a
// SessionProbe (the planner sets it for kg-run peers) the monitor therefore
// watches the device's counters: traffic sent and nothing received for
// SuspectAfter, within a session this side believes alive, is suspicious.
// One probe to the peer's WireGuard IP tells a one-way flow (the peer
// answers through the session) from a dead session (no answer); after
// ProbeTimeout without anything received the peer is removed and added back
// in one configuration, and the next packet starts a fresh handshake, which
// the peer answers at once.
//
// The fresh handshake can itself be lost: a kg that has just started
// rewrites its device several times in a fraction of a second, and an
// initiation that arrives between two rewrites is answered by a device
// that forgets the answer. WireGuard retransmits an unanswered initiation
// only after REKEY_TIMEOUT (5 s), so a repaired peer whose fresh handshake
// is unanswered RetryAfter after the repair is re-created once more at once
// (its handshake state with it), and the next packet initiates again.

// SessionPolicy tunes the half-dead session rule.
type SessionPolicy struct {
	// SuspectAfter: sent, nothing received for this long → probe.
	SuspectAfter time.Duration
	// ProbeTimeout: nothing received this long after the probe → re-establish.
	ProbeTimeout time.Duration
	// MinBackoff, MaxBackoff bound how often one peer is re-established
	// while nothing is received from it between repairs (a peer that is
	// really gone); a peer that answers after a repair resets it. So the
	// repair traffic is one handshake per session the peer forgets (a kg
	// rewrite), and for a silent peer one per MinBackoff doubling up to
	// MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// RetryAfter: a repaired peer that has sent its fresh handshake and
	// heard nothing this long after the repair is re-created once more
	// (one retry per repair; it earns no back-off).
	RetryAfter time.Duration
}

// DefaultSessionPolicy: a half-dead session costs well under a second of
// traffic; a peer that stays silent is re-established at most every
// MaxBackoff.
var DefaultSessionPolicy = SessionPolicy{
	SuspectAfter: 200 * time.Millisecond,
	ProbeTimeout: 300 * time.Millisecond,
	MinBackoff:   5 * time.Second,
	MaxBackoff:   time.Minute,
	RetryAfter:   time.Second,
}

// RejectAfterTime is WireGuard's REJECT_AFTER_TIME: a session whose last
// handshake is older is dead on this side too, and WireGuard handshakes
// anew by itself on the next packet (docs/wireguard.md). The one home of
// the constant: peer health (agent/runtime/metrics) judges with it too.
const RejectAfterTime = 180 * time.Second

// sessionSample is one reading of a peer's counters.
type sessionSample struct {
	rx, tx    int64
	handshake time.Time
}

// sessionState is what the monitor remembers of one watched peer.
type sessionState struct {
	last   sessionSample
	lastAt time.Time // when last was taken
	seen   bool      // last is valid
	// unanswered: since when traffic has been going out with nothing
	// received (at the latest the reading before it was seen); zero when
	// the peer answered.
	unanswered time.Time
	probed     time.Time // when the probe went out; zero = not yet
	repairedAt time.Time
	backoff    time.Duration
	// retryDue: repaired, and neither heard from since nor retried.
	retryDue bool
}

type sessionAction int

const (
	sessionOK sessionAction = iota
	sessionProbe
	sessionRepair
	// sessionRetry: re-create a repaired peer whose fresh handshake went
	// unanswered (done as a repair).
	sessionRetry
)

// assessSession is the rule, pure: the state after sample s taken at now,
// and what to do.
func assessSession(st sessionState, s sessionSample, now time.Time, pol SessionPolicy) (sessionState, sessionAction) {
	prev, prevAt, seen := st.last, st.lastAt, st.seen
	st.last, st.lastAt, st.seen = s, now, true
	switch {
	case !seen || s.rx < prev.rx || s.tx < prev.tx:
		// First sample, or the peer was re-created (counters restart).
		st.unanswered, st.probed = time.Time{}, time.Time{}
		return st, sessionOK
	case s.rx > prev.rx || !s.handshake.Equal(prev.handshake):
		// Heard from the peer: the session works — and if it was just
		// re-established, the repair worked, so the next one is not held
		// back (a kg that rewrites its device every few seconds costs one
		// repair per rewrite; only a peer that stays silent after repairs
		// is backed off).
		st.unanswered, st.probed = time.Time{}, time.Time{}
		st.backoff, st.retryDue = 0, false
		return st, sessionOK
	case s.tx > prev.tx && st.unanswered.IsZero():
		// Sent since the previous reading, nothing back: the first such
		// packet may have left right after it — or, when the readings
		// were a quiet second apart, just before this one: counted from
		// at most half of SuspectAfter back (what 100 ms readings give), a
		// reply still in flight is not probed at once.
		st.unanswered = prevAt
		if floor := now.Add(-pol.SuspectAfter / 2); floor.After(prevAt) {
			st.unanswered = floor
		}
	}
	if st.retryDue && now.Sub(st.repairedAt) >= pol.RetryAfter {
		// The fresh handshake's window is over: sent and unanswered, it
		// is started again now rather than in REKEY_TIMEOUT; anything
		// else (answered, nothing sent) leaves WireGuard to it.
		st.retryDue = false
		if s.handshake.IsZero() && s.rx == 0 && s.tx > 0 {
			st.unanswered, st.probed = time.Time{}, time.Time{}
			return st, sessionRetry
		}
	}
	if st.unanswered.IsZero() || s.handshake.IsZero() || now.Sub(s.handshake) >= RejectAfterTime {
		// Nothing pending, or no session this side believes in: WireGuard
		// handshakes by itself.
		return st, sessionOK
	}
	switch {
	case st.probed.IsZero() && now.Sub(st.unanswered) >= pol.SuspectAfter:
		st.probed = now
		return st, sessionProbe
	case !st.probed.IsZero() && now.Sub(st.probed) >= pol.ProbeTimeout && now.Sub(st.repairedAt) >= st.backoff:
		st.repairedAt, st.retryDue = now, pol.RetryAfter > 0
		st.backoff = min(max(2*st.backoff, pol.MinBackoff), pol.MaxBackoff)
		st.unanswered, st.probed = time.Time{}, time.Time{}
		return st, sessionRepair
	}
	return st, sessionOK
}

// FlowRate is the rate, in bytes a second either way since the reading
// before, above which a watched peer's traffic is a flow that the monitor
// reads fast (SessionInterval), so that a half-dead session starting inside
// it is seen within that interval. Under it — a leader's health probe, one
// echo a second (80 bytes as WireGuard counts it), a keepalive (32 bytes),
// a ping a second — the peer is read at QuietInterval: its unanswered
// packets are still seen at the next reading and read fast from then
// (pending), 1.25 s later at most (offer.go). Before, any traffic brought
// fast reads, so a Lease holder read its kg-run peers' counters twice a
// second for its own probes alone (docs/performance.md#beside-kg). The
// rate is judged over the time since the reading before: a ping every
// 100 ms (128-byte packets) keeps 100 ms readings going; one every 200 ms
// is a flow to a one-second reading, but half of the 100 ms readings see
// none, and each of those falls back to a second (as before FlowRate).
const FlowRate = 256

// sessionWatch holds the states of the watched peers.
type sessionWatch struct {
	policy SessionPolicy
	peers  map[wgtypes.Key]sessionState
	// active: the last tick saw a watched peer carry a flow (FlowRate)
	// since the tick before, or saw it first (the monitor reads fast then,
	// slowly while all are quiet).
	active bool
}

// flowing reports whether s, taken at now, shows a flow since prev.
func flowing(prev sessionState, s sessionSample, now time.Time) bool {
	d := now.Sub(prev.lastAt)
	if d <= 0 {
		return s.tx != prev.last.tx || s.rx != prev.last.rx
	}
	limit := FlowRate * d.Seconds()
	return float64(s.tx-prev.last.tx) > limit || float64(s.rx-prev.last.rx) > limit
}

// watched is one peer to assess in a tick.
type watched struct {
	key    wgtypes.Key
	sample sessionSample
}

// assess runs the rule over this tick's samples and returns the peers to
// probe, to re-establish, and to re-create again after an unanswered fresh
// handshake. Peers no longer watched are forgotten.
func (w *sessionWatch) assess(now time.Time, samples []watched) (probe, repair, retry []wgtypes.Key) {
	next := make(map[wgtypes.Key]sessionState, len(samples))
	w.active = false
	for _, s := range samples {
		prev := w.peers[s.key]
		w.active = w.active || !prev.seen || flowing(prev, s.sample, now)
		st, act := assessSession(prev, s.sample, now, w.policy)
		next[s.key] = st
		switch act {
		case sessionProbe:
			probe = append(probe, s.key)
		case sessionRepair:
			repair = append(repair, s.key)
		case sessionRetry:
			retry = append(retry, s.key)
		}
	}
	w.peers = next
	return probe, repair, retry
}

// pending reports whether a watched peer has traffic going unanswered or a
// fresh handshake in its retry window, so the monitor samples fast until
// that is settled.
func (w *sessionWatch) pending() bool {
	for _, st := range w.peers {
		if !st.unanswered.IsZero() || st.retryDue {
			return true
		}
	}
	return false
}
