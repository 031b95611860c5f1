package wg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	testingclock "k8s.io/utils/clock/testing"
)

func newFakeManager(t *testing.T) (*Manager, *fakeClient) {
	t.Helper()
	priv, _ := wgtypes.GeneratePrivateKey()
	fc := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
	m, err := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc, Resolver: fakeResolver{}})
	if err != nil {
		t.Fatal(err)
	}
	return m, fc
}

// TestApplyAgainstMemory: once the device is known, an apply reads
// nothing and sends only what changed; after drift or a failed write the
// next apply reads the device and restores it.
func TestApplyAgainstMemory(t *testing.T) {
	ctx := context.Background()
	m, fc := newFakeManager(t)
	plan := DeviceSpec{ListenPort: 51820, Peers: benchPeers(50)}
	if rep, err := m.Apply(ctx, plan); err != nil || len(rep.Added) != 50 {
		t.Fatalf("first apply: %+v %v", rep, err)
	}
	if fc.readCount() != 1 {
		t.Fatalf("first apply read the device %d times, want 1", fc.readCount())
	}
	plan.Peers[7].AllowedIPs = pfx("10.99.0.0/24")
	rep, err := m.Apply(ctx, plan)
	if err != nil || len(rep.Updated) != 1 || rep.Updated[0].Name != "p7" || rep.PeersTouched() != 1 {
		t.Fatalf("one-peer change: %+v %v", rep, err)
	}
	if fc.readCount() != 1 {
		t.Fatalf("an apply against memory read the device")
	}
	if last := fc.configs[len(fc.configs)-1]; len(last.Peers) != 1 || !last.Peers[0].UpdateOnly {
		t.Fatalf("sent %+v, want one UpdateOnly peer", last)
	}

	// Behind meshlet's back: p3 removed. The watch's read sees it; the next
	// apply reads the device and puts p3 back.
	fc.edit(func(d *wgtypes.Device) {
		d.Peers = slices.DeleteFunc(d.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == plan.Peers[3].PublicKey })
	})
	if rep, _ := m.Apply(ctx, plan); rep.Changed() {
		t.Fatalf("without a read the memory cannot know: %+v", rep)
	}
	if drifted, _, err := m.watchOnce(ctx, WatchOptions{}.withDefaults(), false, time.Time{}); err != nil || !drifted {
		t.Fatalf("drift not seen: %v %v", drifted, err)
	}
	rep, err = m.Apply(ctx, plan)
	if err != nil || len(rep.Added) != 1 || rep.Added[0].Name != "p3" {
		t.Fatalf("apply after drift: %+v %v, want p3 added back", rep, err)
	}

	// A failed write: the device state is unknown, the next apply reads it.
	reads := fc.readCount()
	fc.failSet = errors.New("device busy")
	plan.Peers[9].PersistentKeepalive = 5 * time.Second
	if _, err := m.Apply(ctx, plan); err == nil {
		t.Fatal("write error swallowed")
	}
	fc.failSet = nil
	if rep, err := m.Apply(ctx, plan); err != nil || len(rep.Updated) != 1 || fc.readCount() != reads+1 {
		t.Fatalf("apply after a failed write: %+v %v, %d reads", rep, err, fc.readCount()-reads)
	}
}

// TestDiffAppliedMatchesDiff: on random sequences of plans, a Manager
// applying against memory leaves the device exactly as one that reads the
// device before every apply, and reports the same changes.
func TestDiffAppliedMatchesDiff(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]wgtypes.Key, 12)
	for i := range keys {
		keys[i] = testKey(byte(i + 1))
	}
	resolver := fakeResolver{"dns.example": {netip.MustParseAddr("192.0.2.50")}}
	randomPlan := func() DeviceSpec {
		var d DeviceSpec
		d.ListenPort = 51820 + rng.IntN(2)
		for i, k := range keys {
			if rng.IntN(4) == 0 {
				continue
			}
			p := PeerSpec{Name: fmt.Sprintf("p%d", i), PublicKey: k, Roaming: rng.IntN(2) == 0,
				PersistentKeepalive: time.Duration(rng.IntN(2)*25) * time.Second}
			switch rng.IntN(4) {
			case 0:
			case 1:
				p.Endpoint = "dns.example:51820"
			default:
				p.Endpoint = fmt.Sprintf("192.0.2.%d:51820", rng.IntN(3)+1)
			}
			for range rng.IntN(3) + 1 {
				p.AllowedIPs = append(p.AllowedIPs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), byte(rng.IntN(3)), 0}), 24))
			}
			if rng.IntN(5) == 0 {
				psk := testKey(0xee)
				p.PresharedKey = &psk
			}
			d.Peers = append(d.Peers, p)
		}
		rng.Shuffle(len(d.Peers), func(i, j int) { d.Peers[i], d.Peers[j] = d.Peers[j], d.Peers[i] })
		return d
	}
	priv, _ := wgtypes.GeneratePrivateKey()
	for run := range 50 {
		memDev, readDev := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}, &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
		mem, _ := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: memDev, Resolver: resolver})
		read, _ := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: readDev, Resolver: resolver})
		for step := range 8 {
			plan := randomPlan()
			read.stale = true // read before every apply
			r1, err1 := mem.Apply(ctx, plan)
			r2, err2 := read.Apply(ctx, plan)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			// Endpoints are compared on the devices: memory writes one again
			// where it cannot know what the device holds (a peer that stops
			// roaming, a configured endpoint changed back to the address the
			// device kept), which leaves the device as it is.
			if !reflect.DeepEqual(changeSet(r1), changeSet(r2)) || r1.ListenPort != r2.ListenPort || r1.PrivateKey != r2.PrivateKey {
				t.Fatalf("run %d step %d: against memory %+v, against the device %+v", run, step, r1, r2)
			}
			if a, b := devicePeers(memDev), devicePeers(readDev); !reflect.DeepEqual(a, b) {
				t.Fatalf("run %d step %d: devices differ:\nmemory %v\nread   %v", run, step, a, b)
			}
		}
	}
}

