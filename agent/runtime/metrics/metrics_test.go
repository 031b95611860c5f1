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

func TestPeerUpIsHonest(t *testing.T) {
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
	// "sending" sends.
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	clock = now.Add(181 * time.Second)
	src.stats[4].TransmitBytes = 90
	// Keep the keepalive peers' handshakes where they were relative to the
	// new clock.
	src.stats[0].LastHandshake = clock.Add(-100 * time.Second)
	src.stats[1].LastHandshake = clock.Add(-200 * time.Second)

	want := `
# HELP meshlet_peer_up 1 when the last handshake is younger than 195 s; only for peers with keepalive or traffic sent in the last 180 s.
# TYPE meshlet_peer_up gauge
meshlet_peer_up{cluster="b",interface="kilo0",kind="remote",location="",peer="fresh",public_key="` + k(1).String() + `"} 1
meshlet_peer_up{cluster="",interface="kilo0",kind="segment",location="",peer="stale",public_key="` + k(2).String() + `"} 0
meshlet_peer_up{cluster="",interface="kilo0",kind="peer",location="",peer="never",public_key="` + k(3).String() + `"} 0
meshlet_peer_up{cluster="",interface="kilo0",kind="segment",location="",peer="sending",public_key="` + k(5).String() + `"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshlet_peer_up"); err != nil {
		t.Fatal(err)
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
}
