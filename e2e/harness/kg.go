package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/wg"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"k8s.io/utils/clock"
)

// Kg is a stand-in for kg 0.7 running a harness node ("kg-shape"), for
// mixed clusters and the switch between kg and meshlet. It behaves as kg
// does on the wire and on the node, in the node's namespaces and with its
// userspace WireGuard device (started when absent, as a kg sidecar would;
// one left by meshlet is taken over), with the node's key in kg's key file
// (KgKeyFile, kg's /var/lib/kilo/key). It watches the cluster and computes
// the node's configuration with Kilo's rules — meshlet's planner, which
// TestKiloCompat pins to Kilo's own output, with no Lease (kg cannot follow
// one) — then does what kg's applyTopology does (pkg/mesh/mesh.go):
//
//   - on a leader: the WireGuard IP as the only address of kilo0, the device
//     compared with the configuration by kg's own rule (Conf.Equal, its bug
//     included: the comparison stops at the first peer without an endpoint
//     on both sides) and, when they differ, rewritten whole (ReplacePeers),
//     which forgets every session; kilo0 up;
//   - on a non-leader: kilo0 down, its address and peers left as they are;
//   - on every node: its routes and rules (kg's are protocol static), the
//     ones it set before and no longer wants removed.
//
// It does that on every change and every resync, so a Peer without an
// endpoint whose device learned one (a roaming laptop) makes it rewrite at
// the next resync, as kg 0.7 does. kg's keepalive rule holds: every peer
// gets the node's persistent-keepalive annotation, whatever a Peer says.
// It publishes kg's annotations (never meshlet's) and refreshes last-seen
// every 10 s (kg: 30 s). It writes no iptables rules: with --local, the
// harness' flat underlay and no CNI, the traffic the tests send needs none.
type Kg struct {
	n    *Node
	opts KgOptions
	priv wgtypes.Key
	pub  string

	cancel context.CancelFunc
	done   chan struct{}

	rewrites atomic.Int32
	applies  atomic.Int32
	mu       sync.Mutex
	lastErr  error
	reasons  map[string]int // why the device was rewritten, by kg's diff
	history  []KgRewrite
	routes   map[string][]string // what this kg set: key → `ip route` args
	rules    map[string][]string // likewise for `ip rule`
	pubd     map[string]string   // annotations last published
}

// KgOptions are kg's flags the stand-in models.
type KgOptions struct {
	// NoCleanUp is kg's --clean-up=false: a graceful stop leaves the node
	// as it is (docs/migration.md). kg's default cleans up.
	NoCleanUp bool
	// CleanUpInterface is kg's --clean-up-interface: a graceful stop with
	// clean-up also deletes kilo0.
	CleanUpInterface bool
	// ResyncPeriod is kg's --resync-period (default: the Env's, 5 s;
	// kg's own is 30 s).
	ResyncPeriod time.Duration
}

// kgCheckIn is how often the stand-in refreshes last-seen (kg: 30 s,
// Kilo's window 60 s).
const kgCheckIn = 10 * time.Second

// KgKeyFile is kg's key file of the node (kg's /var/lib/kilo/key): kg
// creates it, meshlet in kg's DaemonSet reads it (--key-file).
func (n *Node) KgKeyFile() string { return filepath.Join(n.Dir, "var-lib-kilo", "key") }

// KgNode is a node created to run kg (AddKgNode).
type KgNode struct {
	*Node
	*Kg
}

// AddKgNode creates a node in location loc and runs kg on it (until the
// test ends).
func (c *Cluster) AddKgNode(ctx context.Context, name, loc string) (*KgNode, error) {
	n, err := c.AddNode(ctx, NodeSpec{Name: name, Location: loc})
	if err != nil {
		return nil, err
	}
	k, err := n.RunKg(ctx, KgOptions{})
	if err != nil {
		return nil, err
	}
	return &KgNode{Node: n, Kg: k}, nil
}

