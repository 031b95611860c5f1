package wg

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	testingclock "k8s.io/utils/clock/testing"
)

// TestAssessSession walks the rule through sequences of samples taken every
// 100 ms: what a half-dead session, a one-way flow, an idle peer and a gone
// peer each lead to.
func TestAssessSession(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0.Add(-30 * time.Second) // a session this side believes alive
	type step struct {
		rx, tx int64
		hs     time.Time
		want   sessionAction
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
			var st sessionState
			for i, s := range tt.steps {
				var got sessionAction
				st, got = assessSession(st, sessionSample{rx: s.rx, tx: s.tx, handshake: s.hs}, t0.Add(time.Duration(i)*100*time.Millisecond), DefaultSessionPolicy)
				if got != s.want {
					t.Fatalf("step %d (rx %d tx %d): action %d, want %d", i, s.rx, s.tx, got, s.want)
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
		want  sessionAction
	}{
		{0, 100, sessionOK},
		{time.Second, 100, sessionOK},
		{time.Second, 200, sessionOK}, // sent within the last second, nothing back
		{100 * time.Millisecond, 300, sessionProbe},
		{100 * time.Millisecond, 400, sessionOK},
		{100 * time.Millisecond, 500, sessionOK},
		{100 * time.Millisecond, 600, sessionRepair},
	}
	var st sessionState
	at := t0
	for i, s := range steps {
		at = at.Add(s.after)
		var got sessionAction
		st, got = assessSession(st, sessionSample{rx: 100, tx: s.tx, handshake: hs}, at, DefaultSessionPolicy)
		if got != s.want {
			t.Fatalf("step %d (+%v, tx %d): action %d, want %d", i, s.after, s.tx, got, s.want)
		}
	}
}

// TestAssessSessionBackoff: a peer that stays silent is re-established at
// most every MinBackoff, then less and less often (doubling to MaxBackoff).
func TestAssessSessionBackoff(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0
	var st sessionState
	var repairs []time.Duration
	tx := int64(100)
	for ms := 0; ms <= 40_000; ms += 100 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		tx += 10
		var act sessionAction
		st, act = assessSession(st, sessionSample{rx: 50, tx: tx, handshake: hs}, now, DefaultSessionPolicy)
		if act == sessionRepair {
			repairs = append(repairs, now.Sub(t0))
		}
	}
	// Unanswered from 0 ms, probed at 200 ms, repaired at 500 ms; then 5 s,
	// 10 s, 20 s after the previous repair.
	want := []time.Duration{500 * time.Millisecond, 5500 * time.Millisecond, 15500 * time.Millisecond, 35500 * time.Millisecond}
	if len(repairs) != len(want) {
		t.Fatalf("repairs at %v, want %v", repairs, want)
	}
	for i := range want {
		if repairs[i] != want[i] {
			t.Fatalf("repairs at %v, want %v", repairs, want)
		}
	}
}

// TestAssessSessionRepairWorks: a kg peer that forgets the session every
// 3 s (a kg rewriting its device on every change) is repaired after each
// rewrite, 500 ms after it, because every repair worked (the peer answered
// the new session): no back-off is earned, unlike a silent peer's.
func TestAssessSessionRepairWorks(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0
	var st sessionState
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
		var act sessionAction
		st, act = assessSession(st, sessionSample{rx: rx, tx: tx, handshake: hs}, now, DefaultSessionPolicy)
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
			var st sessionState
			var act sessionAction
			for i, s := range halfDead {
				st, act = assessSession(st, s, t0.Add(time.Duration(i)*100*time.Millisecond), DefaultSessionPolicy)
			}
			if act != sessionRepair {
				t.Fatalf("no repair at %d ms: %d", repairedAt*100, act)
			}
			w := &sessionWatch{policy: DefaultSessionPolicy, peers: map[wgtypes.Key]sessionState{testKey(1): st}}
			if !w.pending() {
				t.Fatal("a just repaired peer is not sampled fast")
			}
			var retries []time.Duration
			for ms := 100; ms <= 4_000; ms += 100 {
				now := t0.Add(time.Duration(repairedAt*100+ms) * time.Millisecond)
				st, act = assessSession(st, tt.after(ms), now, DefaultSessionPolicy)
				switch act {
				case sessionRetry:
					retries = append(retries, time.Duration(ms)*time.Millisecond)
				case sessionOK:
				default:
					t.Fatalf("%d ms after the repair: action %d", ms, act)
				}
			}
			if fmt.Sprint(retries) != fmt.Sprint(tt.want) {
				t.Fatalf("retries at %v after the repair, want %v", retries, tt.want)
			}
			w.peers[testKey(1)] = st
			if w.pending() {
				t.Error("still sampled fast 4 s after the repair")
			}
		})
	}
}

