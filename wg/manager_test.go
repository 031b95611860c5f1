package wg

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fakeClient is an in-memory device that applies configs like wireguard-go
// does, enough to check what Manager sends.
type fakeClient struct {
	mu      sync.Mutex
	dev     wgtypes.Device
	configs []wgtypes.Config
	reads   int
	onRead  func() // called for every read (the watch's tests step a clock)
	failSet error  // returned by ConfigureDevice when set
}

func (f *fakeClient) Device(name string) (*wgtypes.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.onRead != nil {
		f.onRead()
	}
	if name != f.dev.Name {
		return nil, os.ErrNotExist
	}
	d := f.dev
	d.Peers = append([]wgtypes.Peer(nil), f.dev.Peers...)
	return &d, nil
}

// edit changes the device behind the Manager's back.
func (f *fakeClient) edit(fn func(d *wgtypes.Device)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.dev)
}

func (f *fakeClient) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

func (f *fakeClient) ConfigureDevice(name string, cfg wgtypes.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name != f.dev.Name {
		return os.ErrNotExist
	}
	if f.failSet != nil {
		return f.failSet
	}
	f.configs = append(f.configs, cfg)
	if cfg.ReplacePeers {
		f.dev.Peers = nil
	}
	if cfg.PrivateKey != nil {
		f.dev.PrivateKey = *cfg.PrivateKey
	}
	if cfg.ListenPort != nil {
		f.dev.ListenPort = *cfg.ListenPort
	}
	for _, pc := range cfg.Peers {
		i := -1
		for j := range f.dev.Peers {
			if f.dev.Peers[j].PublicKey == pc.PublicKey {
				i = j
			}
		}
		if pc.Remove {
			if i >= 0 {
				f.dev.Peers = append(f.dev.Peers[:i], f.dev.Peers[i+1:]...)
			}
			continue
		}
		if i < 0 {
			if pc.UpdateOnly {
				continue
			}
			f.dev.Peers = append(f.dev.Peers, wgtypes.Peer{PublicKey: pc.PublicKey})
			i = len(f.dev.Peers) - 1
		}
		p := &f.dev.Peers[i]
		if pc.Endpoint != nil {
			p.Endpoint = pc.Endpoint
		}
		if pc.PersistentKeepaliveInterval != nil {
			p.PersistentKeepaliveInterval = *pc.PersistentKeepaliveInterval
		}
		if pc.PresharedKey != nil {
			p.PresharedKey = *pc.PresharedKey
		}
		if pc.ReplaceAllowedIPs {
			p.AllowedIPs = nil
		}
		p.AllowedIPs = append(p.AllowedIPs, pc.AllowedIPs...)
	}
	return nil
}

type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestManagerApply(t *testing.T) {
	ctx := context.Background()
	priv, _ := wgtypes.GeneratePrivateKey()
	fc := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
	m, err := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc,
		Resolver: fakeResolver{"b.example": {netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("192.0.2.2")}}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := testKey(1), testKey(2)
	plan := DeviceSpec{ListenPort: 51820, Peers: []PeerSpec{
		{Name: "a", PublicKey: a, Endpoint: "192.0.2.1:51820", PersistentKeepalive: 25 * time.Second, Roaming: true, AllowedIPs: pfx("10.4.0.1/32")},
		{Name: "b", PublicKey: b, Endpoint: "b.example:51820", AllowedIPs: pfx("10.4.0.2/32")},
	}}

	rep, err := m.Apply(ctx, plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Added) != 2 || !rep.PrivateKey || !rep.ListenPort {
		t.Fatalf("first apply report = %+v", rep)
	}
	if got := fc.dev.Peers[1].Endpoint.String(); got != "192.0.2.2:51820" {
		t.Errorf("DNS endpoint resolved to %s, want the IPv4 192.0.2.2:51820", got)
	}

	// Second apply of the same plan: nothing is sent at all.
	n := len(fc.configs)
	if rep, err = m.Apply(ctx, plan); err != nil || rep.Changed() {
		t.Fatalf("idempotent apply: rep=%+v err=%v", rep, err)
	}
	if len(fc.configs) != n {
		t.Fatal("idempotent apply sent a config")
	}

	// Peer a roams; the same plan must keep the learned endpoint, and the
	// apply against memory sends nothing and reads nothing.
	fc.dev.Peers[0].Endpoint = udp("198.51.100.9:1234")
	reads := fc.reads
	if rep, err = m.Apply(ctx, plan); err != nil || rep.Changed() || len(fc.configs) != n || fc.reads != reads {
		t.Fatalf("roamed apply: rep=%+v err=%v, %d configs sent, %d device reads", rep, err, len(fc.configs)-n, fc.reads-reads)
	}
	// After a restart (no memory) the device is read: the learned endpoint
	// is kept and reported so.
	m2, _ := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc, Resolver: m.resolver})
	if rep, err := m2.Apply(ctx, plan); err != nil || rep.Changed() || len(rep.KeptEndpoints) != 1 {
		t.Fatalf("roamed apply after a restart: rep=%+v err=%v", rep, err)
	}
	if got := fc.dev.Peers[0].Endpoint.String(); got != "198.51.100.9:1234" {
		t.Fatalf("learned endpoint overwritten: %s", got)
	}
	// The operator moves peer a: the new configured endpoint wins once.
	plan.Peers[0].Endpoint = "192.0.2.11:51820"
	if rep, err = m.Apply(ctx, plan); err != nil || len(rep.Updated) != 1 {
		t.Fatalf("moved apply: rep=%+v err=%v", rep, err)
	}
	if got := fc.dev.Peers[0].Endpoint.String(); got != "192.0.2.11:51820" {
		t.Errorf("endpoint after configured change = %s", got)
	}

	// Removing b reports it by name.
	plan.Peers = plan.Peers[:1]
	rep, err = m.Apply(ctx, plan)
	if err != nil || len(rep.Removed) != 1 || rep.Removed[0].Name != "b" {
		t.Fatalf("removal: rep=%+v err=%v", rep, err)
	}
	for _, c := range fc.configs {
		if c.ReplacePeers {
			t.Fatal("Manager sent ReplacePeers")
		}
	}

	// Stats normalise and sort.
	st, err := m.Stats(ctx)
	if err != nil || len(st.Peers) != 1 || !st.Peers[0].LastHandshake.IsZero() || st.Peers[0].AllowedIPs[0] != netip.MustParsePrefix("10.4.0.1/32") {
		t.Fatalf("stats = %+v, %v", st, err)
	}
}