// RunKg starts kg on the node (meshlet must not run there): the device is
// started if absent, the key read from KgKeyFile (created if missing, as kg
// does), kg's annotations published, and the controller runs until StopKg
// or the end of the test.
func (n *Node) RunKg(ctx context.Context, o KgOptions) (*Kg, error) {
	if o.ResyncPeriod == 0 {
		o.ResyncPeriod = n.env.opts.ResyncPeriod
	}
	if n.Running() {
		return nil, fmt.Errorf("node %s: meshlet runs there; kg and meshlet both own kilo0", n.Name)
	}
	n.mu.Lock()
	busy := n.kg != nil
	n.mu.Unlock()
	if busy {
		return nil, fmt.Errorf("node %s: kg already runs", n.Name)
	}
	priv, _, err := wg.LoadOrCreateKey(n.KgKeyFile())
	if err != nil {
		return nil, fmt.Errorf("node %s: kg's key: %w", n.Name, err)
	}
	k := &Kg{n: n, opts: o, priv: priv, pub: priv.PublicKey().String(), reasons: map[string]int{},
		routes: map[string][]string{}, rules: map[string][]string{}, done: make(chan struct{})}
	// kg relies on the node forwarding, which a Kubernetes node does
	// (kubelet's prerequisite); meshlet sets it itself.
	if err := sysctl(ctx, n.NS, "net.ipv4.ip_forward", "1"); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(n.WGDir, Iface+".sock")); errors.Is(err, os.ErrNotExist) {
		if err := startDevice(ctx, n.env.opts.Meshlet, n.wrap, n.WGDir, Iface); err != nil {
			return nil, fmt.Errorf("kg on %s: %w", n.Name, err)
		}
	}
	// kg's first configuration sets its key and port; a device taken over
	// already has them (setting the port again would rebind its socket).
	d, err := readUAPI(n.WGDir, Iface)
	if err != nil {
		return nil, fmt.Errorf("kg on %s: %w", n.Name, err)
	}
	var set []string
	if d.PublicKey != k.pub {
		set = append(set, "private_key="+HexKey(priv.String()))
	}
	if d.ListenPort != 51820 {
		set = append(set, "listen_port=51820")
	}
	if len(set) > 0 {
		if err := setUAPI(n.WGDir, Iface, set...); err != nil {
			return nil, fmt.Errorf("kg on %s: %w", n.Name, err)
		}
	}

	changed := make(chan struct{}, 1)
	c := n.Cluster
	local, err := cluster.NewLocal(cluster.LocalOptions{Config: c.RestConfig(), Client: c.Admin, Namespace: Namespace, Node: n.Name,
		Notify: func(time.Time) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(n.env.ctx)
	local.Start(cctx)
	if !local.WaitForSync(ctx) {
		cancel()
		return nil, fmt.Errorf("kg on %s: caches not synced", n.Name)
	}
	k.cancel = cancel
	n.mu.Lock()
	n.kg = k
	n.mu.Unlock()
	go k.control(cctx, local, changed)
	return k, nil
}

// KgRunning is the node's kg, nil when none runs.
func (n *Node) KgRunning() *Kg {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kg
}

// StopKg stops kg on the node. graceful is kg's exit on SIGTERM: with kg's
// default --clean-up it removes what kg's cleanUp removes — the routes and
// rules it set, kilo0 with --clean-up-interface, and its annotations
// (endpoint, internal-ip, key, last-seen, wireguard-ip,
// discovered-endpoints, granularity). Not graceful is SIGKILL (`crictl stop
// --timeout 0`, docs/migration.md): everything stays, the device too.
func (n *Node) StopKg(graceful bool) error {
	n.mu.Lock()
	k := n.kg
	n.kg = nil
	n.mu.Unlock()
	if k == nil {
		return nil
	}
	k.cancel()
	<-k.done
	if !graceful || k.opts.NoCleanUp {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	k.mu.Lock()
	for _, args := range k.routes {
		errs = append(errs, ignoreMissing(ipn(ctx, n.NS, append([]string{"route", "del"}, args...)...)))
	}
	for _, args := range k.rules {
		errs = append(errs, ignoreMissing(ipn(ctx, n.NS, append([]string{"rule", "del"}, args...)...)))
	}
	k.routes, k.rules = map[string][]string{}, map[string][]string{}
	k.mu.Unlock()
	if k.opts.CleanUpInterface {
		errs = append(errs, ipn(ctx, n.NS, "link", "del", Iface))
	}
	remove := map[string]*string{}
	for _, a := range []string{topology.AnnotationEndpoint, topology.AnnotationInternalIP, topology.AnnotationKey,
		topology.AnnotationLastSeen, topology.AnnotationWireGuardIP, topology.AnnotationDiscoveredEndpoints, topology.AnnotationGranularity} {
		remove[a] = nil
	}
	errs = append(errs, n.Cluster.PatchNodeAnnotations(ctx, n.Name, remove))
	return errors.Join(errs...)
}

func ignoreMissing(err error) error {
	if err != nil && (strings.Contains(err.Error(), "No such process") || strings.Contains(err.Error(), "No such file")) {
		return nil
	}
	return err
}

// Key is kg's public key of the node (base64).
func (k *Kg) Key() string { return k.pub }

// Rewrites counts the full device rewrites so far.
func (k *Kg) Rewrites() int { return int(k.rewrites.Load()) }

// Applies counts the controller's runs (changes and resyncs).
func (k *Kg) Applies() int { return int(k.applies.Load()) }

// RewriteReasons counts the rewrites by what kg's comparison found
// ("number of peers", "allowed IPs", "endpoint", ...).
func (k *Kg) RewriteReasons() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]int{}
	for r, c := range k.reasons {
		out[r] = c
	}
	return out
}

