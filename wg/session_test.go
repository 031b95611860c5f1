package wg

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/meshlet/meshlet/agent/core/sessions"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// The half-dead rule as the agent runs it, one reading at a time: the
// watch records the sample (observe), the planner's rule judges the fact
// (agent/core/sessions, imported by this test only: wg itself imports
// nothing of meshlet), and what it says is recorded as ActOnSessions does.

const (
	sessionOK     = "ok"
	sessionProbe  = "probe"
	sessionRepair = "recreate"
	sessionRetry  = "retry"
)

// observation is a fact in the planner's terms (as agent/runtime/node
// translates it).
func observation(f SessionFact) topology.SessionObservation {
	return topology.SessionObservation{PublicKey: topology.Key(f.PublicKey), At: f.At, Rx: f.Rx, Tx: f.Tx, Handshake: f.Handshake,
		UnansweredFrom: f.UnansweredFrom, UnansweredSeen: f.UnansweredSeen, Probed: f.Probed, Recreated: f.Recreated,
		Unheard: f.Unheard, Retried: f.Retried}
}

// ruled is one watched session and the plan's last recheck.
type ruled struct {
	st      sessionState
	recheck time.Time
}

// assessSession takes sample s at now through the watch, the rule and
// the action's record, and returns what the rule said.
func assessSession(r ruled, s sessionSample, now time.Time) (ruled, string) {
	r.st, _ = observe(r.st, s, now)
	acts := sessions.Judge([]topology.SessionObservation{observation(r.st.fact(testKey(1)))}, sessions.DefaultPolicy)
	if acts == nil {
		r.recheck = time.Time{}
		return r, sessionOK
	}
	r.recheck = acts.Recheck
	switch {
	case len(acts.Probe) > 0:
		r.st.probedAt(now)
		return r, sessionProbe
	case len(acts.Recreate) > 0:
		r.st.recreatedAt(now, false)
		return r, sessionRepair
	case len(acts.Retry) > 0:
		r.st.recreatedAt(now, true)
		return r, sessionRetry
	}
	return r, sessionOK
}

func (r ruled) pending() bool {
	w := sessionWatch{peers: map[wgtypes.Key]sessionState{testKey(1): r.st}, recheck: r.recheck}
	return w.pending()
}

// TestAssessSession walks the rule through sequences of samples taken every
// 100 ms: what a half-dead session, a one-way flow, an idle peer and a gone
// peer each lead to.
func TestAssessSession(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0.Add(-30 * time.Second) // a session this side believes alive
	type step struct {
		rx, tx int64
		hs     time.Time
		want   string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"answered traffic stays OK", []step{
			{100, 100, hs, sessionOK}, {200, 200, hs, sessionOK}, {300, 300, hs, sessionOK}, {400, 400, hs, sessionOK},
		}},
		{"idle peer stays OK", []step{
			{100, 100, hs, sessionOK}, {100, 100, hs, sessionOK}, {100, 100, hs, sessionOK}, {100, 100, hs, sessionOK},
		}},
		{"half-dead: probe 200 ms after the last reading with an answer, re-established 300 ms later", []step{
			{100, 100, hs, sessionOK},
			{100, 200, hs, sessionOK},    // sent since the last reading, nothing back
			{100, 300, hs, sessionProbe}, // 200 ms
			{100, 400, hs, sessionOK},
			{100, 500, hs, sessionOK},
			{100, 600, hs, sessionRepair}, // 300 ms after the probe
		}},
		// A one-way flow costs one probe per ~300 ms, never a repair.
		{"one-way flow: every probe is answered, nothing re-established", []step{
			{100, 100, hs, sessionOK},
			{100, 200, hs, sessionOK},
			{100, 300, hs, sessionProbe},
			{164, 400, hs, sessionOK}, // the echo reply came back through the session
			{164, 500, hs, sessionOK},
			{164, 600, hs, sessionProbe},
			{228, 700, hs, sessionOK},
			{228, 800, hs, sessionOK},
		}},
		{"a new handshake counts as an answer", []step{
			{100, 100, hs, sessionOK},
			{100, 200, hs, sessionOK},
			{100, 300, hs, sessionProbe},
			{100, 400, t0, sessionOK},
			{100, 500, t0, sessionOK},
			{100, 600, t0, sessionProbe}, // still one-way after it: probe again
		}},
		{"no session believed alive: WireGuard handshakes by itself", []step{
			{100, 100, t0.Add(-181 * time.Second), sessionOK},
			{100, 200, t0.Add(-181 * time.Second), sessionOK},
			{100, 300, t0.Add(-181 * time.Second), sessionOK},
			{100, 400, t0.Add(-181 * time.Second), sessionOK},
			{100, 500, t0.Add(-181 * time.Second), sessionOK},
		}},
		{"never handshaked: nothing to repair", []step{
			{0, 100, time.Time{}, sessionOK}, {0, 200, time.Time{}, sessionOK}, {0, 300, time.Time{}, sessionOK},
			{0, 400, time.Time{}, sessionOK}, {0, 500, time.Time{}, sessionOK},
		}},
		{"counters restart (peer re-created): a fresh start", []step{
			{100, 100, hs, sessionOK}, {100, 200, hs, sessionOK}, {0, 10, hs, sessionOK}, {0, 10, hs, sessionOK},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st ruled
			for i, s := range tt.steps {
				var got string
				st, got = assessSession(st, sessionSample{rx: s.rx, tx: s.tx, handshake: s.hs}, t0.Add(time.Duration(i)*100*time.Millisecond))
				if got != s.want {
					t.Fatalf("step %d (rx %d tx %d): action %s, want %s", i, s.rx, s.tx, got, s.want)
				}
			}
		})
	}
}

