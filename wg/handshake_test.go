package wg

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestAddedPeerHandshakes re-creates B's side of an established session, as
// a rolling update does to a userspace device: B's device forgets A and a
// new Manager (a new agent) adds A back, while A pings B over the session
// it still holds. A's packets are dropped at B until someone handshakes:
// with InitiateHandshakes B does at once; without it, A's timers give up on
// the old session only after 5-15 s (docs/wireguard.md).
func TestAddedPeerHandshakes(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name     string
		initiate bool
	}{{"initiated", true}, {"control: not initiated", false}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t)
			p.b.apply(t, p.planB)
			p.a.apply(t, p.planA)
			waitPing(t, p.a.ns, "10.4.0.2", 10*time.Second)
			pings := startPinger(t, p.a.ns, "10.4.0.2")
			if _, ok := pings.next(5 * time.Second); !ok {
				t.Fatal("no ping replies before B's device was re-created")
			}

			// B's device loses its peers, then a fresh agent configures it.
			if err := p.b.client.ConfigureDevice(p.b.dev, wgtypes.Config{ReplacePeers: true}); err != nil {
				t.Fatal(err)
			}
			fresh, err := NewManager(Config{Interface: p.b.dev, PrivateKey: p.b.mgr.key, Client: p.b.client,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			recreated := time.Now()
			rep, err := fresh.Apply(context.Background(), p.planB)
			if err != nil || len(rep.Added) != 1 {
				t.Fatalf("fresh apply: %+v, %v", rep, err)
			}
			if tc.initiate {
				n, err := fresh.InitiateHandshakes(context.Background())
				if err != nil || n != 1 {
					t.Fatalf("InitiateHandshakes = %d, %v; want 1 peer", n, err)
				}
				// Nothing is left to start, and the peer is as planned.
				if n, err := fresh.InitiateHandshakes(context.Background()); n != 0 || err != nil {
					t.Fatalf("second InitiateHandshakes = %d, %v; want 0", n, err)
				}
				dev, err := p.b.client.Device(p.b.dev)
				if err != nil {
					t.Fatal(err)
				}
				if ka := dev.Peers[0].PersistentKeepaliveInterval; ka != 0 {
					t.Fatalf("keepalive left at %v; the plan has none", ka)
				}
			}
			resumed := pings.resumedAfter(recreated, 20*time.Second)
			gap := resumed.Sub(recreated).Round(time.Millisecond)
			switch {
			case tc.initiate && resumed.IsZero():
				t.Fatal("replies did not resume within 20 s of B's device being re-created")
			case tc.initiate && gap > 3*time.Second:
				t.Fatalf("replies resumed %v after B's device was re-created: B's handshake did not bring them back", gap)
			case !tc.initiate && !resumed.IsZero() && gap < 3*time.Second:
				t.Fatalf("control: replies resumed %v later without a handshake from B; the stale session was not reproduced", gap)
			}
			t.Logf("B's device re-created (handshake initiated: %v): A's pings answered again %v later", tc.initiate, gap)
		})
	}
}
