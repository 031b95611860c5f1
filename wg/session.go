package wg

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Half-dead sessions (docs/kilo-compatibility.md#half-dead).
//
// For peers with a SessionProbe (the planner sets it for kg-run peers) the
// watch reads the device's counters and keeps what it saw of each session
// (SessionFact): the facts the planner's half-dead rule judges
// (agent/core/sessions). The plan's decisions come back as SessionActs, which
// ActOnSessions carries out: a probe of the peer's WireGuard IP, or the peer
// removed and added back in one configuration, keeping the endpoint it is at.
// The watch decides nothing; it wakes the loop when a reading may change a
// decision: traffic going unanswered where it was answered, or a reading
// at or after the plan's Recheck.

// SessionFact is one watched session as last read, and what was done to
// it (topology.SessionObservation in the actuator's terms).
type SessionFact struct {
	PublicKey                      wgtypes.Key
	At                             time.Time
	Rx, Tx                         int64
	Handshake                      time.Time
	UnansweredFrom, UnansweredSeen time.Time
	Probed, Recreated              time.Time
	Unheard                        int
	Retried                        bool
}

// SessionActs is what the plan says to do about the watched sessions.
type SessionActs struct {
	Probe, Recreate, Retry []wgtypes.Key
	// Recheck: the watch wakes the loop at its first reading at or after
	// it (zero: no need).
	Recheck time.Time
}

// sessionSample is one reading of a peer's counters.
type sessionSample struct {
	rx, tx    int64
	handshake time.Time
}

// sessionState is what the watch keeps of one watched peer.
type sessionState struct {
	last   sessionSample
	lastAt time.Time // when last was taken
	seen   bool      // last is valid
	// unansweredFrom, unansweredSeen: SessionFact's.
	unansweredFrom, unansweredSeen time.Time
	probed, recreated              time.Time
	unheard                        int
	retried                        bool
	// endpoint is where the peer was at the last reading: a re-creation
	// keeps it.
	endpoint *net.UDPAddr
}

// observe records sample s, taken at now, and reports whether traffic
// began going unanswered with it (a reading the loop should judge).
func observe(st sessionState, s sessionSample, now time.Time) (sessionState, bool) {
	prev, prevAt, seen := st.last, st.lastAt, st.seen
	st.last, st.lastAt, st.seen = s, now, true
	switch {
	case !seen || s.rx < prev.rx || s.tx < prev.tx:
		// First sample, or the peer was re-created (counters restart).
		st.unansweredFrom, st.unansweredSeen, st.probed = time.Time{}, time.Time{}, time.Time{}
	case s.rx > prev.rx || !s.handshake.Equal(prev.handshake):
		// Heard from the peer: the session works, and a re-creation
		// before it worked (only a peer that stays silent is held back).
		st.unansweredFrom, st.unansweredSeen, st.probed = time.Time{}, time.Time{}, time.Time{}
		st.unheard = 0
	case s.tx > prev.tx && st.unansweredFrom.IsZero():
		// Sent since the previous reading, nothing back: the first such
		// packet left after it.
		st.unansweredFrom, st.unansweredSeen = prevAt, now
		return st, true
	}
	return st, false
}

// probedAt records the probe of the current unanswered stretch.
func (st *sessionState) probedAt(now time.Time) { st.probed = now }

// recreatedAt records the peer removed and added back at now (retry: as the
// one retry of its last re-creation). A re-created peer's counters start
// from zero, and that is what it is recorded at: so the reading that shows
// its fresh handshake going out unanswered is traffic going unanswered (a
// wake), and until that reading the rule sees the re-creation (not a peer
// left out of SessionFacts, whose recheck a run in between would drop).
func (st *sessionState) recreatedAt(now time.Time, retry bool) {
	st.last, st.lastAt, st.seen = sessionSample{}, now, true
	st.unansweredFrom, st.unansweredSeen, st.probed = time.Time{}, time.Time{}, time.Time{}
	if retry {
		st.retried = true
		return
	}
	st.recreated, st.retried = now, false
	st.unheard++
}

func (st *sessionState) fact(k wgtypes.Key) SessionFact {
	return SessionFact{PublicKey: k, At: st.lastAt, Rx: st.last.rx, Tx: st.last.tx, Handshake: st.last.handshake,
		UnansweredFrom: st.unansweredFrom, UnansweredSeen: st.unansweredSeen, Probed: st.probed, Recreated: st.recreated,
		Unheard: st.unheard, Retried: st.retried}
}

// FlowRate is the rate, in bytes a second either way since the reading
// before, above which a watched peer's traffic is a flow that the watch
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

// sessionWatch holds the states of the watched peers. The watch writes it
// with its readings, ActOnSessions with what it did; both under the
// Manager's mu.
type sessionWatch struct {
	peers map[wgtypes.Key]sessionState
	// active: the last reading saw a watched peer carry a flow (FlowRate)
	// since the one before, or saw it first (the watch reads fast then,
	// slowly while all are quiet).
	active bool
	// recheck is the last plan's Recheck not reached yet by a reading.
	recheck time.Time
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

// watched is one peer read in a reading.
type watched struct {
	key      wgtypes.Key
	sample   sessionSample
	endpoint *net.UDPAddr
}

// record takes one reading's samples (peers no longer watched are
// forgotten) and reports whether the loop should judge it: traffic began
// going unanswered, or the reading reached the plan's recheck.
func (w *sessionWatch) record(now time.Time, samples []watched) bool {
	next := make(map[wgtypes.Key]sessionState, len(samples))
	w.active = false
	wake := false
	for _, s := range samples {
		prev := w.peers[s.key]
		w.active = w.active || !prev.seen || flowing(prev, s.sample, now)
		st, began := observe(prev, s.sample, now)
		st.endpoint = s.endpoint
		next[s.key] = st
		wake = wake || began
	}
	w.peers = next
	if !w.recheck.IsZero() && !now.Before(w.recheck) {
		w.recheck = time.Time{}
		wake = true
	}
	return wake
}

// pending reports whether the plan waits for a reading, or a watched peer
// has traffic going unanswered within a session (a handshake): the watch
// reads fast until that is settled. Traffic unanswered without a session
// (a peer re-created, its fresh handshake unanswered) waits for the plan's
// recheck alone, so a kg peer that is really gone is not read every 50 ms
// for as long as traffic is sent to it.
func (w *sessionWatch) pending() bool {
	if !w.recheck.IsZero() {
		return true
	}
	for _, st := range w.peers {
		if !st.unansweredFrom.IsZero() && !st.last.handshake.IsZero() {
			return true
		}
	}
	return false
}

// SessionFacts returns the watched sessions as last read, by public key.
func (m *Manager) SessionFacts() []SessionFact {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.sessions.peers) == 0 {
		return nil
	}
	out := make([]SessionFact, 0, len(m.sessions.peers))
	for k, st := range m.sessions.peers {
		if st.seen {
			out = append(out, st.fact(k))
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].PublicKey[:], out[j].PublicKey[:]) < 0 })
	return out
}

