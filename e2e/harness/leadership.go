package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// HandoverWindow is how long two nodes of one location may both be
// configured as leader before LeadershipMonitor calls it a split: none.
// meshlet demotes a leader that steps aside before it releases the Lease,
// a candidate takes an expired Lease only, and a dead leader cannot
// overlap, so any overlap seen is a split.
const HandoverWindow time.Duration = 0

// LeadershipMonitor checks, while a scenario runs, that two nodes of one
// location are never both configured as its leader. "Configured" is
// judged two ways, both on this machine's one clock:
//
//   - by each agent's own history of its role (/status: a change to leader
//     stamped when the run that configured it started, a change away once
//     the device was down), merged across polls and agent restarts; a
//     powered-off node stops leading when its processes die;
//   - independently, by sampling each node's kilo0 (up with an address:
//     configured as leader) every poll.
//
// The history is exact but self-reported; the samples trust nothing but
// can miss an overlap shorter than a poll. Overlaps of either kind are
// reported, and any of either kind fails Check.
type LeadershipMonitor struct {
	nodes    []*Node
	interval time.Duration
	cancel   context.CancelFunc
	done     chan struct{}

	mu      sync.Mutex
	roles   map[string]map[time.Time]bool // node → change time → leader
	offAt   map[string]time.Time
	samples []sample
	polls   int
	errs    int
	started time.Time
	stopped time.Time
}

type sample struct {
	at      time.Time
	leaders []string
}

// WatchLeadership starts a monitor of the nodes of one location.
func WatchLeadership(ctx context.Context, nodes ...*Node) *LeadershipMonitor {
	ctx, cancel := context.WithCancel(ctx)
	m := &LeadershipMonitor{nodes: nodes, interval: 200 * time.Millisecond, cancel: cancel, done: make(chan struct{}),
		roles: map[string]map[time.Time]bool{}, offAt: map[string]time.Time{}, started: time.Now()}
	go m.run(ctx)
	return m
}

// PoweredOff records that n lost power at at: it leads no more from then.
func (m *LeadershipMonitor) PoweredOff(n *Node, at time.Time) {
	m.mu.Lock()
	m.offAt[n.Name] = at
	m.mu.Unlock()
}

func (m *LeadershipMonitor) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type statusRoles struct {
	Leadership *struct {
		Roles []struct {
			At     time.Time `json:"at"`
			Leader bool      `json:"leader"`
		} `json:"roles"`
	} `json:"leadership"`
}

func (m *LeadershipMonitor) poll(ctx context.Context) {
	var leaders []string
	now := time.Now()
	for _, n := range m.nodes {
		if up, err := n.Kilo0Configured(ctx); err == nil && up {
			leaders = append(leaders, n.Name)
		}
		if !n.Running() {
			continue
		}
		code, body, err := n.get(ctx, "/status")
		m.mu.Lock()
		m.polls++
		if err != nil || code != http.StatusOK {
			m.errs++
			m.mu.Unlock()
			continue
		}
		var st statusRoles
		if json.Unmarshal(body, &st) == nil && st.Leadership != nil {
			if m.roles[n.Name] == nil {
				m.roles[n.Name] = map[time.Time]bool{}
			}
			for _, r := range st.Leadership.Roles {
				m.roles[n.Name][r.At] = r.Leader
			}
		}
		m.mu.Unlock()
	}
	if ctx.Err() != nil {
		// Stopped during the poll: the reads it cancelled found no kilo0,
		// which says nothing of the nodes (a sample of no leader at the
		// end of a run failed TestRollingSwitch once).
		return
	}
	m.mu.Lock()
	m.samples = append(m.samples, sample{at: now, leaders: leaders})
	m.mu.Unlock()
}

// Kilo0Configured reports whether the node's kilo0 is up with an address,
// as a leader's is (a non-leader's is down, a powered-off node has none).
func (n *Node) Kilo0Configured(ctx context.Context) (bool, error) {
	out, err := run(ctx, "ip", "-n", n.NS, "-o", "-4", "addr", "show", "dev", Iface, "up")
	if err != nil {
		return false, nil // no kilo0
	}
	return strings.Contains(out, "inet "), nil
}

// Stop ends the monitoring.
func (m *LeadershipMonitor) Stop() {
	m.cancel()
	<-m.done
	m.mu.Lock()
	if m.stopped.IsZero() {
		m.stopped = time.Now()
	}
	m.mu.Unlock()
}

type interval struct{ from, to time.Time }