// changeSet is what a report says of each peer, endpoint updates aside.
func changeSet(r Report) map[string]string {
	out := map[string]string{}
	for _, c := range r.Added {
		out[c.PublicKey.String()] = "added"
	}
	for _, c := range r.Removed {
		out[c.PublicKey.String()] = "removed"
	}
	for _, c := range r.Updated {
		fields := slices.DeleteFunc(slices.Clone(c.Fields), func(f string) bool { return f == FieldEndpoint })
		if len(fields) > 0 {
			out[c.PublicKey.String()] = fmt.Sprint(fields)
		}
	}
	return out
}

func devicePeers(f *fakeClient) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for _, p := range f.dev.Peers {
		var ips []string
		for _, n := range p.AllowedIPs {
			ips = append(ips, n.String())
		}
		slices.Sort(ips)
		out[p.PublicKey.String()] = fmt.Sprintf("%v %v %v", p.Endpoint, p.PersistentKeepaliveInterval, ips)
	}
	return out
}

// fakeFeed stands for a device's change feed.
func fakeFeed(m *Manager) chan int {
	ch := make(chan int, 16)
	m.subscribeFn = func() (*changeSub, error) {
		a, _ := net.Pipe()
		return &changeSub{C: ch, conn: a}, nil
	}
	return ch
}

// eventually waits (real time) for cond: the watch runs in its own
// goroutine and the fake clock moves only when the test says so.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWatchWithFeed: with a change feed the device is read for a write by
// another process, not for the agent's own writes nor while idle, and at
// least every Backstop.
func TestWatchWithFeed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, fc := newFakeManager(t)
	plan := DeviceSpec{ListenPort: 51820, Peers: benchPeers(3)}
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	feed := fakeFeed(m)
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	drift := m.Watch(ctx, WatchOptions{Clock: clk})
	reads := fc.readCount()
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(29 * time.Second) // idle: no read before the backstop
	feed <- os.Getpid()        // the agent's own write: no read
	feed <- os.Getpid() + 1    // someone else's: one read
	eventually(t, "a read for the foreign write", func() bool { return fc.readCount() > reads })
	if got := fc.readCount() - reads; got != 1 {
		t.Fatalf("%d reads for 29 s idle, one own write and one foreign write; want 1", got)
	}
	select {
	case <-drift:
		t.Fatal("drift signalled for a device that matches the apply")
	default:
	}
	// `wg set kilo0 peer p1 remove` by someone else.
	fc.edit(func(d *wgtypes.Device) { d.Peers = d.Peers[:2] })
	feed <- 0
	select {
	case <-drift:
	case <-time.After(5 * time.Second):
		t.Fatal("a foreign removal was not signalled")
	}
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	// The backstop: a read 30 s after the last one, with no event.
	reads = fc.readCount()
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(30 * time.Second)
	eventually(t, "the backstop read", func() bool { return fc.readCount() == reads+1 })
}

