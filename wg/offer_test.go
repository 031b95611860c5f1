package wg

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	testingclock "k8s.io/utils/clock/testing"
)

// TestWatchTakesStatsReading: a reading Stats took (the health probes') is
// the watch's next reading of kg-run peers' counters: the device is read
// once a second, not twice, and that reading is judged (traffic going
// unanswered in it brings the fast readings and the session probe).
func TestWatchTakesStatsReading(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, fc := newFakeManager(t)
	plan := DeviceSpec{Peers: benchPeers(3)}
	plan.Peers[1].SessionProbe = netip.MustParseAddr("10.4.0.2")
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	kg := plan.Peers[1].PublicKey
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	fc.edit(func(d *wgtypes.Device) {
		for i := range d.Peers {
			if d.Peers[i].PublicKey == kg {
				d.Peers[i].LastHandshakeTime = clk.Now().Add(-10 * time.Second) // a session
			}
		}
	})
	fakeFeed(m)
	var probes atomic.Int32
	go loopSessions(ctx, m, m.Watch(ctx, WatchOptions{Clock: clk, Sessions: true, FastInterval: 50 * time.Millisecond, Probe: func(context.Context, netip.Addr) error {
		probes.Add(1)
		return nil
	}}))
	step := func(d time.Duration) {
		t.Helper()
		eventually(t, "the watch waiting", clk.HasWaiters)
		clk.Step(d)
	}
	reads := fc.readCount()
	// The first reading sees the peer first, a fast one finds it quiet:
	// from then on one a second.
	step(time.Second)
	eventually(t, "the first reading", func() bool { return fc.readCount() == reads+1 })
	step(100 * time.Millisecond)
	eventually(t, "the reading that finds it quiet", func() bool { return fc.readCount() == reads+2 })
	step(500 * time.Millisecond)
	if _, err := m.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	// The watch took Stats's reading: its next own read is counted from
	// it, not from its own last.
	step(600 * time.Millisecond)
	eventually(t, "the watch waiting", clk.HasWaiters)
	if got := fc.readCount(); got != reads+3 {
		t.Fatalf("%d reads 1.1 s after the watch's last, want 1 (Stats's): the watch did not take its reading", got-reads-2)
	}
	// With no offer since, its own read comes 1.25 s after Stats's (a
	// quarter more for the next offer, which comes about a second after
	// the last).
	step(600 * time.Millisecond)
	eventually(t, "the watch waiting", clk.HasWaiters)
	if got := fc.readCount(); got != reads+3 {
		t.Fatalf("the watch read %d times 1.2 s after Stats's reading, want none", got-reads-3)
	}
	step(50 * time.Millisecond)
	eventually(t, "1.25 s after Stats's reading", func() bool { return fc.readCount() == reads+4 })

	// Traffic going unanswered, seen by Stats's reading alone: judged.
	fc.edit(func(d *wgtypes.Device) {
		for i := range d.Peers {
			if d.Peers[i].PublicKey == kg {
				d.Peers[i].TransmitBytes += 128
			}
		}
	})
	step(300 * time.Millisecond)
	if _, err := m.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	step(50 * time.Millisecond)
	eventually(t, "a fast reading after the unanswered traffic in Stats's reading", func() bool { return fc.readCount() == reads+6 })
	for probes.Load() == 0 {
		step(50 * time.Millisecond)
		if fc.readCount() > reads+12 {
			t.Fatal("no session probe after 300 ms of unanswered traffic")
		}
	}
}

// TestOfferAcrossAWrite: a reading begun before this process last wrote
// the device, or before the watch's own last reading, is not the device as
// it is; Stats does not wait for an apply (mu).
func TestOfferAcrossAWrite(t *testing.T) {
	m, _ := newFakeManager(t)
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	m.watchClock = clk
	d := &wgtypes.Device{Name: "kilo0"}
	t0 := clk.Now()

	m.keepOffer(d, t0, m.writes.Load())
	if of := m.takeOffer(t0.Add(-time.Second)); of == nil || of.dev != d {
		t.Errorf("an offer with no write since: %v, want the reading", of)
	}
	if of := m.takeOffer(t0.Add(-time.Second)); of != nil {
		t.Errorf("an offer taken twice")
	}

	before := m.writes.Load()
	_ = m.configure(wgtypes.Config{})
	m.keepOffer(d, t0, before) // read while the write went out
	if of := m.takeOffer(t0.Add(-time.Second)); of != nil {
		t.Errorf("a reading taken across a write was offered")
	}

	m.keepOffer(d, t0, m.writes.Load())
	_ = m.configure(wgtypes.Config{}) // written after the reading
	if of := m.takeOffer(t0.Add(-time.Second)); of != nil {
		t.Errorf("a reading older than the last write was taken")
	}

	m.keepOffer(d, t0, m.writes.Load())
	if of := m.takeOffer(t0); of != nil {
		t.Errorf("a reading begun when the watch last read was taken as newer")
	}

	// A reading begun while a write goes out (configure's first half),
	// kept after it: the device before the write, not offered.
	m.writes.Add(1)
	inFlight := m.writes.Load()
	m.writes.Add(1)
	m.keepOffer(d, t0, inFlight)
	if of := m.takeOffer(t0.Add(-time.Second)); of != nil {
		t.Errorf("a reading begun during a write was offered")
	}
	m.writes.Add(1)
	if _, err := m.Stats(context.Background()); err != nil {
		t.Fatal(err)
	}
	if of := m.takeOffer(t0.Add(-time.Second)); of != nil {
		t.Errorf("Stats offered a reading taken while a write was going out")
	}
	m.writes.Add(1)

	// Stats while an apply holds mu (resolving a name): it reads anyway.
	m.mu.Lock()
	done := make(chan error, 1)
	go func() {
		_, err := m.Stats(context.Background())
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Stats: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("Stats waited for the apply's lock")
	}
	m.mu.Unlock()
}