// TestAssessSessionAfterQuietReading: while quiet the counters are read
// every second; a packet the next reading finds unanswered may have left
// just before it, so the rule waits as it does at 100 ms readings (probe
// 200 ms after the earlier of the reading before and 100 ms before this
// one), not at once.
func TestAssessSessionAfterQuietReading(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0.Add(-30 * time.Second)
	steps := []struct {
		after time.Duration // since the reading before
		tx    int64
		want  string
	}{
		{0, 100, sessionOK},
		{time.Second, 100, sessionOK},
		{time.Second, 200, sessionOK}, // sent within the last second, nothing back
		{100 * time.Millisecond, 300, sessionProbe},
		{100 * time.Millisecond, 400, sessionOK},
		{100 * time.Millisecond, 500, sessionOK},
		{100 * time.Millisecond, 600, sessionRepair},
	}
	var st ruled
	at := t0
	for i, s := range steps {
		at = at.Add(s.after)
		var got string
		st, got = assessSession(st, sessionSample{rx: 100, tx: s.tx, handshake: hs}, at)
		if got != s.want {
			t.Fatalf("step %d (+%v, tx %d): action %s, want %s", i, s.after, s.tx, got, s.want)
		}
	}
}

// The back-off of a peer re-created again while silent since its last
// re-creation (sessions.Backoff) is the rule's guard, judged in
// agent/core/sessions (TestJudge); through the watch it does not come into
// play: a re-created peer's counters start from zero and its handshake is
// zero until the peer answers, and the rule re-creates only within a
// session, so every re-creation after the first follows an answer.