// KgRewrite is one rewrite of the device: when, and what kg's comparison
// found.
type KgRewrite struct {
	At  time.Time
	Why string
}

// History lists the rewrites so far, oldest first.
func (k *Kg) History() []KgRewrite {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]KgRewrite(nil), k.history...)
}

// Err is the last error of the controller (nil when it applied).
func (k *Kg) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lastErr
}

// control is kg's loop: on every change, every resync and every check-in,
// plan and apply.
func (k *Kg) control(ctx context.Context, local *cluster.Local, changed <-chan struct{}) {
	defer close(k.done)
	resync := time.NewTicker(k.opts.ResyncPeriod)
	defer resync.Stop()
	checkIn := time.NewTicker(kgCheckIn)
	defer checkIn.Stop()
	refresh := true // kg's first Set publishes last-seen
	for {
		err := k.apply(ctx, local, refresh)
		refresh = false
		if ctx.Err() != nil {
			return
		}
		k.applies.Add(1)
		k.mu.Lock()
		k.lastErr = err
		k.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-resync.C:
		case <-checkIn.C:
			refresh = true
		}
	}
}

// KgSettings are the settings every kg stand-in (and KgctlView) plans
// with: the harness' meshlet flags.
func (c *Cluster) KgSettings() topology.Settings {
	return topology.Settings{Subnet: c.WGSubnet, Encapsulate: topology.EncapsulateNever, Local: true,
		Granularity: topology.GranularityLocation}
}

// kgSelf is what kg knows about its own host.
func (n *Node) kgSelf(pub string) (topology.Self, error) {
	key, err := topology.ParseKey(pub)
	if err != nil {
		return topology.Self{}, err
	}
	return topology.Self{Name: n.Name, PublicKey: key, DefaultInterface: "eth0",
		Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: n.IP}}}, nil
}

func (k *Kg) apply(ctx context.Context, local *cluster.Local, refresh bool) error {
	st := local.State(k.n.Cluster.Name)
	snap := topology.Snapshot{Now: time.Now(), Nodes: st.Nodes, Peers: st.Peers, Settings: k.n.Cluster.KgSettings()}
	return k.applySnapshot(ctx, snap, refresh)
}

