// Package harness builds a multi-cluster meshlet mesh on one machine, for
// the end-to-end tests and `make demo`: real kube-apiservers (e2e/apiserver)
// with meshlet's CRDs and RBAC, nodes as network namespaces on a bridged
// underlay (optionally behind a NAT router), and the real meshlet binary on
// every node with a userspace WireGuard device.
//
// The harness plays the user and the kubelet: it creates clusters, Node
// objects (pod CIDR, addresses, the annotations a Talos user sets),
// ClusterMeshes, kubeconfig Secrets from read-only remote ServiceAccounts,
// Peer objects. It never programs WireGuard or routes on a meshlet node: only
// meshlet does. The one exception is a "peer host", the stand-in for a
// user's laptop behind a Kilo Peer object, which the user configures by hand
// in real life and the harness configures with `wg` here.
//
// Everything an Env creates is torn down by Close (processes by PID,
// namespaces, files), which tests register with t.Cleanup.
package harness

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configures an Env.
type Options struct {
	// Meshlet is the meshlet binary (default $MESHLET_BIN).
	Meshlet string
	// Logf receives progress lines (default: discarded).
	Logf func(format string, args ...any)
	// Dir holds logs and node state (default: a new temp dir, removed by
	// Close unless KeepDir).
	Dir     string
	KeepDir bool
	// ResyncPeriod of every meshlet (default 5s: short, so tests that
	// check "across resyncs" are quick).
	ResyncPeriod time.Duration
	// LogLevel of every meshlet (default debug).
	LogLevel string
	// APIServerArgs are added to every cluster's kube-apiserver (e.g.
	// --enable-priority-and-fairness=true, which e2e/apiserver turns off).
	APIServerArgs []string
	// SlowEtcd puts a delay line between every cluster's kube-apiserver
	// and its etcd (Cluster.Server.Etcd sets the latency).
	SlowEtcd bool
	// MeshletArgs are added to every meshlet's command line, before its
	// cluster's and its node's ExtraArgs (which can override them).
	MeshletArgs []string
}

// Env is one test mesh.
type Env struct {
	opts   Options
	id     string // prefix of every namespace name: "ml<pid>"
	Hub    string // namespace holding the underlay bridge
	dir    string
	tmpDir bool

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	cleanups []func()
	clusters []*Cluster
	nodes    []*Node
	hosts    int // underlay addresses handed out
	veths    int
	routers  int
	closed   bool
	// fwds are the forwarders of host addresses into namespaces, by
	// address (an API server's, reached from inside every node).
	fwds map[string][]*forwarder
}

// HubNet is the underlay: every node on the hub bridge gets an address here.
var HubNet = netip.MustParsePrefix("172.20.0.0/24")

// New creates the hub namespace and its bridge.
func New(opts Options) (*Env, error) {
	if opts.Meshlet == "" {
		opts.Meshlet = os.Getenv("MESHLET_BIN")
	}
	if opts.Meshlet == "" {
		return nil, errors.New("harness: no meshlet binary (set MESHLET_BIN or Options.Meshlet; `make build`)")
	}
	if _, err := os.Stat(opts.Meshlet); err != nil {
		return nil, fmt.Errorf("harness: meshlet binary: %w", err)
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.ResyncPeriod == 0 {
		opts.ResyncPeriod = 5 * time.Second
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "debug"
	}
	e := &Env{opts: opts, id: "ml" + strconv.Itoa(os.Getpid())}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "meshlet-e2e-")
		if err != nil {
			return nil, err
		}
		e.dir, e.tmpDir = d, !opts.KeepDir
	} else {
		e.dir = opts.Dir
		if err := os.MkdirAll(e.dir, 0o755); err != nil {
			return nil, err
		}
	}
	reapStale(e.ctx, opts.Logf)
	// /var/run/wireguard is a link to /run/wireguard; every node binds its
	// own directory over it, which needs the mount point on the host.
	if err := os.MkdirAll("/run/wireguard", 0o755); err != nil {
		return nil, err
	}
	// Likewise /run/meshlet, where each node's status socket is.
	if err := os.MkdirAll("/run/meshlet", 0o700); err != nil {
		return nil, err
	}
	e.Hub = e.id + "-hub"
	if err := e.addNetns(e.Hub); err != nil {
		e.Close()
		return nil, err
	}
	ctx := e.ctx
	for _, args := range [][]string{
		{"link", "add", "br0", "type", "bridge"},
		{"link", "set", "br0", "up"},
	} {
		if err := ipn(ctx, e.Hub, args...); err != nil {
			e.Close()
			return nil, err
		}
	}
	// The bridge must not filter what it forwards.
	_ = sysctl(ctx, e.Hub, "net.bridge.bridge-nf-call-iptables", "0")
	return e, nil
}

// reapStale removes namespaces left by an earlier harness process that
// died without cleaning up (killed test binary): their names carry the
// dead process's PID.
func reapStale(ctx context.Context, logf func(string, ...any)) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "ml") {
			continue
		}
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(f[0], "ml"), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == nil {
			continue // its owner is alive
		}
		logf("harness: removing stale namespace %s", f[0])
		killNetns(ctx, f[0])
	}
}