// TestWatchWithoutFeed: without a feed the device is read every Interval,
// less often when a read is expensive (at most ReadShare of the time).
func TestWatchWithoutFeed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, fc := newFakeManager(t)
	if _, err := m.Apply(ctx, DeviceSpec{Peers: benchPeers(3)}); err != nil {
		t.Fatal(err)
	}
	m.subscribeFn = func() (*changeSub, error) { return nil, os.ErrNotExist }
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	fc.onRead = func() { clk.Step(8 * time.Millisecond) } // a read costs 8 ms
	m.Watch(ctx, WatchOptions{Clock: clk})
	reads := fc.readCount()
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(time.Second) // no cost known yet: Interval
	eventually(t, "the first read", func() bool { return fc.readCount() == reads+1 })
	// 8 ms at 0.2 %: the next read 4 s after the last.
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(3 * time.Second)
	eventually(t, "the watch waiting", clk.HasWaiters)
	if fc.readCount() != reads+1 {
		t.Fatalf("read again after 3 s; an 8 ms read may be repeated every 4 s")
	}
	clk.Step(time.Second)
	eventually(t, "the second read", func() bool { return fc.readCount() == reads+2 })
}

// TestWatchSessionReads: counters are read every SessionInterval only while
// a peer with a SessionProbe is applied and carries a flow (FlowRate), every
// QuietInterval while it is quiet or carries less (a health probe's echo).
func TestWatchSessionReads(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, fc := newFakeManager(t)
	plan := DeviceSpec{Peers: benchPeers(3)}
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	fakeFeed(m)
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	m.Watch(ctx, WatchOptions{Clock: clk, Sessions: true, Probe: func(context.Context, netip.Addr) error { return nil }})
	// noReads steps the clock by 1 s, a quarter at a time, and fails if the
	// device was read.
	noReads := func(what string) {
		t.Helper()
		eventually(t, "the watch waiting", clk.HasWaiters)
		reads := fc.readCount()
		for range 4 {
			clk.Step(250 * time.Millisecond)
			eventually(t, "the watch waiting", clk.HasWaiters)
		}
		if got := fc.readCount() - reads; got != 0 {
			t.Fatalf("%d reads in 1 s %s", got, what)
		}
	}
	noReads("without a kg peer")
	reads := fc.readCount()
	plan.Peers[1].SessionProbe = netip.MustParseAddr("10.4.0.2")
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	kg := plan.Peers[1].PublicKey
	sendN := func(n int64) {
		fc.edit(func(d *wgtypes.Device) {
			for i := range d.Peers {
				if d.Peers[i].PublicKey == kg {
					d.Peers[i].TransmitBytes += n
					d.Peers[i].ReceiveBytes += n
				}
			}
		})
	}
	send := func() { sendN(100) }
	// Seen first, then carrying traffic: read every 100 ms.
	for i := range 4 {
		send()
		eventually(t, "the watch waiting", clk.HasWaiters)
		clk.Step(100 * time.Millisecond)
		eventually(t, "a counter read", func() bool { return fc.readCount() == reads+i+1 })
	}
	// Quiet: one more read 100 ms after the last traffic, then one a second.
	reads = fc.readCount()
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(100 * time.Millisecond)
	eventually(t, "the read that finds it quiet", func() bool { return fc.readCount() == reads+1 })
	for i := range 2 {
		noReadsFor := func() {
			for range 3 {
				eventually(t, "the watch waiting", clk.HasWaiters)
				clk.Step(300 * time.Millisecond)
			}
		}
		noReadsFor()
		if got := fc.readCount(); got != reads+1+i {
			t.Fatalf("quiet: %d reads in 0.9 s, want none", got-reads-1-i)
		}
		eventually(t, "the watch waiting", clk.HasWaiters)
		clk.Step(100 * time.Millisecond)
		eventually(t, "the quiet read", func() bool { return fc.readCount() == reads+2+i })
	}
	// A health probe's exchange a second (80 bytes each way, under
	// FlowRate): still one read a second.
	sendN(80)
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(time.Second)
	eventually(t, "the read that sees the probe", func() bool { return fc.readCount() == reads+4 })
	for range 3 {
		eventually(t, "the watch waiting", clk.HasWaiters)
		clk.Step(300 * time.Millisecond)
	}
	if got := fc.readCount(); got != reads+4 {
		t.Fatalf("a probe's traffic brought %d fast reads, want none", got-reads-4)
	}
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(100 * time.Millisecond)
	eventually(t, "the quiet read", func() bool { return fc.readCount() == reads+5 })
	// A flow again (400 B/s): fast reads after the next quiet read sees it.
	sendN(400)
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(time.Second)
	eventually(t, "the read that sees the flow", func() bool { return fc.readCount() == reads+6 })
	send()
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(100 * time.Millisecond)
	eventually(t, "a fast read", func() bool { return fc.readCount() == reads+7 })
	plan.Peers[1].SessionProbe = netip.Addr{}
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	// The timer armed before this apply may still fire once.
	eventually(t, "the watch waiting", clk.HasWaiters)
	clk.Step(250 * time.Millisecond)
	noReads("after the kg peer left")
}