// applySnapshot is one pass of kg's applyTopology on what it read: Kilo's
// annotations published (last-seen with them when refresh), and, once its
// own node is Ready as it published it, the device, address and routes.
func (k *Kg) applySnapshot(ctx context.Context, snap topology.Snapshot, refresh bool) error {
	n, c := k.n, k.n.Cluster
	now := snap.Now
	self, err := n.kgSelf(k.pub)
	if err != nil {
		return err
	}
	pl := planner.Compute(snap, self)
	// What kg publishes (kg's node backend Set): Kilo's annotations only.
	want := map[string]string{}
	for key, v := range pl.Annotations {
		if strings.HasPrefix(key, "meshlet.io/") || key == topology.AnnotationLastSeen {
			continue
		}
		want[key] = v
	}
	k.mu.Lock()
	same := len(want) == len(k.pubd)
	for key, v := range want {
		same = same && k.pubd[key] == v
	}
	k.mu.Unlock()
	if !same || refresh {
		patch := map[string]*string{}
		for key, v := range want {
			patch[key] = &v
		}
		ls := strconv.FormatInt(now.Unix(), 10)
		patch[topology.AnnotationLastSeen] = &ls
		if err := c.PatchNodeAnnotations(ctx, n.Name, patch); err != nil {
			return err
		}
		k.mu.Lock()
		k.pubd = want
		k.mu.Unlock()
	}
	// kg does nothing with the topology until its own node is Ready as it
	// published it.
	var me *topology.Node
	for i := range snap.Nodes {
		if snap.Nodes[i].Name == n.Name {
			me = &snap.Nodes[i]
		}
	}
	if me == nil || me.PublicKey.String() != k.pub || topology.NotReady(*me, now) != nil || pl.Segment == "" {
		return nil
	}
	if pl.Leader {
		if err := k.setAddress(ctx, pl.WireGuardIP); err != nil {
			return err
		}
		if err := k.configure(pl, me.PersistentKeepalive); err != nil {
			return err
		}
		if err := ipn(ctx, n.NS, "link", "set", Iface, "up"); err != nil {
			return err
		}
	} else if err := ipn(ctx, n.NS, "link", "set", Iface, "down"); err != nil {
		return err
	}
	return k.setRoutes(ctx, pl)
}

// setAddress is kg's iproute.SetAddress: cidr becomes kilo0's only address.
func (k *Kg) setAddress(ctx context.Context, cidr netip.Prefix) error {
	out, err := run(ctx, "ip", "-n", k.n.NS, "-o", "addr", "show", "dev", Iface)
	if err != nil {
		return err
	}
	has := false
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "inet" && f[i] != "inet6" {
				continue
			}
			if f[i+1] == cidr.String() {
				has = true
			} else if err := ipn(ctx, k.n.NS, "addr", "del", f[i+1], "dev", Iface); err != nil {
				return err
			}
		}
	}
	if has {
		return nil
	}
	return ipn(ctx, k.n.NS, "addr", "add", cidr.String(), "dev", Iface)
}

// kgPeer is one peer of kg's configuration.
type kgPeer struct {
	key       string
	endpoint  string // "" = nil
	allowed   []string
	keepalive int
}

// configure compares the device with kg's configuration by kg 0.7's rule
// (pkg/wireguard/conf.go, Conf.Equal) and rewrites it whole when they
// differ.
func (k *Kg) configure(pl topology.Plan, keepalive int) error {
	var conf []kgPeer
	for _, p := range pl.WireGuard.Peers {
		kp := kgPeer{key: p.PublicKey.String(), endpoint: p.Endpoint, keepalive: keepalive}
		for _, a := range p.AllowedIPs {
			kp.allowed = append(kp.allowed, a.String())
		}
		sort.Strings(kp.allowed)
		conf = append(conf, kp)
	}
	sort.Slice(conf, func(i, j int) bool { return conf[i].key < conf[j].key })
	d, err := readUAPI(k.n.WGDir, Iface)
	if err != nil {
		return fmt.Errorf("kg on %s: %w", k.n.Name, err)
	}
	equal, why := kgEqual(conf, d)
	if equal {
		return nil
	}
	lines := []string{"replace_peers=true"}
	for _, p := range conf {
		lines = append(lines, "public_key="+HexKey(p.key), "replace_allowed_ips=true")
		if p.endpoint != "" {
			lines = append(lines, "endpoint="+p.endpoint)
		}
		if p.keepalive > 0 {
			lines = append(lines, "persistent_keepalive_interval="+strconv.Itoa(p.keepalive))
		}
		for _, a := range p.allowed {
			lines = append(lines, "allowed_ip="+a)
		}
	}
	if err := setUAPI(k.n.WGDir, Iface, lines...); err != nil {
		return fmt.Errorf("kg on %s: %w", k.n.Name, err)
	}
	k.rewrites.Add(1)
	k.mu.Lock()
	k.reasons[why]++
	k.history = append(k.history, KgRewrite{At: time.Now(), Why: why})
	k.mu.Unlock()
	return nil
}