// intervals are the times each node led, by its own history.
func (m *LeadershipMonitor) intervals() map[string][]interval {
	out := map[string][]interval{}
	for name, changes := range m.roles {
		ts := make([]time.Time, 0, len(changes))
		for t := range changes {
			ts = append(ts, t)
		}
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		var open *time.Time
		for _, t := range ts {
			switch {
			case changes[t] && open == nil:
				tt := t
				open = &tt
			case !changes[t] && open != nil:
				out[name] = append(out[name], interval{*open, t})
				open = nil
			}
		}
		if open != nil {
			end := m.stopped
			if off, ok := m.offAt[name]; ok && off.After(*open) {
				end = off
			}
			out[name] = append(out[name], interval{*open, end})
		}
		// Powered off: it leads no more; and only the monitored time counts
		// (every node briefly leads while the mesh starts, as with kg).
		var kept []interval
		for _, iv := range out[name] {
			if off, ok := m.offAt[name]; ok && iv.to.After(off) {
				iv.to = off
			}
			iv.from = later(iv.from, m.started)
			if iv.to.After(iv.from) {
				kept = append(kept, iv)
			}
		}
		out[name] = kept
	}
	return out
}

// LeadershipResult is what the monitor saw.
type LeadershipResult struct {
	// MaxOverlap is the longest time two nodes were both leader by their
	// histories; Overlaps describes each.
	MaxOverlap time.Duration
	Overlaps   []string
	// SampledOverlaps counts samples with two kilo0 configured, and
	// MaxSampledOverlap is the longest run of them (to the next sample).
	SampledOverlaps, Samples int
	MaxSampledOverlap        time.Duration
	Polls, PollErrors        int
	// Changes counts role changes seen, by node.
	Changes map[string]int
}

// Result computes what the monitor saw so far (call after Stop).
func (m *LeadershipMonitor) Result() LeadershipResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := LeadershipResult{Samples: len(m.samples), Polls: m.polls, PollErrors: m.errs, Changes: map[string]int{}}
	iv := m.intervals()
	names := make([]string, 0, len(iv))
	for n := range iv {
		names = append(names, n)
	}
	sort.Strings(names)
	for n, c := range m.roles {
		r.Changes[n] = len(c)
	}
	for i, a := range names {
		for _, b := range names[i+1:] {
			for _, x := range iv[a] {
				for _, y := range iv[b] {
					from, to := later(x.from, y.from), earlier(x.to, y.to)
					if d := to.Sub(from); d > 0 {
						r.Overlaps = append(r.Overlaps, fmt.Sprintf("%s and %s both leader for %v from %s", a, b, d, from.Format("15:04:05.000")))
						r.MaxOverlap = max(r.MaxOverlap, d)
					}
				}
			}
		}
	}
	var runFrom time.Time
	for i, s := range m.samples {
		if len(s.leaders) < 2 {
			runFrom = time.Time{}
			continue
		}
		r.SampledOverlaps++
		r.Overlaps = append(r.Overlaps, fmt.Sprintf("kilo0 configured on %s at %s", strings.Join(s.leaders, " and "), s.at.Format("15:04:05.000")))
		if runFrom.IsZero() {
			runFrom = s.at
		}
		// Until the next sample at least.
		end := s.at
		if i+1 < len(m.samples) {
			end = m.samples[i+1].at
		}
		r.MaxSampledOverlap = max(r.MaxSampledOverlap, end.Sub(runFrom))
	}
	return r
}

// Check returns an error when leadership split, by the histories (for
// longer than HandoverWindow) or in any sample.
func (r LeadershipResult) Check() error {
	if r.MaxOverlap > HandoverWindow || r.MaxSampledOverlap > HandoverWindow || r.SampledOverlaps > 0 {
		return fmt.Errorf("leadership split for %v by the histories, %v by kilo0 samples (the handover window is %v): %s",
			r.MaxOverlap, r.MaxSampledOverlap, HandoverWindow, strings.Join(r.Overlaps, "; "))
	}
	return nil
}

// String is for RESULT lines.
func (r LeadershipResult) String() string {
	return fmt.Sprintf("leadership overlap: max %v by the agents' role histories (%d polls, %d failed), %d of %d kilo0 samples with two leaders (%v)",
		r.MaxOverlap, r.Polls, r.PollErrors, r.SampledOverlaps, r.Samples, r.MaxSampledOverlap)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// LeaderSample is one sample of the nodes whose kilo0 was configured as a
// leader's (up with an address).
type LeaderSample struct {
	At      time.Time
	Leaders []string
}

// Samples returns the kilo0 samples so far, oldest first: with kg-run
// nodes among the monitored ones (they report no role history), this is
// how their leadership is seen.
func (m *LeadershipMonitor) Samples() []LeaderSample {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]LeaderSample, len(m.samples))
	for i, s := range m.samples {
		out[i] = LeaderSample{At: s.at, Leaders: append([]string(nil), s.leaders...)}
	}
	return out
}
