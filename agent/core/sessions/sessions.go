// Package sessions is the half-dead session rule for peers run by kg
// (docs/kilo-compatibility.md#half-dead), as a stage of the plan: from what
// the WireGuard device's watch saw of each session (topology.Self.Sessions),
// what to do now (topology.Plan.Sessions), which the WireGuard actuator
// carries out. Pure: no I/O, no clock; every time it compares comes from
// the observations.
//
// kg applies every change by rewriting its whole device, which forgets the
// sessions it had. This side's half of such a session stays valid, so it
// goes on sending into a session the peer no longer knows; the peer drops
// those packets silently, and WireGuard notices only after
// KEEPALIVE_TIMEOUT + REKEY_TIMEOUT (15 s) without a reply. So: traffic
// sent and nothing received for SuspectAfter, within a session this side
// believes alive, is suspicious. One probe to the peer's WireGuard IP tells
// a one-way flow (the peer answers through the session) from a dead session
// (no answer); after ProbeTimeout without anything received the peer is
// removed and added back in one configuration, and the next packet starts a
// fresh handshake, which the peer answers at once.
//
// The fresh handshake can itself be lost: a kg that has just started
// rewrites its device several times in a fraction of a second, and an
// initiation that arrives between two rewrites is answered by a device that
// forgets the answer. WireGuard retransmits an unanswered initiation only
// after REKEY_TIMEOUT (5 s), so a re-created peer whose fresh handshake is
// unanswered for RetryAfter is re-created once more at once, and the next
// packet initiates again.
package sessions

import (
	"bytes"
	"sort"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Policy tunes the rule.
type Policy struct {
	// SuspectAfter: sent, nothing received for this long → probe.
	SuspectAfter time.Duration
	// ProbeTimeout: nothing received this long after the probe → re-create.
	ProbeTimeout time.Duration
	// MinBackoff, MaxBackoff bound how often one peer is re-created while
	// nothing is received from it between re-creations (a peer that is
	// really gone); a peer that answers resets it. So the repair traffic is
	// one handshake per session the peer forgets (a kg rewrite), and for a
	// silent peer one per MinBackoff doubling up to MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// RetryAfter: a re-created peer whose fresh handshake has gone
	// unanswered this long is re-created once more (one retry per
	// re-creation; it earns no back-off).
	RetryAfter time.Duration
}

// DefaultPolicy: a half-dead session costs well under a second of traffic;
// a peer that stays silent is re-created at most every MaxBackoff.
var DefaultPolicy = Policy{
	SuspectAfter: 200 * time.Millisecond,
	ProbeTimeout: 300 * time.Millisecond,
	MinBackoff:   5 * time.Second,
	MaxBackoff:   time.Minute,
	RetryAfter:   time.Second,
}

// Judge is the rule over the observed sessions: what to do now, and when to
// judge again if nothing else happens (nil: nothing either way). Each
// observation is judged as of its own reading (At), so a decision never
// rests on a time later than what was seen.
func Judge(obs []topology.SessionObservation, pol Policy) *topology.SessionActions {
	var out topology.SessionActions
	for i := range obs {
		o := &obs[i]
		if o.At.IsZero() {
			continue
		}
		act, recheck := judge(o, pol)
		switch act {
		case probe:
			out.Probe = append(out.Probe, o.PublicKey)
		case recreate:
			out.Recreate = append(out.Recreate, o.PublicKey)
		case retry:
			out.Retry = append(out.Retry, o.PublicKey)
		}
		out.Recheck = topology.Earliest(out.Recheck, recheck)
	}
	if len(out.Probe)+len(out.Recreate)+len(out.Retry) == 0 && out.Recheck.IsZero() {
		return nil
	}
	for _, ks := range [][]topology.Key{out.Probe, out.Recreate, out.Retry} {
		sort.Slice(ks, func(i, j int) bool { return bytes.Compare(ks[i][:], ks[j][:]) < 0 })
	}
	return &out
}

type action int

const (
	none action = iota
	probe
	recreate
	retry
)

// judge is the rule for one session: the action due at its reading, and
// when to judge it again if nothing else happens (after an action: when
// its outcome shows — a probe's answer, a fresh handshake's).
func judge(o *topology.SessionObservation, pol Policy) (action, time.Time) {
	now := o.At
	if !o.Recreated.IsZero() && !o.Retried && o.Handshake.IsZero() && o.Rx == 0 && o.Tx > 0 {
		// Re-created, and its fresh handshake went out unanswered: once
		// unanswered for RetryAfter it is started again now rather than in
		// REKEY_TIMEOUT. Anything else (answered, nothing sent) is left to
		// WireGuard.
		from := o.Recreated
		if o.UnansweredFrom.After(from) {
			from = o.UnansweredFrom
		}
		if due := from.Add(pol.RetryAfter); now.Before(due) {
			return none, due
		}
		return retry, time.Time{}
	}
	if o.UnansweredFrom.IsZero() || o.Handshake.IsZero() || now.Sub(o.Handshake) >= topology.RejectAfterTime {
		// Nothing pending, or no session this side believes in: WireGuard
		// handshakes by itself.
		return none, time.Time{}
	}
	if o.Probed.IsZero() {
		// The first unanswered packet left after UnansweredFrom; when the
		// readings were a quiet second apart, counted from at most half of
		// SuspectAfter before the reading that saw it (what 100 ms readings
		// give), so a reply still in flight is not probed at once.
		start := o.UnansweredFrom
		if floor := o.UnansweredSeen.Add(-pol.SuspectAfter / 2); floor.After(start) {
			start = floor
		}
		if due := start.Add(pol.SuspectAfter); now.Before(due) {
			return none, due
		}
		return probe, now.Add(pol.ProbeTimeout) // its answer, or not
	}
	due := o.Probed.Add(pol.ProbeTimeout)
	if held := o.Recreated.Add(Backoff(o.Unheard, pol)); o.Unheard > 0 && held.After(due) {
		due = held // a peer silent since its last re-creation is held back
	}
	if now.Before(due) {
		return none, due
	}
	return recreate, now.Add(pol.RetryAfter) // its fresh handshake, or not
}

// Backoff is how long after its last re-creation a peer re-created unheard
// times since it was last heard from waits before the next: MinBackoff,
// doubling up to MaxBackoff.
func Backoff(unheard int, pol Policy) time.Duration {
	if unheard <= 0 {
		return 0
	}
	d := pol.MinBackoff
	for i := 1; i < unheard && d < pol.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, pol.MaxBackoff)
}
