package sessions

import (
	"fmt"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// TestJudge: one observation each, the action due at its reading and when
// to judge it again. (The rule over sequences of readings, with the watch
// that records them: wg/session_test.go.)
func TestJudge(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	hs := t0.Add(-30 * time.Second) // a session this side believes alive
	key := topology.Key{1}
	tests := []struct {
		name    string
		obs     topology.SessionObservation
		want    string // "", "probe", "recreate", "retry"
		recheck time.Time
	}{
		{"answered: nothing", topology.SessionObservation{At: ms(0), Rx: 100, Tx: 100, Handshake: hs}, "", time.Time{}},
		{"unanswered 100 ms: judged again when SuspectAfter is up",
			topology.SessionObservation{At: ms(100), Rx: 100, Tx: 200, Handshake: hs, UnansweredFrom: ms(0), UnansweredSeen: ms(100)}, "", ms(200)},
		{"unanswered 200 ms: probe, judged again when its answer is due",
			topology.SessionObservation{At: ms(200), Rx: 100, Tx: 300, Handshake: hs, UnansweredFrom: ms(0), UnansweredSeen: ms(100)}, "probe", ms(500)},
		{"seen after a quiet second: counted from half SuspectAfter before",
			topology.SessionObservation{At: ms(1000), Rx: 100, Tx: 300, Handshake: hs, UnansweredFrom: ms(0), UnansweredSeen: ms(1000)}, "", ms(1100)},
		{"probed, not answered yet",
			topology.SessionObservation{At: ms(400), Rx: 100, Tx: 500, Handshake: hs, UnansweredFrom: ms(0), UnansweredSeen: ms(100), Probed: ms(210)}, "", ms(510)},
		{"probed 300 ms ago, no answer: re-create, judged again for the fresh handshake",
			topology.SessionObservation{At: ms(510), Rx: 100, Tx: 600, Handshake: hs, UnansweredFrom: ms(0), UnansweredSeen: ms(100), Probed: ms(210)}, "recreate", ms(1510)},
		{"a silent peer re-created once waits MinBackoff after it",
			topology.SessionObservation{At: ms(2000), Rx: 100, Tx: 600, Handshake: hs, UnansweredFrom: ms(1000), UnansweredSeen: ms(1100), Probed: ms(1300),
				Recreated: ms(500), Unheard: 1}, "", ms(5500)},
		{"no session believed alive (REJECT_AFTER_TIME): WireGuard's",
			topology.SessionObservation{At: ms(500), Rx: 100, Tx: 600, Handshake: t0.Add(-181 * time.Second), UnansweredFrom: ms(0), UnansweredSeen: ms(100), Probed: ms(200)}, "", time.Time{}},
		{"never handshaked: WireGuard's",
			topology.SessionObservation{At: ms(500), Tx: 600, UnansweredFrom: ms(0), UnansweredSeen: ms(100)}, "", time.Time{}},
		{"re-created, fresh handshake unanswered: retry window",
			topology.SessionObservation{At: ms(900), Tx: 148, Recreated: ms(500), Unheard: 1}, "", ms(1500)},
		{"re-created, fresh handshake unanswered for RetryAfter: retry",
			topology.SessionObservation{At: ms(1500), Tx: 148, Recreated: ms(500), Unheard: 1}, "retry", time.Time{}},
		{"a fresh handshake sent late: RetryAfter from when it went unanswered",
			topology.SessionObservation{At: ms(1500), Tx: 148, Recreated: ms(500), Unheard: 1, UnansweredFrom: ms(1200), UnansweredSeen: ms(1300)}, "", ms(2200)},
		{"retried already: WireGuard's",
			topology.SessionObservation{At: ms(3000), Tx: 296, Recreated: ms(500), Unheard: 1, Retried: true}, "", time.Time{}},
		{"re-created, nothing sent: nothing",
			topology.SessionObservation{At: ms(3000), Recreated: ms(500), Unheard: 1}, "", time.Time{}},
		{"re-created and answered: nothing",
			topology.SessionObservation{At: ms(3000), Rx: 92, Tx: 180, Handshake: ms(600), Recreated: ms(500)}, "", time.Time{}},
		{"no reading yet", topology.SessionObservation{}, "", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.obs.PublicKey = key
			got := Judge([]topology.SessionObservation{tt.obs}, DefaultPolicy)
			var act string
			var recheck time.Time
			if got != nil {
				switch {
				case len(got.Probe) == 1:
					act = "probe"
				case len(got.Recreate) == 1:
					act = "recreate"
				case len(got.Retry) == 1:
					act = "retry"
				}
				recheck = got.Recheck
				if n := len(got.Probe) + len(got.Recreate) + len(got.Retry); n > 1 || (n == 0 && recheck.IsZero()) {
					t.Fatalf("Judge = %+v", got)
				}
			}
			if act != tt.want || !recheck.Equal(tt.recheck) {
				t.Errorf("action %q, recheck %v; want %q, %v", act, recheck.Sub(t0), tt.want, tt.recheck.Sub(t0))
			}
		})
	}
}

// TestJudgeSeveral: the actions of several sessions, sorted by key, and the
// earliest recheck.
func TestJudgeSeveral(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	hs := t0.Add(-30 * time.Second)
	got := Judge([]topology.SessionObservation{
		{PublicKey: topology.Key{3}, At: t0, Rx: 1, Tx: 9, Handshake: hs, UnansweredFrom: t0.Add(-time.Second), UnansweredSeen: t0.Add(-900 * time.Millisecond)},
		{PublicKey: topology.Key{2}, At: t0, Rx: 1, Tx: 9, Handshake: hs, UnansweredFrom: t0.Add(-time.Second), UnansweredSeen: t0.Add(-900 * time.Millisecond)},
		{PublicKey: topology.Key{1}, At: t0, Rx: 1, Tx: 9, Handshake: hs, UnansweredFrom: t0.Add(-50 * time.Millisecond), UnansweredSeen: t0},
		{PublicKey: topology.Key{4}, At: t0, Rx: 1, Tx: 1, Handshake: hs},
	}, DefaultPolicy)
	if got == nil || fmt.Sprint(got.Probe) != fmt.Sprint([]topology.Key{{2}, {3}}) || len(got.Recreate)+len(got.Retry) != 0 ||
		!got.Recheck.Equal(t0.Add(150*time.Millisecond)) {
		t.Fatalf("Judge = %+v", got)
	}
	if Judge(nil, DefaultPolicy) != nil {
		t.Error("nothing observed, something to do")
	}
}

// TestBackoff: MinBackoff, doubling up to MaxBackoff.
func TestBackoff(t *testing.T) {
	for unheard, want := range []time.Duration{0, 5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute, time.Minute} {
		if got := Backoff(unheard, DefaultPolicy); got != want {
			t.Errorf("Backoff(%d) = %v, want %v", unheard, got, want)
		}
	}
}
