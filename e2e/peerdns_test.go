package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/harness"
)

// TestPeerDNSUnresolvable: several Kilo Peers created together, three with
// an IP endpoint (peer hosts that answer) and one whose DNS name never
// resolves (under the reserved .invalid TLD). kg 0.7 resolves every
// endpoint before each apply and gives up the whole apply on the first
// name that fails (docs/kilo-compatibility.md#peer-dns): nothing would
// change on any node while that Peer exists. meshlet fails that one
// endpoint only.
//
// The nodes' resolver is a DNS server on the underlay (the hub), as a
// cloud network's is: in one case it answers "no such name", as a real
// resolver does for .invalid; in the other it never answers, so every
// lookup of the name runs into the resolver's timeout.
//
// Asserted, in one read of the leader's device: the three good Peers with
// their endpoints and allowed IPs, and the bad one configured without an
// endpoint — so the apply that wrote them is one in which the name did not
// resolve, and against kg this wait would time out. Then: the leader's
// status names the Peer and its name (PeerEndpointUnresolvable) and its
// last reconcile succeeded; both nodes route every Peer's allowed IPs; the
// leader's pod and the non-leader's reach every good Peer; a later change
// to one good Peer reaches the device and the routes while the name still
// fails, and the other Peers' sessions are kept; once the bad Peer is
// deleted, the finding goes. How long each step took is reported.
func TestPeerDNSUnresolvable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		silent bool
	}{
		{name: "resolver answers no such name"},
		{name: "resolver never answers", silent: true},
	} {
		t.Run(tc.name, func(t *testing.T) { peerDNSUnresolvable(t, tc.silent) })
	}
}