// kgEqual is kg 0.7's Conf.Equal on peers sorted by key: it answers at
// the first peer whose endpoint is nil on either side ("equal" when nil
// on both), which is how kg misses changes to the peers after it.
func kgEqual(conf []kgPeer, d *WGDevice) (bool, string) {
	if d.ListenPort != 51820 {
		return false, "port"
	}
	if len(conf) != len(d.Peers) {
		return false, "number of peers"
	}
	dev := make([]WGPeer, 0, len(d.Peers))
	for _, p := range d.Peers {
		dev = append(dev, p)
	}
	sort.Slice(dev, func(i, j int) bool { return dev[i].PublicKey < dev[j].PublicKey })
	for i, c := range conf {
		p := dev[i]
		if len(c.allowed) != len(p.AllowedIPs) {
			return false, "allowed IPs"
		}
		for j := range c.allowed {
			if c.allowed[j] != p.AllowedIPs[j] {
				return false, "allowed IPs"
			}
		}
		if c.endpoint == "" || p.Endpoint == "" {
			if c.endpoint == "" && p.Endpoint == "" {
				return true, ""
			}
			return false, "endpoint nil on one side"
		}
		if c.endpoint != p.Endpoint {
			return false, "endpoint"
		}
		if c.keepalive != p.Keepalive || c.key != p.PublicKey {
			return false, "persistent keepalive or key"
		}
	}
	return true, ""
}

