package metrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/wg"
)

type fakeSource struct{ stats []wg.PeerStats }

func (f *fakeSource) Stats(context.Context) (wg.DeviceStats, error) {
	return wg.DeviceStats{Peers: f.stats}, nil
}

func k(i byte) topology.Key { var x topology.Key; x[0] = i; return x }

// TestJudge is the peer health rule against WireGuard's timers: a peer with
// keepalive K may have a handshake up to 180 s + K + 15 s old; one without
// is judged only after traffic was sent to it; one that never handshaked
// only once it had that long.
func TestJudge(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ka := func(s int) time.Duration { return time.Duration(s) * time.Second }
	ago := func(s int) time.Time { return now.Add(-time.Duration(s) * time.Second) }
	tests := []struct {
		name        string
		p           wg.PeerStats
		first, sent time.Time
		state       string
		allowed     int
	}{
		{"keepalive 25, handshake 200 s ago: up", wg.PeerStats{PersistentKeepalive: ka(25), LastHandshake: ago(200)}, ago(3600), time.Time{}, "up", 220},
		{"keepalive 25, handshake 221 s ago: down", wg.PeerStats{PersistentKeepalive: ka(25), LastHandshake: ago(221)}, ago(3600), time.Time{}, "down", 220},
		{"keepalive 250, handshake 400 s ago: up", wg.PeerStats{PersistentKeepalive: ka(250), LastHandshake: ago(400)}, ago(3600), time.Time{}, "up", 445},
		{"keepalive 250, handshake 450 s ago: down", wg.PeerStats{PersistentKeepalive: ka(250), LastHandshake: ago(450)}, ago(3600), time.Time{}, "down", 445},
		{"no keepalive, idle, old handshake: not judged", wg.PeerStats{LastHandshake: ago(3600)}, ago(3600), time.Time{}, "idle", 0},
		{"no keepalive, sent 10 s ago, handshake 100 s ago: up", wg.PeerStats{LastHandshake: ago(100)}, ago(3600), ago(10), "up", 205},
		{"no keepalive, sent 10 s ago, handshake an hour ago: down", wg.PeerStats{LastHandshake: ago(3600)}, ago(3600), ago(10), "down", 205},
		{"no keepalive, sent 200 s ago: idle again", wg.PeerStats{LastHandshake: ago(3600)}, ago(3600), ago(200), "idle", 0},
		{"keepalive, never handshaked, configured 30 s ago: too early", wg.PeerStats{PersistentKeepalive: ka(25)}, ago(30), time.Time{}, "new", 220},
		{"keepalive, never handshaked, configured 5 min ago: never", wg.PeerStats{PersistentKeepalive: ka(25)}, ago(300), time.Time{}, "never", 220},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := Judge(tt.p, now, tt.first, tt.sent)
			if h.State != tt.state || h.Allowed != time.Duration(tt.allowed)*time.Second {
				t.Errorf("Judge = %+v, want %s allowing %d s", h, tt.state, tt.allowed)
			}
		})
	}
}