// TestWatchRepairsHalfDeadSession: on the device, a kg peer (SessionProbe
// set) whose traffic goes unanswered is probed, then removed and added back
// in one configuration, keeping the endpoint it is at; a meshlet peer in the
// same state is left alone.
func TestWatchRepairsHalfDeadSession(t *testing.T) {
	ctx := context.Background()
	priv, _ := wgtypes.GeneratePrivateKey()
	fc := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
	m, err := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc})
	if err != nil {
		t.Fatal(err)
	}
	kg := PeerSpec{Name: "kg", PublicKey: testKey(1), Endpoint: "192.0.2.1:51820", AllowedIPs: pfx("10.4.0.2/32"),
		PersistentKeepalive: 25 * time.Second, Roaming: true, SessionProbe: netip.MustParseAddr("10.4.0.2")}
	ml := PeerSpec{Name: "meshlet", PublicKey: testKey(2), Endpoint: "192.0.2.2:51820", AllowedIPs: pfx("10.4.0.3/32")}
	if _, err := m.Apply(ctx, DeviceSpec{ListenPort: 51820, Peers: []PeerSpec{kg, ml}}); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	for i := range fc.dev.Peers {
		fc.dev.Peers[i].LastHandshakeTime = now.Add(-10 * time.Second)
		fc.dev.Peers[i].ReceiveBytes = 1000
	}
	fc.dev.Peers[0].Endpoint = udp("198.51.100.7:40000") // roamed
	sw := &sessionWatch{policy: DefaultSessionPolicy}
	var repaired []string
	clk := testingclock.NewFakeClock(now)
	o := WatchOptions{Sessions: true, Clock: clk, OnRepair: func(p string) { repaired = append(repaired, p) }}
	var probed []netip.Addr
	configs := len(fc.configs)
	for i := 0; i < 10; i++ {
		for j := range fc.dev.Peers {
			fc.dev.Peers[j].TransmitBytes += 100 // sending, nothing comes back
		}
		_, p, _, err := m.watchOnce(ctx, sw, o, false, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		probed = append(probed, p...)
		clk.Step(100 * time.Millisecond)
	}
	if len(probed) != 1 || probed[0] != kg.SessionProbe {
		t.Errorf("probed %v, want one probe of %v", probed, kg.SessionProbe)
	}
	if len(repaired) != 1 || repaired[0] != "kg" {
		t.Fatalf("repaired %v, want [kg]", repaired)
	}
	cfg := fc.configs[len(fc.configs)-1]
	if len(fc.configs) != configs+1 || len(cfg.Peers) != 2 || !cfg.Peers[0].Remove || cfg.Peers[1].Remove ||
		cfg.Peers[0].PublicKey != wgtypes.Key(kg.PublicKey) || cfg.Peers[1].PublicKey != wgtypes.Key(kg.PublicKey) {
		t.Fatalf("configs sent: %+v", fc.configs[configs:])
	}
	if cfg.ReplacePeers || cfg.Peers[1].Endpoint.String() != "198.51.100.7:40000" || len(cfg.Peers[1].AllowedIPs) != 1 {
		t.Errorf("re-added peer %+v: want its roamed endpoint and allowed IPs, no ReplacePeers", cfg.Peers[1])
	}
}

// TestWatchRetriesUnansweredFreshHandshake: on the device, a repaired kg
// peer whose fresh handshake goes unanswered (the re-created peer sent an
// initiation, received nothing) is removed and added back once more 1 s
// after the repair, and only once.
func TestWatchRetriesUnansweredFreshHandshake(t *testing.T) {
	ctx := context.Background()
	priv, _ := wgtypes.GeneratePrivateKey()
	fc := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
	m, err := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc})
	if err != nil {
		t.Fatal(err)
	}
	kg := PeerSpec{Name: "kg", PublicKey: testKey(1), Endpoint: "192.0.2.1:51820", AllowedIPs: pfx("10.4.0.2/32"),
		SessionProbe: netip.MustParseAddr("10.4.0.2")}
	if _, err := m.Apply(ctx, DeviceSpec{ListenPort: 51820, Peers: []PeerSpec{kg}}); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	fc.dev.Peers[0].LastHandshakeTime = now.Add(-10 * time.Second)
	fc.dev.Peers[0].ReceiveBytes = 1000
	sw := &sessionWatch{policy: DefaultSessionPolicy}
	var repaired []time.Duration
	clk := testingclock.NewFakeClock(now)
	o := WatchOptions{Sessions: true, Clock: clk, OnRepair: func(string) { repaired = append(repaired, clk.Since(now)) }}
	for i := 0; i < 40; i++ {
		if len(repaired) == 0 {
			fc.dev.Peers[0].TransmitBytes += 100 // the half-dead session
		} else {
			fc.dev.Peers[0].TransmitBytes = 148 // the re-created peer's initiation, unanswered
		}
		if _, _, _, err := m.watchOnce(ctx, sw, o, false, time.Time{}); err != nil {
			t.Fatal(err)
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
