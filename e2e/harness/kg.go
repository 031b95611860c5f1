package harness

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
)

// KgNode stands in for a node run by kg 0.7, for mixed clusters: a network
// namespace with a userspace WireGuard device, a pod address, a Node object
// with the annotations kg publishes, and a controller that behaves as kg does
// on the wire. It watches the cluster, computes the node's configuration
// with Kilo's rules — meshlet's planner, which TestKiloCompat pins to Kilo's
// own output — and applies every change of it by rewriting the whole device
// (ReplacePeers), which forgets every session, as kg's applyTopology does.
// kg's own keepalive rule holds: every peer gets the node's
// persistent-keepalive annotation (none here), whatever a Peer says.
type KgNode struct {
	Name, Location string
	Cluster        *Cluster
	NS             string
	IP             netip.Prefix
	PodCIDR        netip.Prefix
	PodIP          netip.Addr
	WGDir          string
	Private        string
	Public         string
	env            *Env

	rewrites atomic.Int32
	mu       sync.Mutex
	applied  string // the configuration last written, to detect changes
	lastErr  error
}

// AddKgNode creates a kg-run node in location loc and starts its controller
// (until the test ends).
func (c *Cluster) AddKgNode(ctx context.Context, name, loc string) (*KgNode, error) {
	e := c.env
	k := &KgNode{Name: name, Location: loc, Cluster: c, NS: e.id + "-" + name, env: e}
	k.WGDir = filepath.Join(e.dir, "nodes", name, "run-wireguard")
	if err := os.MkdirAll(k.WGDir, 0o755); err != nil {
		return nil, err
	}
	k.Private, k.Public = NewKeyPair()
	if err := e.addNetns(k.NS); err != nil {
		return nil, err
	}
	k.IP = e.nextHubAddr()
	if err := e.attachToHub(k.NS, "eth0", k.IP); err != nil {
		return nil, err
	}
	k.PodCIDR = c.allocPodCIDR()
	k.PodIP = k.PodCIDR.Addr().Next()
	if err := ipn(ctx, k.NS, "addr", "add", netip.PrefixFrom(k.PodIP, 32).String(), "dev", "lo"); err != nil {
		return nil, err
	}
	if err := startDevice(ctx, e.opts.Meshlet, k.wrap, k.WGDir, Iface); err != nil {
		return nil, fmt.Errorf("kg node %s: %w", name, err)
	}
	if err := setUAPI(k.WGDir, Iface, "private_key="+HexKey(k.Private), "listen_port=51820"); err != nil {
		return nil, fmt.Errorf("kg node %s: %w", name, err)
	}
	// What kg publishes at start (its last-seen is refreshed like a fake
	// node's; the rest comes from the controller's plan).
	ann := map[string]string{
		topology.AnnotationLocation:    loc,
		topology.AnnotationKey:         k.Public,
		topology.AnnotationEndpoint:    netip.AddrPortFrom(k.IP.Addr(), 51820).String(),
		topology.AnnotationInternalIP:  k.IP.String(),
		topology.AnnotationLastSeen:    fmt.Sprint(time.Now().Unix()),
		topology.AnnotationGranularity: string(topology.GranularityLocation),
	}
	if err := c.createNode(ctx, name, k.PodCIDR, k.IP.Addr(), ann); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.fakeKeep[name] = true
	c.mu.Unlock()

	changed := make(chan struct{}, 1)
	local, err := cluster.NewLocal(cluster.LocalOptions{Config: c.RestConfig(), Client: c.Admin, Namespace: Namespace, Node: name,
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
	cctx, cancel := context.WithCancel(context.Background())
	e.onClose(cancel)
	local.Start(cctx)
	if !local.WaitForSync(ctx) {
		return nil, fmt.Errorf("kg node %s: caches not synced", name)
	}
	go k.control(cctx, local, changed)
	return k, nil
}

func (k *KgNode) wrap(args ...string) []string {
	return append([]string{"ip", "netns", "exec", k.NS, "sh", "-c",
		`mount --bind "$1" /run/wireguard && shift && exec "$@"`, "sh", k.WGDir}, args...)
}

// Rewrites counts the full device rewrites so far.
func (k *KgNode) Rewrites() int { return int(k.rewrites.Load()) }

// Err is the last error of the controller (nil when it applied).
func (k *KgNode) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lastErr
}

// Device reads the node's WireGuard device.
func (k *KgNode) Device() (*WGDevice, error) { return readUAPI(k.WGDir, Iface) }

// control is kg's loop: on every change (and every 5 s, as kg's resync),
// plan and, when the configuration differs from the one written last,
// rewrite the device and its routes and publish the annotations.
func (k *KgNode) control(ctx context.Context, local *cluster.Local, changed <-chan struct{}) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		err := k.apply(ctx, local)
		k.mu.Lock()
		k.lastErr = err
		k.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

func (k *KgNode) apply(ctx context.Context, local *cluster.Local) error {
	c := k.Cluster
	st := local.State(c.Name)
	snap := topology.Snapshot{Now: time.Now(), Nodes: st.Nodes, Peers: st.Peers, Settings: topology.Settings{
		Subnet: c.WGSubnet, Encapsulate: topology.EncapsulateNever, Local: true, Granularity: topology.GranularityLocation}}
	pub, err := topology.ParseKey(k.Public)
	if err != nil {
		return err
	}
	pl := planner.Compute(snap, topology.Self{Name: k.Name, PublicKey: pub, DefaultInterface: "eth0",
		Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: k.IP}}})
	if !pl.Leader {
		return fmt.Errorf("kg node %s: the stand-in only leads its location", k.Name)
	}
	// kg's configuration: every peer, with the node's keepalive (none).
	lines := []string{"replace_peers=true"}
	for _, p := range pl.WireGuard.Peers {
		lines = append(lines, "public_key="+HexKey(p.PublicKey.String()), "replace_allowed_ips=true")
		if p.Endpoint != "" {
			lines = append(lines, "endpoint="+p.Endpoint)
		}
		for _, a := range p.AllowedIPs {
			lines = append(lines, "allowed_ip="+a.String())
		}
	}
	conf := strings.Join(lines, "\n")
	k.mu.Lock()
	same := conf == k.applied
	k.mu.Unlock()
	if !same {
		if err := setUAPI(k.WGDir, Iface, lines...); err != nil {
			return fmt.Errorf("kg node %s: %w", k.Name, err)
		}
		k.rewrites.Add(1)
		k.mu.Lock()
		k.applied = conf
		k.mu.Unlock()
	}
	for _, args := range [][]string{
		{"addr", "replace", pl.WireGuardIP.String(), "dev", Iface},
		{"link", "set", Iface, "up"},
	} {
		if err := ipn(ctx, k.NS, args...); err != nil {
			return err
		}
	}
	for _, r := range pl.Routes {
		args := []string{"route", "replace", r.Dst.String(), "dev", r.Dev}
		if r.Gw.IsValid() {
			args = append(args, "via", r.Gw.String())
		}
		if r.OnLink {
			args = append(args, "onlink")
		}
		if r.Src.IsValid() {
			args = append(args, "src", r.Src.String())
		}
		if err := ipn(ctx, k.NS, args...); err != nil {
			return err
		}
	}
	patch := map[string]*string{}
	keys := make([]string, 0, len(pl.Annotations))
	for key := range pl.Annotations {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if key == topology.AnnotationVersion || key == topology.AnnotationLastSeen {
			continue // kg publishes no meshlet marker; last-seen is refreshed apart
		}
		v := pl.Annotations[key]
		patch[key] = &v
	}
	return c.PatchNodeAnnotations(ctx, k.Name, patch)
}