func TestPeerUpSeries(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := now
	src := &fakeSource{}
	c := NewCollector("kilo0", src, false, func() time.Time { return clock })
	c.SetPeers([]topology.WireGuardPeer{
		{Name: "fresh", Kind: topology.KindRemote, Cluster: "b", PublicKey: k(1)},
		{Name: "stale", Kind: topology.KindSegment, PublicKey: k(2)},
		{Name: "never", Kind: topology.KindPeer, PublicKey: k(3)},
		{Name: "idle", Kind: topology.KindSegment, PublicKey: k(4)},
		{Name: "sending", Kind: topology.KindSegment, PublicKey: k(5)},
	})
	ka := 25 * time.Second
	src.stats = []wg.PeerStats{
		{PublicKey: wgtypes.Key(k(1)), PersistentKeepalive: ka, LastHandshake: now.Add(-100 * time.Second), TransmitBytes: 10},
		{PublicKey: wgtypes.Key(k(2)), PersistentKeepalive: ka, LastHandshake: now.Add(-200 * time.Second), TransmitBytes: 10},
		{PublicKey: wgtypes.Key(k(3)), PersistentKeepalive: ka},
		{PublicKey: wgtypes.Key(k(4)), LastHandshake: now.Add(-time.Hour), TransmitBytes: 50},
		{PublicKey: wgtypes.Key(k(5)), LastHandshake: now.Add(-time.Hour), TransmitBytes: 50},
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	// First scrape: a counter seen once proves no traffic. Then only
	// "sending" sends, 230 s later.
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	clock = now.Add(230 * time.Second)
	src.stats[4].TransmitBytes = 90
	src.stats[0].LastHandshake = clock.Add(-100 * time.Second)
	src.stats[1].LastHandshake = clock.Add(-221 * time.Second)

	want := `
# HELP meshlet_peer_up 1 when the last handshake is as young as the peer's keepalive and traffic allow, 0 when older; absent for idle peers without keepalive and for peers too new to judge.
# TYPE meshlet_peer_up gauge
meshlet_peer_up{cluster="b",interface="kilo0",kind="remote",location="",peer="fresh",public_key="` + k(1).String() + `"} 1
meshlet_peer_up{cluster="",interface="kilo0",kind="segment",location="",peer="stale",public_key="` + k(2).String() + `"} 0
meshlet_peer_up{cluster="",interface="kilo0",kind="peer",location="",peer="never",public_key="` + k(3).String() + `"} 0
meshlet_peer_up{cluster="",interface="kilo0",kind="segment",location="",peer="sending",public_key="` + k(5).String() + `"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshlet_peer_up"); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(onlySeries(t, reg, "meshlet_peer_handshake_allowed_age_seconds", "fresh")); v != 220 {
		t.Errorf("allowed age of fresh = %v, want 220", v)
	}
	// A peer that never completed a handshake has no timestamp series (not 1970).
	n, err := testutil.GatherAndCount(reg, "meshlet_peer_last_handshake_timestamp_seconds")
	if err != nil || n != 4 {
		t.Fatalf("handshake series = %d (%v), want 4 (none for the never-handshaken peer)", n, err)
	}
	// Removed peers vanish.
	src.stats = src.stats[:1]
	if n, _ := testutil.GatherAndCount(reg, "meshlet_peer_receive_bytes_total"); n != 1 {
		t.Fatalf("series after removal = %d", n)
	}
}

// onlySeries returns one peer's series of a metric as a collector.
func onlySeries(t *testing.T, reg *prometheus.Registry, name, peer string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "peer" && l.GetValue() == peer {
					g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
					g.Set(m.GetGauge().GetValue())
					return g
				}
			}
		}
	}
	t.Fatalf("no %s series for peer %s", name, peer)
	return nil
}

func TestWireGuardExporterCompat(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := &fakeSource{stats: []wg.PeerStats{
		{PublicKey: wgtypes.Key(k(1)), LastHandshake: now, TransmitBytes: 7, ReceiveBytes: 9},
		{PublicKey: wgtypes.Key(k(2))},
	}}
	c := NewCollector("kilo0", src, true, func() time.Time { return now })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	want := `
# HELP wireguard_latest_handshake_seconds Unix time of the last handshake, 0 = never (prometheus_wireguard_exporter).
# TYPE wireguard_latest_handshake_seconds gauge
wireguard_latest_handshake_seconds{allowed_ips="",interface="kilo0",public_key="` + k(1).String() + `"} 1.8e+09
wireguard_latest_handshake_seconds{allowed_ips="",interface="kilo0",public_key="` + k(2).String() + `"} 0
# HELP wireguard_sent_bytes_total Bytes sent to the peer (prometheus_wireguard_exporter).
# TYPE wireguard_sent_bytes_total counter
wireguard_sent_bytes_total{allowed_ips="",interface="kilo0",public_key="` + k(1).String() + `"} 7
wireguard_sent_bytes_total{allowed_ips="",interface="kilo0",public_key="` + k(2).String() + `"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "wireguard_latest_handshake_seconds", "wireguard_sent_bytes_total"); err != nil {
		t.Fatal(err)
	}
}

func TestAgentMetricsRegister(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a := NewAgent(reg)
	a.Leader.Set(1)
	a.Rejections.WithLabelValues("InvalidKey").Inc()
	if n, err := testutil.GatherAndCount(reg); err != nil || n < 2 {
		t.Fatalf("gathered %d series: %v", n, err)
	}
	// Both results are there before the first run, so the first error is
	// an increase for rate() (the reconcile-error alert).
	want := `
# HELP meshlet_reconciles_total Reconcile runs by result (success, error).
# TYPE meshlet_reconciles_total counter
meshlet_reconciles_total{result="error"} 0
meshlet_reconciles_total{result="success"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshlet_reconciles_total"); err != nil {
		t.Error(err)
	}
}