// TestAssessSessionRepairWorks: a kg peer that forgets the session every
// 3 s (a kg rewriting its device on every change) is repaired after each
// rewrite, 500 ms after it, because every repair worked (the peer answered
// the new session): no back-off is earned, unlike a silent peer's.
func TestAssessSessionRepairWorks(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0
	var st ruled
	var repairs []time.Duration
	rx, tx := int64(50), int64(100)
	dead := true // the session the peer forgot
	lastRewrite := time.Duration(0)
	for ms := 0; ms <= 12_000; ms += 100 {
		at := time.Duration(ms) * time.Millisecond
		now := t0.Add(at)
		if at-lastRewrite >= 3*time.Second {
			dead, lastRewrite = true, at // kg rewrites again
		}
		tx += 10
		if !dead {
			rx += 10
		}
		var act string
		st, act = assessSession(st, sessionSample{rx: rx, tx: tx, handshake: hs}, now)
		if act == sessionRepair {
			repairs = append(repairs, at)
			dead, hs = false, now // the fresh handshake the repair starts is answered
		}
	}
	// Answered until the sample before each rewrite, so detected 500 ms
	// after that sample.
	want := []time.Duration{500 * time.Millisecond, 3400 * time.Millisecond, 6400 * time.Millisecond, 9400 * time.Millisecond}
	if len(repairs) != len(want) {
		t.Fatalf("repairs at %v, want %v", repairs, want)
	}
	for i := range want {
		if repairs[i] != want[i] {
			t.Fatalf("repairs at %v, want %v", repairs, want)
		}
	}
}

// TestAssessSessionRetry: a repaired peer whose fresh handshake is lost (a
// kg rewriting its device again right after it started) is re-created once
// more RetryAfter after the repair, not left to WireGuard's REKEY_TIMEOUT;
// once, and only when the fresh handshake was sent and went unanswered.
func TestAssessSessionRetry(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0.Add(-30 * time.Second)
	// Half-dead from the start: repaired at 500 ms (TestAssessSession).
	halfDead := []sessionSample{
		{rx: 100, tx: 100, handshake: hs}, {rx: 100, tx: 200, handshake: hs}, {rx: 100, tx: 300, handshake: hs},
		{rx: 100, tx: 400, handshake: hs}, {rx: 100, tx: 500, handshake: hs}, {rx: 100, tx: 600, handshake: hs},
	}
	const repairedAt = 5 // index of the repair in halfDead
	init := int64(148)   // one handshake initiation
	tests := []struct {
		name string
		// after returns the sample at ms after the repair (counters of
		// the re-created peer).
		after func(ms int) sessionSample
		want  []time.Duration // retries, after the repair
	}{
		{"fresh handshake unanswered: one retry at 1 s", func(int) sessionSample {
			return sessionSample{tx: init}
		}, []time.Duration{time.Second}},
		{"fresh handshake answered: no retry", func(ms int) sessionSample {
			if ms < 100 {
				return sessionSample{tx: init}
			}
			return sessionSample{rx: 92, tx: init + 32, handshake: t0.Add(time.Duration(repairedAt*100+ms) * time.Millisecond)}
		}, nil},
		{"nothing sent after the repair: no retry", func(int) sessionSample {
			return sessionSample{}
		}, nil},
		{"retried and still unanswered: WireGuard's own retransmission after that", func(ms int) sessionSample {
			return sessionSample{tx: init * int64(1+ms/5000)}
		}, []time.Duration{time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st ruled
			var act string
			for i, s := range halfDead {
				st, act = assessSession(st, s, t0.Add(time.Duration(i)*100*time.Millisecond))
			}
			if act != sessionRepair {
				t.Fatalf("no repair at %d ms: %s", repairedAt*100, act)
			}
			if !st.pending() {
				t.Fatal("a just repaired peer is not sampled fast")
			}
			var retries []time.Duration
			for ms := 100; ms <= 4_000; ms += 100 {
				now := t0.Add(time.Duration(repairedAt*100+ms) * time.Millisecond)
				st, act = assessSession(st, tt.after(ms), now)
				switch act {
				case sessionRetry:
					retries = append(retries, time.Duration(ms)*time.Millisecond)
				case sessionOK:
				default:
					t.Fatalf("%d ms after the repair: action %s", ms, act)
				}
			}
			if fmt.Sprint(retries) != fmt.Sprint(tt.want) {
				t.Fatalf("retries at %v after the repair, want %v", retries, tt.want)
			}
			if st.pending() {
				t.Error("still sampled fast 4 s after the repair")
			}
		})
	}
}

// loopSessions plays the agent's loop for the sessions until ctx ends: at
// every signal of the watch, the facts judged and the actions carried out.
func loopSessions(ctx context.Context, m *Manager, signals <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-signals:
			_ = m.ActOnSessions(ctx, judged(m))
		}
	}
}

