package wg

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"k8s.io/utils/clock"
)

// WatchOptions configures Watch. The zero value of a field is its default.
type WatchOptions struct {
	// Interval is the shortest time between two drift reads of a device
	// without a change feed (default 1 s). Reads are spaced further apart
	// so that they take at most ReadShare of the time (default 0.002): a
	// read that takes 8 ms is repeated every 4 s.
	Interval  time.Duration
	ReadShare float64
	// Backstop: the device is read at least this often, feed or not
	// (default 30 s, Kilo's resync), for what no feed reports: WireGuard
	// moving a non-roaming peer's endpoint to a packet's source.
	Backstop time.Duration
	// Sessions watches the sessions of peers with a SessionProbe for the
	// half-dead rule (session.go): while there are any, their counters are
	// read every SessionInterval (default 100 ms) after a read that saw one
	// of them carry a flow (more than FlowRate), every FastInterval
	// (default 50 ms) while one has traffic going unanswered or the plan
	// waits for a reading (SessionActs.Recheck), so a half-dead session is
	// settled within a second, and every QuietInterval (default 1 s) after
	// a read that saw them all quiet or carrying less (a health probe's
	// echo): a quiet session has nothing to detect, and its first packet
	// into a half-dead session is seen within that. A reading Stats took
	// (the health probes') stands in for a slow one (offer.go), and after
	// one the next comes up to a quarter interval later. Probe sends the
	// probes ActOnSessions is told to send (ICMP echo).
	Sessions        bool
	SessionInterval time.Duration
	FastInterval    time.Duration
	QuietInterval   time.Duration
	Probe           func(ctx context.Context, addr netip.Addr) error
	// OnRepair is called for every session re-established (metrics).
	OnRepair func(peer string)
	// Clock drives the reads and stamps the sessions' facts and what
	// ActOnSessions does (nil: the real clock).
	Clock clock.Clock
}

func (o WatchOptions) withDefaults() WatchOptions {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.ReadShare <= 0 {
		o.ReadShare = 0.002
	}
	if o.Backstop <= 0 {
		o.Backstop = 30 * time.Second
	}
	o.Interval = min(o.Interval, o.Backstop)
	if o.SessionInterval <= 0 {
		o.SessionInterval = 100 * time.Millisecond
	}
	if o.FastInterval <= 0 || o.FastInterval > o.SessionInterval {
		o.FastInterval = o.SessionInterval
	}
	if o.QuietInterval <= 0 {
		o.QuietInterval = time.Second
	}
	o.QuietInterval = max(o.QuietInterval, o.SessionInterval)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o
}

// Watch watches the device until ctx ends and signals (coalesced) when it
// no longer matches the last apply — a peer removed, added or changed by
// someone else — so the agent re-applies at once; a read error counts as
// drift (a vanished device must be recreated). The device is read:
//   - when a device meshlet hosts reports a configuration written by
//     another process (changes.go): a peer removed with `wg set` is seen
//     within milliseconds, and an idle device is never read for drift but
//     every Backstop;
//   - else (kernel WireGuard, a userspace device someone else runs) every
//     Interval or, on a large device, as often as ReadShare allows: a
//     removed peer is back within that period
//     (docs/performance.md#drift-how-it-is-found-and-its-bound);
//   - every SessionInterval while peers with a SessionProbe are applied
//     and carry a flow (every QuietInterval while they are quiet, where a
//     reading Stats took stands in for the watch's own: offer.go), for the
//     half-dead session rule (session.go), which the same read serves.
func (m *Manager) Watch(ctx context.Context, o WatchOptions) <-chan struct{} {
	o = o.withDefaults()
	m.offerMu.Lock()
	m.watchClock = o.Clock
	m.offerMu.Unlock()
	m.mu.Lock()
	m.probe, m.onRepair = o.Probe, o.OnRepair
	m.mu.Unlock()
	out := make(chan struct{}, 1)
	go m.watch(ctx, o, out)
	return out
}