// ActOnSessions carries out the plan's session actions. Each is done only
// while the facts it was judged on still stand (a plan computed twice from
// one reading probes and re-creates once): a probe while the peer's traffic
// is unanswered and not probed yet, a re-creation once it was probed, a
// retry once per re-creation while its fresh handshake is unanswered. What
// is done is recorded as of the reading it was judged on (the rule's times
// count from what it saw: a run of the loop later, the next step is due at
// the reading the plan's recheck names, not one after it).
// Probes go out through WatchOptions.Probe; re-creations keep the endpoint
// the peer is at. The watch reads fast from now until a reading reaches
// acts.Recheck.
func (m *Manager) ActOnSessions(ctx context.Context, acts SessionActs) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &m.sessions
	w.recheck = acts.Recheck
	// The watch may be waiting a quiet second: it plans its next reading
	// anew (fast while a recheck is pending).
	m.wakeWatch(!acts.Recheck.IsZero())
	var probes []netip.Addr
	for _, k := range acts.Probe {
		st, ok := w.peers[k]
		p := m.sessionPeer(k)
		if !ok || p == nil || st.unansweredFrom.IsZero() || !st.probed.IsZero() {
			continue
		}
		st.probedAt(st.lastAt)
		w.peers[k] = st
		probes = append(probes, p.SessionProbe)
	}
	var again []wgtypes.Key // re-created: retried is set, not recreated
	var recreate []*appliedPeer
	for _, k := range acts.Recreate {
		st, ok := w.peers[k]
		if p := m.sessionPeer(k); ok && p != nil && !st.probed.IsZero() {
			recreate = append(recreate, p)
		}
	}
	for _, k := range acts.Retry {
		st, ok := w.peers[k]
		if p := m.sessionPeer(k); ok && p != nil && !st.recreated.IsZero() && !st.retried && st.last.rx == 0 && st.last.handshake.IsZero() {
			recreate = append(recreate, p)
			again = append(again, k)
		}
	}
	var err error
	if len(recreate) > 0 {
		err = m.recreate(ctx, recreate, again)
	}
	if send := m.probe; len(probes) > 0 && send != nil {
		// Sent without the lock: the device is not touched.
		m.mu.Unlock()
		for _, a := range probes {
			if perr := send(ctx, a); perr != nil && ctx.Err() == nil {
				m.log.Warn("probing a WireGuard session failed", "interface", m.iface, "address", a.String(), "error", perr)
			}
		}
		m.mu.Lock()
	}
	return err
}

// sessionPeer is the applied peer k under the session rule, or nil.
func (m *Manager) sessionPeer(k wgtypes.Key) *appliedPeer {
	if m.applied == nil {
		return nil
	}
	p := m.applied.peers[k]
	if p == nil || !p.SessionProbe.IsValid() {
		return nil
	}
	return p
}

// recreate removes and adds back peers in one configuration, keeping the
// endpoint each is at, and records it (again: the retries among them).
// Call with m.mu held.
func (m *Manager) recreate(ctx context.Context, peers []*appliedPeer, again []wgtypes.Key) error {
	retry := make(map[wgtypes.Key]bool, len(again))
	for _, k := range again {
		retry[k] = true
	}
	var cfg wgtypes.Config
	for _, p := range peers {
		pc := newPeerConfig(p.ResolvedPeer)
		if e := m.sessions.peers[p.PublicKey].endpoint; e != nil {
			pc.Endpoint = e // keep where the peer is now
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: p.PublicKey, Remove: true}, pc)
	}
	if err := m.configure(cfg); err != nil {
		m.stale = true
		return fmt.Errorf("wg: re-establish sessions on %s: %w", m.iface, err)
	}
	for _, p := range peers {
		st := m.sessions.peers[p.PublicKey]
		st.recreatedAt(st.lastAt, retry[p.PublicKey])
		m.sessions.peers[p.PublicKey] = st
		msg := "re-established a half-dead WireGuard session (the peer forgot it)"
		if retry[p.PublicKey] {
			msg = "re-established a repaired WireGuard peer again: its fresh handshake went unanswered (rather than WireGuard's retry in 5 s)"
		}
		m.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("interface", m.iface), slog.String("peer", p.Name))
		if m.onRepair != nil {
			m.onRepair(p.Name)
		}
	}
	return nil
}