// setRoutes is kg's route table Set: every route and rule of the plan
// (protocol static, as kg writes them), and the ones it set before that
// the plan no longer has removed.
func (k *Kg) setRoutes(ctx context.Context, pl topology.Plan) error {
	n := k.n
	routes, rules := map[string][]string{}, map[string][]string{}
	for _, r := range pl.Routes {
		args := []string{r.Dst.String(), "dev", r.Dev}
		if r.Gw.IsValid() {
			args = append(args, "via", r.Gw.String())
		}
		if r.OnLink {
			args = append(args, "onlink")
		}
		if r.Src.IsValid() {
			args = append(args, "src", r.Src.String())
		}
		if r.Table != 0 {
			args = append(args, "table", strconv.Itoa(r.Table))
		}
		routes[r.Dst.String()+"/"+strconv.Itoa(r.Table)] = append(args, "proto", "static")
	}
	for _, r := range pl.Rules {
		var args []string
		if r.Iif != "" {
			args = append(args, "iif", r.Iif)
		}
		if r.Src.IsValid() {
			args = append(args, "from", r.Src.String())
		}
		if r.Dst.IsValid() {
			args = append(args, "to", r.Dst.String())
		}
		args = append(args, "table", strconv.Itoa(r.Table))
		rules[strings.Join(args, " ")] = args
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var errs []error
	for key, args := range routes {
		errs = append(errs, ipn(ctx, n.NS, append([]string{"route", "replace"}, args...)...))
		k.routes[key] = args
	}
	for key, args := range k.routes {
		if _, ok := routes[key]; !ok {
			errs = append(errs, ignoreMissing(ipn(ctx, n.NS, append([]string{"route", "del"}, args...)...)))
			delete(k.routes, key)
		}
	}
	for key, args := range rules {
		if _, ok := k.rules[key]; ok {
			continue
		}
		errs = append(errs, ipn(ctx, n.NS, append([]string{"rule", "add"}, args...)...))
		k.rules[key] = args
	}
	for key, args := range k.rules {
		if _, ok := rules[key]; !ok {
			errs = append(errs, ignoreMissing(ipn(ctx, n.NS, append([]string{"rule", "del"}, args...)...)))
			delete(k.rules, key)
		}
	}
	return errors.Join(errs...)
}

// KgctlView is what `kgctl showconf node` computes for each node: Kilo's
// rules (the planner, with no Lease) on the cluster's state as the API has
// it now, the node's key as published.
func (c *Cluster) KgctlView(ctx context.Context, nodes ...*Node) (map[string]topology.Plan, error) {
	rc, err := cluster.ReadCluster(ctx, clock.RealClock{}, c.RestConfig(), Namespace, false)
	if err != nil {
		return nil, err
	}
	snap := cluster.Snapshot(rc.Objects, nil, c.Name)
	snap.Meshes, snap.Now, snap.Settings = nil, time.Now(), c.KgSettings()
	out := map[string]topology.Plan{}
	for _, n := range nodes {
		var key string
		for _, o := range snap.Nodes {
			if o.Name == n.Name {
				key = o.PublicKey.String()
			}
		}
		self, err := n.kgSelf(key)
		if err != nil {
			return nil, fmt.Errorf("node %s: no key published: %w", n.Name, err)
		}
		out[n.Name] = planner.Compute(snap, self)
	}
	return out, nil
}

// Kilo0Up reports whether kilo0 is up (administratively).
func (n *Node) Kilo0Up(ctx context.Context) (bool, error) {
	out, err := run(ctx, "ip", "-n", n.NS, "-o", "link", "show", "dev", Iface)
	if err != nil {
		return false, err
	}
	flags := out
	if i, j := strings.Index(out, "<"), strings.Index(out, ">"); i >= 0 && j > i {
		flags = out[i+1 : j]
	}
	for _, f := range strings.Split(flags, ",") {
		if f == "UP" {
			return true, nil
		}
	}
	return false, nil
}

// MatchesView compares the node's kilo0 with pl, its kgctl view: on a
// leader, kilo0 up with the same peers and allowed IPs, and the same
// endpoints where the view has one and the peer does not roam (a roaming
// peer's endpoint is what the device learned); on a non-leader, kilo0
// down (meshlet removes its peers; kg leaves them).
func (n *Node) MatchesView(ctx context.Context, pl topology.Plan) error {
	up, err := n.Kilo0Up(ctx)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if !pl.Leader {
		if up {
			return fmt.Errorf("node %s: not the leader by Kilo's rules, but kilo0 is up", n.Name)
		}
		return nil
	}
	if !up {
		return fmt.Errorf("node %s: leads %s by Kilo's rules, but kilo0 is down", n.Name, pl.Segment)
	}
	d, err := readUAPI(n.WGDir, Iface)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	var diffs []string
	want := map[string]bool{}
	for _, p := range pl.WireGuard.Peers {
		key := p.PublicKey.String()
		want[key] = true
		got, ok := d.Peers[key]
		if !ok {
			diffs = append(diffs, "missing peer "+p.Name)
			continue
		}
		var allowed []string
		for _, a := range p.AllowedIPs {
			allowed = append(allowed, a.String())
		}
		sort.Strings(allowed)
		if strings.Join(allowed, ",") != strings.Join(got.AllowedIPs, ",") {
			diffs = append(diffs, fmt.Sprintf("peer %s: allowed IPs %v, kgctl %v", p.Name, got.AllowedIPs, allowed))
		}
		if p.Endpoint != "" && !p.Roaming && p.Endpoint != got.Endpoint {
			diffs = append(diffs, fmt.Sprintf("peer %s: endpoint %q, kgctl %q", p.Name, got.Endpoint, p.Endpoint))
		}
	}
	for key := range d.Peers {
		if !want[key] {
			diffs = append(diffs, "extra peer "+key)
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("node %s: kilo0 differs from kgctl's view: %s", n.Name, strings.Join(diffs, "; "))
	}
	return nil
}

// Node is the name of the node kg runs on.
func (k *Kg) Node() string { return k.n.Name }