func peerDNSUnresolvable(t *testing.T, silent bool) {
	env, ctx := newEnv(t)
	l := harness.OneCluster(2)
	a, err := env.AddCluster(ctx, l.Clusters[0].ClusterSpec)
	must(t, err)
	dnsAddr := netip.AddrFrom4([4]byte{172, 20, 0, 2}) // below the hosts' addresses (harness.HubNet)
	queries := startResolver(t, env.Hub, dnsAddr, silent)
	var nodes []*harness.Node
	for _, spec := range l.Clusters[0].Nodes {
		n, err := a.AddNode(ctx, spec)
		must(t, err)
		// `ip netns exec` binds /etc/netns/<ns>/resolv.conf over
		// /etc/resolv.conf for everything the harness runs in the node.
		dir := filepath.Join("/etc/netns", n.NS)
		must(t, os.MkdirAll(dir, 0o755))
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		must(t, os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver "+dnsAddr.String()+"\n"), 0o644))
		nodes = append(nodes, n)
	}
	must(t, harness.StartAll(ctx, nodes...))
	must(t, env.WaitConverged(ctx, 60*time.Second))
	leader := leaderOf(t, ctx, nodes...)
	other := nodes[0]
	if other == leader {
		other = nodes[1]
	}
	lKey, err := leader.PublicKey(ctx)
	must(t, err)
	lEndpoint := netip.AddrPortFrom(leader.IP.Addr(), 51820).String()

	// want is a Peer as the leader's device must hold it.
	type want struct {
		name     string
		key      string
		endpoint string // "" = none
		allowed  []string
		host     *harness.PeerHost // nil for the bad Peer
	}
	peerJSON := func(w want, dnsOrIP string, keepalive int) string {
		ips, _ := json.Marshal(w.allowed)
		return fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":%q},
"spec":{"allowedIPs":%s,"publicKey":%q,"endpoint":{"dnsOrIP":%s,"port":51820},"persistentKeepalive":%d}}`,
			w.name, ips, w.key, dnsOrIP, keepalive)
	}
	var goods []*want
	var objs []any
	// The bad Peer first: every plan that holds a good Peer holds it too.
	const badDNS = "nas.meshlet.invalid"
	_, badKey := harness.NewKeyPair()
	bad := &want{name: "nas", key: badKey, allowed: []string{"10.9.0.4/32"}}
	objs = append(objs, peerJSON(*bad, fmt.Sprintf(`{"dns":%q}`, badDNS), 0))
	for i, name := range []string{"laptop", "phone", "tablet"} {
		h, err := env.AddPeerHost(ctx, name, netip.MustParseAddr(fmt.Sprintf("10.9.0.%d", i+1)))
		must(t, err)
		// The peer host's side, as `kgctl showconf peer` gives it: x's
		// leader, cluster-a's pods through the tunnel.
		must(t, h.SetPeer(ctx, lKey, lEndpoint, []netip.Prefix{a.PodNet}))
		g := &want{name: name, key: h.Public, endpoint: netip.AddrPortFrom(h.IP.Addr(), 51820).String(),
			allowed: []string{netip.PrefixFrom(h.Addr, 32).String()}, host: h}
		goods = append(goods, g)
		objs = append(objs, peerJSON(*g, fmt.Sprintf(`{"ip":%q}`, h.IP.Addr()), 0))
	}
	all := append([]*want{bad}, goods...)

	// onDevice is nil when d holds every Peer of ws as wanted.
	onDevice := func(d *harness.WGDevice, ws ...*want) error {
		var errs []error
		for _, w := range ws {
			p, ok := d.Peers[w.key]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s: not on the device", w.name))
			case p.Endpoint != w.endpoint:
				errs = append(errs, fmt.Errorf("%s: endpoint %q, want %q", w.name, p.Endpoint, w.endpoint))
			case !slices.Equal(p.AllowedIPs, w.allowed):
				errs = append(errs, fmt.Errorf("%s: allowed IPs %v, want %v", w.name, p.AllowedIPs, w.allowed))
			}
		}
		return errors.Join(errs...)
	}
	// device polls the leader's device until cond holds and returns the
	// device as last read and how long since from. A silent resolver
	// makes every pass wait for its lookups (5 s, twice), hence the bound.
	device := func(what string, from time.Time, cond func(*harness.WGDevice) error) (*harness.WGDevice, time.Duration) {
		t.Helper()
		var d *harness.WGDevice
		must(t, harness.Poll(ctx, 90*time.Second, 20*time.Millisecond, what, func() (bool, error) {
			var err error
			if d, err = leader.Device(); err != nil || d == nil {
				return false, err
			}
			err = cond(d)
			return err == nil, err
		}))
		return d, time.Since(from)
	}
	nodeStatus := func(n *harness.Node) status.Status {
		t.Helper()
		out, err := n.Exec(ctx, os.Getenv("MESHLET_BIN"), "status", "-o", "json")
		must(t, err)
		var st status.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status of %s: %v\n%s", n.Name, err, out)
		}
		return st
	}
	// reported checks the leader's status names the bad Peer and its name
	// and that its last reconcile succeeded; it returns the finding.
	reported := func(when string) diagnose.Finding {
		t.Helper()
		st := nodeStatus(leader)
		if st.LastRun.Error != "" {
			t.Errorf("%s: %s's last reconcile failed: %s", when, leader.Name, st.LastRun.Error)
		}
		i := slices.IndexFunc(st.Findings, func(f diagnose.Finding) bool { return f.ID == diagnose.IDPeerDNS })
		if i < 0 {
			t.Fatalf("%s: %s's status has no %s; findings %+v", when, leader.Name, diagnose.IDPeerDNS, st.Findings)
		}
		f := st.Findings[i]
		if !strings.Contains(f.Message, "peer "+bad.name+"'s endpoint "+badDNS+":51820") {
			t.Errorf("%s: %s does not name Peer %s and %s: %q", when, diagnose.IDPeerDNS, bad.name, badDNS, f.Message)
		}
		for _, g := range goods {
			if strings.Contains(f.Message, g.name) {
				t.Errorf("%s: %s names good Peer %s: %q", when, diagnose.IDPeerDNS, g.name, f.Message)
			}
		}
		return f
	}
	// routed checks both nodes route every allowed IP of ws: the leader
	// into kilo0, the other node through the leader.
	routed := func(when string, ws ...*want) {
		t.Helper()
		for _, n := range []*harness.Node{leader, other} {
			via := "dev " + harness.Iface + " "
			if n != leader {
				via = "via " + leader.IP.Addr().String() + " "
			}
			must(t, harness.Poll(ctx, 30*time.Second, 50*time.Millisecond, when+": routes on "+n.Name, func() (bool, error) {
				rs, err := n.Routes(ctx)
				if err != nil {
					return false, err
				}
				var missing []string
				for _, w := range ws {
					for _, p := range w.allowed {
						dst := strings.TrimSuffix(p, "/32")
						if !slices.ContainsFunc(rs, func(r string) bool { return strings.HasPrefix(r, dst+" ") && strings.Contains(r, via) }) {
							missing = append(missing, p+" "+strings.TrimSpace(via))
						}
					}
				}
				return len(missing) == 0, fmt.Errorf("missing %v in %q", missing, rs)
			}))
		}
	}

	// The four Peers, created together.
	start := time.Now()
	must(t, a.Apply(ctx, objs...))
	bad.endpoint = "" // never resolved: configured without one
	_, took := device("the good Peers on "+leader.Name, start, func(d *harness.WGDevice) error { return onDevice(d, all...) })
	f := reported("after the create")
	t.Logf("OUTPUT %s: %s\n  evidence: %s", f.ID, f.Message, strings.Join(f.Evidence, "; "))
	routed("after the create", all...)
	var reach []string
	for _, g := range goods {
		for _, n := range []*harness.Node{leader, other} {
			took, err := n.WaitReachable(ctx, g.host.Addr, 20*time.Second)
			must(t, err)
			reach = append(reach, fmt.Sprintf("%s→%s %v", n.Name, g.name, took.Round(time.Millisecond)))
		}
	}

	// A later change to one good Peer: a second network and a keepalive.
	// The others' sessions (their handshakes) must be what they were.
	d, err := leader.Device()
	must(t, err)
	before := map[string]time.Time{}
	for _, g := range goods {
		before[g.name] = d.Peers[g.key].LastHandshake
	}
	phone := goods[1]
	phone.allowed = []string{"10.9.0.2/32", "10.9.2.0/24"}
	start = time.Now()
	must(t, a.Apply(ctx, peerJSON(*phone, fmt.Sprintf(`{"ip":%q}`, phone.host.IP.Addr()), 25)))
	d, tookChange := device("the change to "+phone.name+" on "+leader.Name, start, func(d *harness.WGDevice) error {
		if k := d.Peers[phone.key].Keepalive; k != 25 {
			return fmt.Errorf("%s: keepalive %d, want 25", phone.name, k)
		}
		return onDevice(d, all...)
	})
	reported("after the change")
	routed("after the change", phone)
	// `meshlet status` sampled twice, a second apart, while the name goes
	// on failing: what a user waits for it.
	var statusWait time.Duration
	for range 2 {
		pace(ctx, time.Second)
		from := time.Now()
		nodeStatus(leader)
		statusWait = max(statusWait, time.Since(from))
	}
	for _, g := range goods {
		if g != phone && !d.Peers[g.key].LastHandshake.Equal(before[g.name]) {
			t.Errorf("%s's session was replaced by the change to %s: handshake %v, was %v", g.name, phone.name, d.Peers[g.key].LastHandshake, before[g.name])
		}
	}

	// The bad Peer deleted: off the device, the finding gone, the good
	// Peers kept.
	must(t, a.DeletePeer(ctx, bad.name))
	device("Peer "+bad.name+" off "+leader.Name, time.Now(), func(d *harness.WGDevice) error {
		if _, ok := d.Peers[bad.key]; ok {
			return fmt.Errorf("%s still on the device", bad.name)
		}
		return onDevice(d, goods...)
	})
	must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, diagnose.IDPeerDNS+" gone from "+leader.Name, func() (bool, error) {
		st := nodeStatus(leader)
		return !slices.ContainsFunc(st.Findings, func(f diagnose.Finding) bool { return f.ID == diagnose.IDPeerDNS }), nil
	}))

	report(t, "4 Peers created together, %s never resolving: the 3 good ones on %s's device with endpoint and allowed IPs, and %s without an endpoint, %v after the create; %s in its status; reached %s; a later change to %s (a /24, keepalive 25) on the device %v after it, the other sessions kept; resolver asked %d times; `meshlet status` took up to %v",
		badDNS, leader.Name, bad.name, took.Round(time.Millisecond), diagnose.IDPeerDNS, strings.Join(reach, ", "),
		phone.name, tookChange.Round(time.Millisecond), queries.Load(), statusWait.Round(time.Millisecond))
}

// startResolver serves DNS on addr:53, an address it adds to the bridge
// in the hub's namespace: every query is answered "no such name" (RCODE
// 3), what a resolver says of a name under .invalid (RFC 6761), or, when
// silent, never answered. It counts the queries.
func startResolver(t *testing.T, hub string, addr netip.Addr, silent bool) *atomic.Int64 {
	t.Helper()
	if out, err := exec.Command("ip", "-n", hub, "addr", "add", netip.PrefixFrom(addr, harness.HubNet.Bits()).String(), "dev", "br0").CombinedOutput(); err != nil {
		t.Fatalf("resolver address: %v: %s", err, out)
	}
	var conn *net.UDPConn
	must(t, harness.InNetns(hub, func() (err error) {
		conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 53)))
		return err
	}))
	t.Cleanup(func() { _ = conn.Close() })
	var queries atomic.Int64
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return // closed
			}
			queries.Add(1)
			if silent {
				continue
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired,
				RecursionAvailable: true, RCode: dnsmessage.RCodeNameError})
			if b.StartQuestions() != nil || b.Question(q) != nil {
				continue
			}
			if msg, err := b.Finish(); err == nil {
				_, _ = conn.WriteToUDPAddrPort(msg, from)
			}
		}
	}()
	return &queries
}
