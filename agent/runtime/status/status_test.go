package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/wg"
)

var update = flag.Bool("update-golden", false, "rewrite testdata/*.golden")

var now = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

func key(b byte) wgtypes.Key { return wgtypes.Key{b} }

func pfx(s string) []netip.Prefix { return []netip.Prefix{netip.MustParsePrefix(s)} }

// leader is a location leader with a segment peer (up), a Peer object
// behind NAT (roamed), a remote leader (down) and one peer missing from the
// device, plus a device peer the plan no longer has.
func leader() Input {
	plan := topology.Plan{
		Node: "a-1", Cluster: "cluster-a", Leader: true, Segment: "location:a", Location: "a",
		WireGuardIP: netip.MustParsePrefix("10.4.0.1/16"), PrivateIP: netip.MustParsePrefix("192.168.1.10/24"), Endpoint: "203.0.113.10:51820",
		WireGuard: topology.Device{Interface: "kilo0", ListenPort: 51820, MTU: 1420, Up: true, Peers: []topology.WireGuardPeer{
			{Name: "b-1", Kind: topology.KindSegment, Location: "b", PublicKey: topology.Key(key(2)), Endpoint: "203.0.113.20:51820", EndpointSource: "endpoint",
				AllowedIPs: pfx("10.2.1.0/24"), PersistentKeepalive: 25, KeepaliveSource: topology.KeepaliveNodeAnnotation},
			{Name: "laptop", Kind: topology.KindPeer, PublicKey: topology.Key(key(3)), AllowedIPs: pfx("10.5.0.1/32"), Roaming: true},
			{Name: "z-1", Kind: topology.KindRemote, Cluster: "cluster-b", Location: "z", PublicKey: topology.Key(key(4)), Endpoint: "gw.example.net:51820",
				EndpointSource: "clustermesh-endpoint", AllowedIPs: pfx("10.20.0.0/16"), PersistentKeepalive: 250, KeepaliveSource: topology.KeepaliveRemoteCluster},
			{Name: "z-2", Kind: topology.KindRemote, Cluster: "cluster-b", PublicKey: topology.Key(key(5)), AllowedIPs: pfx("10.21.0.0/16")},
		}},
		Routes: []topology.Route{{Dst: netip.MustParsePrefix("10.2.1.0/24"), Gw: netip.MustParseAddr("10.4.0.2"), Dev: "kilo0"},
			{Dst: netip.MustParsePrefix("10.2.0.0/24"), Dev: "kilo0", Table: topology.KiloTable}},
		Rules:   []topology.Rule{{Iif: "kilo0", Table: topology.KiloTable}},
		Remotes: []topology.RemoteInfo{{Cluster: "cluster-b", Mesh: "kilo-system/mesh", Leaders: []string{"z-1", "z-2"}, Synced: true}},
		Rejections: []topology.Rejection{{Object: topology.ObjectRef{Kind: "Node", Name: "a-3"}, Field: "kilo.squat.ai/persistent-keepalive",
			Reason: topology.ReasonInvalidAnnotation, Message: `"x" is not a number`}},
	}
	return Input{
		Node: "a-1", Cluster: "cluster-a", Version: "v0.3.0", Now: now, HaveRun: true, Ready: true,
		Run: reconcile.Run{Plan: plan, At: now.Add(-4 * time.Second), Duration: 1830 * time.Microsecond},
		Device: wg.DeviceStats{Interface: "kilo0", Type: "Linux kernel", PublicKey: key(1), ListenPort: 51820, Peers: []wg.PeerStats{
			{PublicKey: key(2), Endpoint: netip.MustParseAddrPort("203.0.113.20:51820"), LastHandshake: now.Add(-70 * time.Second), ReceiveBytes: 3 << 20, TransmitBytes: 5 << 10, PersistentKeepalive: 25 * time.Second},
			{PublicKey: key(3), Endpoint: netip.MustParseAddrPort("198.51.100.7:40123"), LastHandshake: now.Add(-20 * time.Second), ReceiveBytes: 900, TransmitBytes: 1200},
			{PublicKey: key(4), Endpoint: netip.MustParseAddrPort("198.51.100.30:51820"), LastHandshake: now.Add(-500 * time.Second), PersistentKeepalive: 250 * time.Second},
			{PublicKey: key(9), AllowedIPs: pfx("10.9.0.0/24")},
		}},
		Health: map[wgtypes.Key]metrics.Health{
			key(2): {State: "up", Allowed: 220 * time.Second},
			key(3): {State: "up", Allowed: 210 * time.Second},
			key(4): {State: "down", Allowed: 445 * time.Second},
			key(9): {State: "idle"},
		},
		Drift:   []string{"route missing or different: 10.2.1.0/24 via 10.4.0.2 dev kilo0"},
		Remotes: []cluster.RemoteStatus{{Cluster: "cluster-b", Synced: true, Ready: false, Nodes: 3, Peers: 1, Seen: now.Add(-40 * time.Second), Error: "API server /readyz: connection refused"}},
	}
}

func TestBuildAndPrint(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   func() Input
	}{
		{"leader", leader},
		{"starting", func() Input {
			return Input{Node: "a-2", Version: "v0.3.0", Now: now, DeviceErr: errors.New("no such device kilo0")}
		}},
		{"non-leader device unreadable", func() Input {
			in := leader()
			in.Run.Plan.Leader, in.Run.Plan.WireGuard.Peers, in.Run.Plan.Remotes = false, in.Run.Plan.WireGuard.Peers[:1], nil
			in.Device, in.Health, in.Remotes, in.Drift = wg.DeviceStats{}, nil, nil, nil
			in.DeviceErr = errors.New("reading kilo0: permission denied")
			in.Run.Error, in.Ready = "applying WireGuard device: permission denied", false
			return in
		}},
		{"leader with findings", func() Input {
			// ip_forward off while leading a-2, and an unresolvable Peer
			// endpoint: FINDINGS with evidence, fix and runbook.
			in := leader()
			in.Run.Plan.Segments = []topology.SegmentInfo{{Name: "location:a", Location: "a", Leader: "a-1", Nodes: []string{"a-1", "a-2"}}}
			in.IPForward = "0"
			in.Unresolved = []diagnose.Unresolved{{Peer: "laptop", Endpoint: "gone.example.invalid:51820", Error: "lookup gone.example.invalid: no such host"}}
			return in
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Build(tc.in())
			js, err := json.MarshalIndent(s, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			if err := Print(&text, s); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name+".json", append(js, '\n'))
			golden(t, tc.name+".txt", text.Bytes())
			// What `meshlet status -o json` decodes is what the agent built.
			var back Status
			if err := json.Unmarshal(js, &back); err != nil {
				t.Fatal(err)
			}
			again, _ := json.MarshalIndent(back, "", "  ")
			if !bytes.Equal(again, js) {
				t.Errorf("JSON does not round-trip:\n%s\nvs\n%s", again, js)
			}
		})
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", filepath.FromSlash(name))
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update-golden)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update-golden rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}
