package wg

import (
	"context"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestForgetLearnedEndpoints: on the way back to kg, only a roaming peer
// that kg configures without an endpoint (no endpoint, no keepalive) and
// whose device learned one is re-added, without it and with its allowed
// IPs; peers with a configured endpoint, a keepalive (kg uses what the
// device learned for those) or nothing learned are not touched.
func TestForgetLearnedEndpoints(t *testing.T) {
	ctx := context.Background()
	priv, _ := wgtypes.GeneratePrivateKey()
	fc := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
	m, err := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc})
	if err != nil {
		t.Fatal(err)
	}
	if names, err := m.ForgetLearnedEndpoints(ctx); err != nil || names != nil {
		t.Fatalf("before any apply: %v %v, want nothing done", names, err)
	}
	leader, laptop, phone, idle := testKey(1), testKey(2), testKey(3), testKey(4)
	plan := DeviceSpec{ListenPort: 51820, Peers: []PeerSpec{
		{Name: "leader", PublicKey: leader, Endpoint: "192.0.2.1:51820", AllowedIPs: pfx("10.4.0.1/32")},
		{Name: "laptop", PublicKey: laptop, Roaming: true, AllowedIPs: pfx("10.9.0.1/32")},
		{Name: "phone", PublicKey: phone, Roaming: true, PersistentKeepalive: 25 * time.Second, AllowedIPs: pfx("10.9.0.2/32")},
		{Name: "idle", PublicKey: idle, Roaming: true, AllowedIPs: pfx("10.9.0.3/32")},
	}}
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	fc.edit(func(d *wgtypes.Device) {
		for i := range d.Peers {
			switch d.Peers[i].PublicKey {
			case laptop:
				d.Peers[i].Endpoint = udp("198.51.100.7:40000")
			case phone:
				d.Peers[i].Endpoint = udp("198.51.100.8:40000")
			}
		}
	})
	n := len(fc.configs)
	names, err := m.ForgetLearnedEndpoints(ctx)
	if err != nil || len(names) != 1 || names[0] != "laptop" {
		t.Fatalf("re-added %v (%v), want only laptop", names, err)
	}
	if len(fc.configs) != n+1 {
		t.Fatalf("%d configurations sent, want one", len(fc.configs)-n)
	}
	cfg := fc.configs[n]
	if cfg.ReplacePeers || len(cfg.Peers) != 2 || !cfg.Peers[0].Remove || cfg.Peers[0].PublicKey != laptop ||
		cfg.Peers[1].PublicKey != laptop || cfg.Peers[1].Endpoint != nil {
		t.Fatalf("configuration %+v, want laptop removed and added back without an endpoint", cfg)
	}
	for _, p := range fc.dev.Peers {
		switch p.PublicKey {
		case laptop:
			if p.Endpoint != nil || len(p.AllowedIPs) != 1 || p.AllowedIPs[0].String() != "10.9.0.1/32" {
				t.Errorf("laptop after: endpoint %v, allowed IPs %v", p.Endpoint, p.AllowedIPs)
			}
		case phone:
			if p.Endpoint.String() != "198.51.100.8:40000" {
				t.Errorf("phone (keepalive: kg uses the learned endpoint) lost it: %v", p.Endpoint)
			}
		case leader:
			if p.Endpoint.String() != "192.0.2.1:51820" {
				t.Errorf("leader's endpoint %v", p.Endpoint)
			}
		}
	}
	if len(fc.dev.Peers) != 4 {
		t.Errorf("%d peers after, want 4", len(fc.dev.Peers))
	}
	// Nothing left to forget: nothing sent.
	if names, err := m.ForgetLearnedEndpoints(ctx); err != nil || names != nil || len(fc.configs) != n+1 {
		t.Fatalf("second call: %v %v, %d more configurations", names, err, len(fc.configs)-n-1)
	}
}