// judged is the planner's rule over the manager's facts, in its terms.
func judged(m *Manager) SessionActs {
	var obs []topology.SessionObservation
	for _, f := range m.SessionFacts() {
		obs = append(obs, observation(f))
	}
	var acts SessionActs
	if a := sessions.Judge(obs, sessions.DefaultPolicy); a != nil {
		for _, k := range a.Probe {
			acts.Probe = append(acts.Probe, wgtypes.Key(k))
		}
		for _, k := range a.Recreate {
			acts.Recreate = append(acts.Recreate, wgtypes.Key(k))
		}
		for _, k := range a.Retry {
			acts.Retry = append(acts.Retry, wgtypes.Key(k))
		}
		acts.Recheck = a.Recheck
	}
	return acts
}

// kgPeer is a kg-run peer: under the half-dead rule.
var kgPeer = PeerSpec{Name: "kg", PublicKey: testKey(1), Endpoint: "192.0.2.1:51820", AllowedIPs: pfx("10.4.0.2/32"),
	SessionProbe: netip.MustParseAddr("10.4.0.2")}

// newSessionManager is a Manager on a fake device with peers applied, its
// session facts and actions stamped by clk (as Watch's clock does).
func newSessionManager(ctx context.Context, t *testing.T, clk clock.Clock, peers ...PeerSpec) (*Manager, *fakeClient) {
	t.Helper()
	m, fc := newFakeManager(t)
	if _, err := m.Apply(ctx, DeviceSpec{ListenPort: 51820, Peers: peers}); err != nil {
		t.Fatal(err)
	}
	m.watchClock = clk
	return m, fc
}

// judgeAndAct is one run of the loop for the sessions: the manager's
// facts judged by the planner's rule, its actions carried out.
func judgeAndAct(ctx context.Context, t *testing.T, m *Manager) {
	t.Helper()
	if err := m.ActOnSessions(ctx, judged(m)); err != nil {
		t.Fatal(err)
	}
}