// Dir is the Env's work directory (logs under nodes/<name>/).
func (e *Env) Dir() string { return e.dir }

// Logf logs through Options.Logf.
func (e *Env) Logf(format string, args ...any) { e.opts.Logf(format, args...) }

// onClose registers f to run at Close, last registered first.
func (e *Env) onClose(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

func (e *Env) addNetns(name string) error {
	if _, err := run(e.ctx, "ip", "netns", "add", name); err != nil {
		return err
	}
	e.onClose(func() { killNetns(context.Background(), name) })
	return ipn(e.ctx, name, "link", "set", "lo", "up")
}

// nextHubAddr hands out the next underlay address on the hub bridge.
func (e *Env) nextHubAddr() netip.Prefix {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.hosts++
	a := HubNet.Addr().As4()
	a[3] = byte(10 + e.hosts)
	return netip.PrefixFrom(netip.AddrFrom4(a), HubNet.Bits())
}

// HubNet6 is the hub's IPv6 network, private in Kilo's sense (fd00::/16), so
// endpoints stay on the IPv4 underlay unless set: a dual-stack node's underlay address
// is hubAddr6 of its IPv4 one.
var HubNet6 = netip.MustParsePrefix("fd00:99::/64")

// nodad skips IPv6 duplicate address detection: the harness' addresses
// are unique, and usable at once.
func nodad(p netip.Prefix) []string {
	if p.Addr().Is6() {
		return []string{"nodad"}
	}
	return nil
}

func hubAddr6(v4 netip.Addr) netip.Prefix {
	a := HubNet6.Addr().As16()
	b := v4.As4()
	a[14], a[15] = b[2], b[3]
	return netip.PrefixFrom(netip.AddrFrom16(a), HubNet6.Bits())
}

// attachToHub connects namespace ns to the hub bridge with a veth whose
// inside end is called ifname, and gives it addr.
func (e *Env) attachToHub(ns, ifname string, addr netip.Prefix) error {
	e.mu.Lock()
	e.veths++
	hubEnd := "h" + strconv.Itoa(e.veths)
	e.mu.Unlock()
	ctx := e.ctx
	for _, c := range []struct {
		ns   string
		args []string
	}{
		{e.Hub, []string{"link", "add", hubEnd, "type", "veth", "peer", "name", ifname, "netns", ns}},
		{e.Hub, []string{"link", "set", hubEnd, "master", "br0", "up"}},
		{ns, append([]string{"addr", "add", addr.String(), "dev", ifname}, nodad(addr)...)},
		{ns, []string{"link", "set", ifname, "up"}},
	} {
		if err := ipn(ctx, c.ns, c.args...); err != nil {
			return err
		}
	}
	return nil
}

// Close tears everything down: meshlet processes and WireGuard devices (by
// PID, through their namespaces), namespaces, API servers, files. Safe to
// call more than once.
func (e *Env) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	cs := e.cleanups
	e.cleanups = nil
	e.mu.Unlock()
	e.cancel()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	if e.tmpDir {
		os.RemoveAll(e.dir)
	}
}

// Nodes returns the nodes in creation order.
func (e *Env) Nodes() []*Node {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Node(nil), e.nodes...)
}

// Clusters returns the clusters in creation order.
func (e *Env) Clusters() []*Cluster {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Cluster(nil), e.clusters...)
}

// Node returns the node called name, or nil.
func (e *Env) Node(name string) *Node {
	for _, n := range e.Nodes() {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Poll calls cond every interval until it returns true, an error that is
// not nil at the deadline, or ctx ends. Tests wait on state this way
// (never a bare sleep): the condition is what makes them go on.
func Poll(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %v waiting for %s: %w", timeout, what, last)
			}
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

// ForwardToNodes makes addr (on the host's loopback) reachable at the same
// address inside every node's namespace, as the API servers are.
func (e *Env) ForwardToNodes(addr string) error {
	for _, n := range e.Nodes() {
		if err := e.forwardInto(n.NS, addr); err != nil {
			return err
		}
	}
	return nil
}

// forwardInto makes addr (on the host's loopback) reachable at the same
// address inside namespace ns (forwardFromNetns).
func (e *Env) forwardInto(ns, addr string) error {
	f, err := forwardFromNetns(ns, addr)
	if err != nil {
		return err
	}
	e.mu.Lock()
	if e.fwds == nil {
		e.fwds = map[string][]*forwarder{}
	}
	e.fwds[addr] = append(e.fwds[addr], f)
	e.mu.Unlock()
	e.onClose(f.Close)
	return nil
}

// CutAPI makes cluster c's API server unreachable from every node (their
// connections to it close, new ones are refused) while it keeps running for
// the test; RestoreAPI undoes it.
func (e *Env) CutAPI(c *Cluster) { e.setCut("127.0.0.1:"+c.APIPort(), true) }

// RestoreAPI makes cluster c's API server reachable from the nodes again.
func (e *Env) RestoreAPI(c *Cluster) { e.setCut("127.0.0.1:"+c.APIPort(), false) }

func (e *Env) setCut(addr string, cut bool) {
	e.mu.Lock()
	fs := append([]*forwarder(nil), e.fwds[addr]...)
	e.mu.Unlock()
	for _, f := range fs {
		f.setCut(cut)
	}
}