func (m *Manager) watch(ctx context.Context, o WatchOptions, out chan<- struct{}) {
	self := os.Getpid()
	var feed *changeSub
	defer func() {
		if feed != nil {
			feed.close()
		}
	}()
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	var cost time.Duration // of the last read
	lastRead := o.Clock.Now()
	lastOffered := false // the last reading was Stats's (offer.go)
	mode := ""
	for {
		if feed == nil {
			if f, err := m.subscribe(); err == nil {
				feed = f
			}
		}
		if now := m.readMode(feed != nil); now != mode {
			mode = now
			m.log.Info("watching the WireGuard device for changes made behind meshlet's back", "interface", m.iface,
				"how", mode, "read", m.readInterval(feed != nil, cost, o).String())
		}
		var feedC <-chan int
		if feed != nil {
			feedC = feed.C
		}
		interval := m.readInterval(feed != nil, cost, o)
		due := interval
		slow := interval > o.SessionInterval && interval <= o.QuietInterval
		if lastOffered && slow {
			// Reading slowly, and the last reading was offered: the next
			// offer is about as far away as the interval (the health
			// probes run on a one-second ticker too), so wait a quarter
			// more for it rather than read a moment before it comes.
			due += interval / 4
		}
		offered := false
		if wait := lastRead.Add(due).Sub(o.Clock.Now()); wait > 0 {
			t := o.Clock.NewTimer(wait)
			read := false
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
				read = true
			case <-m.changed:
				// An apply changed what is watched (sessions): plan anew.
			case <-m.offered:
				// Stats read the device (offer.go): that is this read, when
				// the watch reads about as often as Stats's callers anyway
				// (a second). Not while it reads fast: a reading a few
				// milliseconds after its last would show a flow as a
				// pause (FlowRate) and slow it down.
				offered = slow
				read = offered
			case pid, ok := <-feedC:
				if !ok {
					// The device process stopped: read now (an error is drift).
					feed.close()
					feed = nil
				}
				read = !ok || pid != self
			}
			t.Stop()
			if !read {
				continue
			}
		}
		start := o.Clock.Now()
		wake, at, err := m.watchOnce(ctx, o, offered, lastRead)
		if at.IsZero() {
			continue // the offer was stale: the timer decides again
		}
		lastRead, lastOffered = at, offered
		if !offered {
			cost = o.Clock.Now().Sub(start)
		}
		if wake || (err != nil && ctx.Err() == nil) {
			signal()
		}
	}
}

// readInterval is the time from one read to the next.
func (m *Manager) readInterval(fed bool, cost time.Duration, o WatchOptions) time.Duration {
	d := o.Backstop
	if !fed {
		d = min(max(o.Interval, time.Duration(float64(cost)/o.ReadShare)), o.Backstop)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if o.Sessions && m.applied != nil && m.applied.probes > 0 {
		s := o.QuietInterval
		switch {
		case m.sessions.pending():
			s = o.FastInterval
		case m.sessions.active:
			s = o.SessionInterval
		}
		d = min(d, s)
	}
	return d
}

// readMode says, for the log, how drift is found.
func (m *Manager) readMode(fed bool) string {
	if fed {
		return "change feed of the device"
	}
	return "periodic device read"
}

// subscribe is subscribeChanges for the managed device (tests replace it).
func (m *Manager) subscribe() (*changeSub, error) {
	if m.subscribeFn != nil {
		return m.subscribeFn()
	}
	return subscribeChanges(m.iface)
}

// watchOnce reads the device once, or takes the reading Stats offered
// (offered: one begun after since, the watch's last reading; none usable:
// at is zero): drift against the last apply, and the watched sessions'
// counters (session.go). It reports whether the loop should run — drift,
// or a reading the half-dead rule should judge — and when the reading was
// taken.
func (m *Manager) watchOnce(ctx context.Context, o WatchOptions, offered bool, since time.Time) (wake bool, at time.Time, err error) {
	if err := ctx.Err(); err != nil {
		return false, o.Clock.Now(), err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var cur *wgtypes.Device
	if offered {
		of := m.takeOffer(since)
		if of == nil {
			return false, time.Time{}, nil
		}
		cur, at = of.dev, of.at
	}
	if m.applied == nil {
		return false, o.Clock.Now(), nil
	}
	if cur == nil {
		cur, err = m.client.Device(m.iface)
		at = o.Clock.Now() // an offer begun before it is older: takeOffer(since)
		if err != nil {
			return false, at, fmt.Errorf("wg: read device %s: %w", m.iface, err)
		}
	}
	if _, rep := Diff(m.applied.input(m.lastEndpoints, m.names), cur); rep.Changed() {
		// Drift first: the re-apply reads and restores the device, the
		// sessions are looked at on the next read.
		m.stale = true
		return true, at, nil
	}
	if !o.Sessions || m.applied.probes == 0 {
		m.sessions.peers = nil
		return false, at, nil
	}
	var samples []watched
	for i := range cur.Peers {
		d := &cur.Peers[i]
		p := m.applied.peers[d.PublicKey]
		if p == nil || !p.SessionProbe.IsValid() {
			continue
		}
		hs := d.LastHandshakeTime
		if hs.Unix() <= 0 {
			hs = time.Time{}
		}
		samples = append(samples, watched{key: d.PublicKey, sample: sessionSample{rx: d.ReceiveBytes, tx: d.TransmitBytes, handshake: hs}, endpoint: d.Endpoint})
	}
	return m.sessions.record(at, samples), at, nil
}