// TestActOnSessionsRepairsHalfDeadSession: on the device, a kg peer
// (SessionProbe set) whose traffic goes unanswered is probed, then removed
// and added back in one configuration, keeping the endpoint it is at; a
// meshlet peer in the same state is not watched. The loop runs when the
// watch says so, and once more after every reading (a plan computed again
// from the same facts acts once).
func TestActOnSessionsRepairsHalfDeadSession(t *testing.T) {
	ctx := context.Background()
	kg := kgPeer
	kg.PersistentKeepalive, kg.Roaming = 25*time.Second, true
	ml := PeerSpec{Name: "meshlet", PublicKey: testKey(2), Endpoint: "192.0.2.2:51820", AllowedIPs: pfx("10.4.0.3/32")}
	now := time.Unix(1_800_000_000, 0)
	clk := testingclock.NewFakeClock(now)
	m, fc := newSessionManager(ctx, t, clk, kg, ml)
	for i := range fc.dev.Peers {
		fc.dev.Peers[i].LastHandshakeTime = now.Add(-10 * time.Second)
		fc.dev.Peers[i].ReceiveBytes = 1000
	}
	fc.dev.Peers[0].Endpoint = udp("198.51.100.7:40000") // roamed
	var repaired []string
	var probed []netip.Addr
	o := WatchOptions{Sessions: true, Clock: clk}.withDefaults()
	m.probe = func(_ context.Context, a netip.Addr) error { probed = append(probed, a); return nil }
	m.onRepair = func(p string) { repaired = append(repaired, p) }
	configs := len(fc.configs)
	wakes := 0
	for i := 0; i < 10; i++ {
		for j := range fc.dev.Peers {
			fc.dev.Peers[j].TransmitBytes += 100 // sending, nothing comes back
		}
		wake, _, err := m.watchOnce(ctx, o, false, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if wake {
			wakes++
			judgeAndAct(ctx, t, m)
		}
		judgeAndAct(ctx, t, m) // a run for another reason
		clk.Step(100 * time.Millisecond)
	}
	if len(probed) != 1 || probed[0] != kg.SessionProbe {
		t.Errorf("probed %v, want one probe of %v", probed, kg.SessionProbe)
	}
	if len(repaired) != 1 || repaired[0] != "kg" {
		t.Fatalf("repaired %v, want [kg]", repaired)
	}
	if wakes < 3 {
		t.Errorf("the watch woke the loop %d times, want at least 3 (unanswered, probe due, re-creation due)", wakes)
	}
	cfg := fc.configs[len(fc.configs)-1]
	if len(fc.configs) != configs+1 || len(cfg.Peers) != 2 || !cfg.Peers[0].Remove || cfg.Peers[1].Remove ||
		cfg.Peers[0].PublicKey != wgtypes.Key(kg.PublicKey) || cfg.Peers[1].PublicKey != wgtypes.Key(kg.PublicKey) {
		t.Fatalf("configs sent: %+v", fc.configs[configs:])
	}
	if cfg.ReplacePeers || cfg.Peers[1].Endpoint.String() != "198.51.100.7:40000" || len(cfg.Peers[1].AllowedIPs) != 1 {
		t.Errorf("re-added peer %+v: want its roamed endpoint and allowed IPs, no ReplacePeers", cfg.Peers[1])
	}
	for _, f := range m.SessionFacts() {
		if f.PublicKey != wgtypes.Key(kg.PublicKey) {
			t.Errorf("a session fact of %v, which is not under the rule", f.PublicKey)
		}
	}
}

// TestActOnSessionsRetriesUnansweredFreshHandshake: on the device, a
// repaired kg peer whose fresh handshake goes unanswered (the re-created
// peer sent an initiation, received nothing) is removed and added back once
// more 1 s after the repair, and only once; the watch wakes the loop for it
// (the plan's recheck) without any event.
func TestActOnSessionsRetriesUnansweredFreshHandshake(t *testing.T) {
	ctx := context.Background()
	kg := kgPeer
	now := time.Unix(1_800_000_000, 0)
	clk := testingclock.NewFakeClock(now)
	m, fc := newSessionManager(ctx, t, clk, kg)
	fc.dev.Peers[0].LastHandshakeTime = now.Add(-10 * time.Second)
	fc.dev.Peers[0].ReceiveBytes = 1000
	var repaired []time.Duration
	o := WatchOptions{Sessions: true, Clock: clk}.withDefaults()
	m.probe = func(context.Context, netip.Addr) error { return nil }
	m.onRepair = func(string) { repaired = append(repaired, clk.Since(now)) }
	for i := 0; i < 40; i++ {
		if len(repaired) == 0 {
			fc.dev.Peers[0].TransmitBytes += 100 // the half-dead session
		} else {
			// The re-created peer's initiation, unanswered (a fake device
			// keeps its counters: restart them).
			fc.dev.Peers[0].TransmitBytes, fc.dev.Peers[0].ReceiveBytes, fc.dev.Peers[0].LastHandshakeTime = 148, 0, time.Time{}
		}
		wake, _, err := m.watchOnce(ctx, o, false, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if wake {
			judgeAndAct(ctx, t, m)
		}
		clk.Step(100 * time.Millisecond)
	}
	want := []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond}
	if fmt.Sprint(repaired) != fmt.Sprint(want) {
		t.Fatalf("re-created at %v, want %v (the repair, then one retry 1 s later)", repaired, want)
	}
	last := fc.configs[len(fc.configs)-1]
	if len(last.Peers) != 2 || !last.Peers[0].Remove || last.Peers[1].Remove || last.Peers[1].PublicKey != wgtypes.Key(kg.PublicKey) {
		t.Errorf("the retry's configuration: %+v", last)
	}
	if m.sessions.pending() {
		t.Error("still read fast 3.5 s after the retry")
	}
}

// TestSessionRuleWithLoopLatency: the rule through the watch's own reading
// cadence (readInterval after every act, as ActOnSessions wakes the watch),
// a loop that acts 5 ms after the reading that woke it, and one more run
// right after every re-creation (another event): a half-dead session is
// re-created well within a second, and when its fresh handshake goes
// unanswered the retry comes about RetryAfter later, not a reading cadence
// or WireGuard's 5 s later.
func TestSessionRuleWithLoopLatency(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	clk := testingclock.NewFakeClock(t0)
	m, fc := newSessionManager(ctx, t, clk, kgPeer)
	fc.dev.Peers[0].LastHandshakeTime, fc.dev.Peers[0].ReceiveBytes = t0.Add(-10*time.Second), 1000
	o := WatchOptions{Sessions: true, Clock: clk, FastInterval: 50 * time.Millisecond}.withDefaults()
	m.probe = func(context.Context, netip.Addr) error { return nil }
	var made []time.Duration
	m.onRepair = func(string) { made = append(made, clk.Since(t0)) }
	const delta = 5 * time.Millisecond
	runs := 0
	var first time.Time // the reading that first saw traffic unanswered
	for clk.Since(t0) < 5*time.Second {
		clk.Step(m.readInterval(true, 0, o))
		fc.edit(func(d *wgtypes.Device) {
			p := &d.Peers[0]
			switch len(made) {
			case 0:
				p.TransmitBytes += 100 // into the half-dead session
			case 1:
				p.TransmitBytes = 148 // the re-created peer's initiation, lost
			default:
				if p.ReceiveBytes == 0 { // the retry's initiation, answered
					p.TransmitBytes, p.ReceiveBytes, p.LastHandshakeTime = 148, 92, clk.Now()
				}
			}
		})
		wake, _, err := m.watchOnce(ctx, o, false, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if !wake {
			continue
		}
		if first.IsZero() {
			first = clk.Now()
		}
		clk.Step(delta)
		before := len(made)
		judgeAndAct(ctx, t, m)
		runs++
		if len(made) > before {
			judgeAndAct(ctx, t, m) // a run for another reason, before the next reading
			runs++
		}
	}
	if len(made) != 2 {
		t.Fatalf("re-created at %v, want a repair and one retry", made)
	}
	if d := made[0] - first.Sub(t0); d > 700*time.Millisecond {
		t.Errorf("repaired %v after the first unanswered reading, want within 700 ms", d)
	}
	if gap := made[1] - made[0]; gap < time.Second || gap > time.Second+o.FastInterval+2*delta+50*time.Millisecond {
		t.Errorf("retried %v after the repair, want RetryAfter (1 s) and a reading more at most", gap)
	}
	if m.sessions.pending() {
		t.Error("still read fast after the retry was answered")
	}
	t.Logf("traffic unanswered from %v; re-created at %v; %d runs of the loop", first.Sub(t0), made, runs)
}

// TestFlowing: what the monitor reads fast (FlowRate).
func TestFlowing(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	prev := sessionState{last: sessionSample{rx: 1000, tx: 1000}, lastAt: t0, seen: true}
	for _, c := range []struct {
		name   string
		rx, tx int64 // added since prev
		after  time.Duration
		want   bool
	}{
		{"nothing", 0, 0, time.Second, false},
		{"a health probe's echo in a second", 80, 80, time.Second, false},
		{"a probe and a keepalive in a second", 112, 112, time.Second, false},
		{"a ping every 200 ms", 640, 640, time.Second, true},
		{"one ping in a fast reading's 100 ms", 128, 128, 100 * time.Millisecond, true},
		{"sent only", 0, 400, time.Second, true},
		{"received only", 400, 0, time.Second, true},
		{"a probe's echo over two quiet seconds", 160, 160, 2 * time.Second, false},
		{"any traffic read in the same instant", 1, 0, 0, true},
	} {
		s := sessionSample{rx: prev.last.rx + c.rx, tx: prev.last.tx + c.tx}
		if got := flowing(prev, s, t0.Add(c.after)); got != c.want {
			t.Errorf("%s: flowing %v, want %v", c.name, got, c.want)
		}
	}
}