func TestManagerUnresolvedEndpoint(t *testing.T) {
	priv, _ := wgtypes.GeneratePrivateKey()
	fc := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
	m, _ := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc, Resolver: fakeResolver{}})
	rep, err := m.Apply(context.Background(), DeviceSpec{Peers: []PeerSpec{
		{Name: "x", PublicKey: testKey(9), Endpoint: "gone.example:51820", AllowedIPs: pfx("10.4.0.9/32")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Added) != 1 || len(rep.Unresolved) != 1 || fc.dev.Peers[0].Endpoint != nil {
		t.Fatalf("rep = %+v, device peers = %+v", rep, fc.dev.Peers)
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "key")
	k1, created, err := LoadOrCreateKey(path)
	if err != nil || !created {
		t.Fatalf("create: %v created=%v", err, created)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode = %v, %v", fi.Mode(), err)
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("key directory mode = %v, %v", di.Mode(), err)
	}
	k2, created, err := LoadOrCreateKey(path)
	if err != nil || created || k1 != k2 {
		t.Fatalf("reuse: err=%v created=%v same=%v", err, created, k1 == k2)
	}
	// Too open permissions are tightened.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateKey(path); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after reload = %v, want 0600", fi.Mode().Perm())
	}
	// So is a directory others can read (kg creates /var/lib/kilo 0755).
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateKey(path); err != nil {
		t.Fatal(err)
	}
	if di, _ := os.Stat(filepath.Dir(path)); di.Mode().Perm() != 0o700 {
		t.Errorf("directory mode after reload = %v, want 0700", di.Mode().Perm())
	}
	// Garbage is refused without echoing the content.
	secret := "not-a-key-SECRET"
	if err := os.WriteFile(path, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = LoadOrCreateKey(path)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("garbage key: err = %v", err)
	}
}

func TestManagerDrifted(t *testing.T) {
	ctx := context.Background()
	priv, _ := wgtypes.GeneratePrivateKey()
	fc := &fakeClient{dev: wgtypes.Device{Name: "kilo0"}}
	m, err := NewManager(Config{Interface: "kilo0", PrivateKey: priv, Client: fc})
	if err != nil {
		t.Fatal(err)
	}
	drifted := func() bool {
		t.Helper()
		d, _, err := m.watchOnce(ctx, WatchOptions{}.withDefaults(), false, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if drifted() {
		t.Fatal("drift before any apply")
	}
	plan := DeviceSpec{ListenPort: 51820, Peers: []PeerSpec{
		{Name: "a", PublicKey: testKey(1), Endpoint: "192.0.2.1:51820", PersistentKeepalive: 25 * time.Second, Roaming: true, AllowedIPs: pfx("10.4.0.1/32")},
		{Name: "b", PublicKey: testKey(2), Endpoint: "192.0.2.2:51820", AllowedIPs: pfx("10.4.0.2/32")},
	}}
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	if drifted() {
		t.Fatal("drift right after apply")
	}
	// A roaming peer's learned endpoint is not drift.
	fc.dev.Peers[0].Endpoint = udp("198.51.100.9:1234")
	if drifted() {
		t.Error("a roamed endpoint counted as drift")
	}
	// `wg set kilo0 peer b remove` is.
	fc.dev.Peers = fc.dev.Peers[:1]
	if !drifted() {
		t.Error("a removed peer is not drift")
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	select {
	case <-m.Watch(wctx, WatchOptions{Interval: 10 * time.Millisecond}):
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not signal the removed peer")
	}
	if _, err := m.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	if drifted() {
		t.Error("drift after re-apply")
	}
}
