package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/status"
)

// MetricsAddr is where every meshlet listens, inside its own namespace.
const MetricsAddr = "127.0.0.1:1107"

// Iface is the WireGuard interface meshlet owns on every node.
const Iface = "kilo0"

// NodeSpec describes a node.
type NodeSpec struct {
	Name     string
	Location string
	// Annotations the user sets (Talos machine.nodeAnnotations), besides
	// the location: persistent-keepalive, force-endpoint, leader...
	Annotations map[string]string
	// Behind puts the node on the LAN of a NAT router instead of the hub.
	Behind *Router
	// ExtraArgs are added to meshlet's command line.
	ExtraArgs []string
	// DropIn runs meshlet as the image in kg's DaemonSet does
	// (docs/dropin.md): kg's command line without a command, kg's defaults
	// (--clean-up=true among them) and kg's key file (KgKeyFile); --cni=false,
	// as the harness' nodes have no CNI.
	DropIn bool
}

// Node is a network namespace with its own /run/wireguard, a pod address
// on its loopback, a Node object, and (once started) meshlet.
type Node struct {
	NodeSpec
	Cluster *Cluster
	NS      string
	IP      netip.Prefix // underlay address (meshlet's --internal-cidr)
	PodCIDR netip.Prefix
	PodIP   netip.Addr // first address of PodCIDR, on lo: the "pod"
	// IP6, PodCIDR6 and PodIP6 are the same of IPv6, in a dual-stack
	// cluster (ClusterSpec.PodNet6; zero otherwise).
	IP6      netip.Prefix
	PodCIDR6 netip.Prefix
	PodIP6   netip.Addr
	Dir      string
	WGDir    string // bound over /run/wireguard for this node's processes
	RunDir   string // bound over /run/meshlet: the status socket
	LogPath  string
	env      *Env

	mu    sync.Mutex
	agent *exec.Cmd
	done  chan struct{}
	kg    *Kg // kg-shape (RunKg), nil when kg does not run
}

// AddNode creates the node's namespace, underlay, pod address and Node
// object. It does not start meshlet (Start does), so a test can create
// every node before any meshlet sees a half-built cluster.
func (c *Cluster) AddNode(ctx context.Context, spec NodeSpec) (*Node, error) {
	e := c.env
	n := &Node{NodeSpec: spec, Cluster: c, env: e, NS: e.id + "-" + spec.Name}
	n.Dir = filepath.Join(e.dir, "nodes", spec.Name)
	n.WGDir = filepath.Join(n.Dir, "run-wireguard")
	n.RunDir = filepath.Join(n.Dir, "run-meshlet")
	n.LogPath = filepath.Join(n.Dir, "meshlet.log")
	if err := os.MkdirAll(n.WGDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(n.RunDir, 0o700); err != nil {
		return nil, err
	}
	if err := e.addNetns(n.NS); err != nil {
		return nil, err
	}
	var err error
	switch {
	case spec.Behind != nil && c.ipv6Only():
		err = fmt.Errorf("node %s: an IPv6-only node behind a NAT router is not built", spec.Name)
	case spec.Behind != nil:
		n.IP, err = spec.Behind.attach(ctx, n.NS)
	case c.ipv6Only():
		// No IPv4 on the node at all: its underlay is the hub's IPv6.
		n.IP = hubAddr6(e.nextHubAddr().Addr())
		err = e.attachToHub(n.NS, "eth0", n.IP)
	default:
		n.IP = e.nextHubAddr()
		err = e.attachToHub(n.NS, "eth0", n.IP)
	}
	if err != nil {
		return nil, err
	}
	n.PodCIDR = c.allocPodCIDR()
	n.PodIP = n.PodCIDR.Addr().Next()
	if err := ipn(ctx, n.NS, append([]string{"addr", "add", host(n.PodIP).String(), "dev", "lo"}, nodad(host(n.PodIP))...)...); err != nil {
		return nil, err
	}
	pods, internal := []netip.Prefix{n.PodCIDR}, []netip.Addr{n.IP.Addr()}
	if c.PodNet6.IsValid() {
		var addrs [][]string
		if spec.Behind != nil {
			if n.IP6, err = spec.Behind.attach6(ctx, n.NS); err != nil {
				return nil, err
			}
		} else {
			n.IP6 = hubAddr6(n.IP.Addr())
			addrs = append(addrs, []string{n.IP6.String(), "dev", "eth0"})
		}
		n.PodCIDR6 = c.allocPodCIDR6()
		n.PodIP6 = n.PodCIDR6.Addr().Next()
		// nodad: the addresses are unique here, and usable at once.
		for _, a := range append(addrs, []string{host(n.PodIP6).String(), "dev", "lo"}) {
			if err := ipn(ctx, n.NS, append(append([]string{"addr", "add"}, a...), "nodad")...); err != nil {
				return nil, err
			}
		}
		pods, internal = append(pods, n.PodCIDR6), append(internal, n.IP6.Addr())
	}
	// Each API server listens on the host's loopback; make the same
	// address work inside the node (see forwardFromNetns).
	for _, cl := range e.Clusters() {
		if err := e.forwardInto(n.NS, "127.0.0.1:"+cl.APIPort()); err != nil {
			return nil, err
		}
	}
	ann := map[string]string{topology.AnnotationLocation: spec.Location}
	for k, v := range spec.Annotations {
		ann[k] = v
	}
	if err := c.createNode(ctx, spec.Name, pods, internal, ann); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.nodes = append(e.nodes, n)
	e.mu.Unlock()
	return n, nil
}

// wrap returns the command line that runs args inside the node: its network
// namespace and a private mount namespace with the node's directories bound
// over /run/wireguard (the UAPI socket path is global, interface names are
// per namespace; docs/testing.md, "Nodes") and /run/meshlet (the status
// socket, as in a pod).
func (n *Node) wrap(args ...string) []string {
	return append([]string{"ip", "netns", "exec", n.NS, "sh", "-c",
		`mount --bind "$1" /run/wireguard && mount --bind "$2" /run/meshlet && shift 2 && exec "$@"`, "sh", n.WGDir, n.RunDir}, args...)
}

// StatusSocket is the node's status socket as the host sees it.
func (n *Node) StatusSocket() string { return filepath.Join(n.RunDir, "status.sock") }

// Exec runs a command inside the node (network + mount namespace) and
// returns its output, e.g. `wg show kilo0`.
func (n *Node) Exec(ctx context.Context, args ...string) (string, error) {
	w := n.wrap(args...)
	return run(ctx, w[0], w[1:]...)
}

// Args is meshlet's command line for this node.
func (n *Node) Args() []string {
	c := n.Cluster
	if n.DropIn {
		args := []string{
			// kg's flags, as Kilo's manifests pass them.
			"--hostname=" + n.Name,
			"--kubeconfig=" + c.AgentKubeconfig,
			"--subnet=" + c.WGSubnet.String(),
			"--internal-cidr=" + n.IP.String(),
			"--encapsulate=never",
			"--local=true",
			"--mesh-granularity=location",
			"--listen=" + MetricsAddr,
			"--resync-period=" + n.env.opts.ResyncPeriod.String(),
			"--log-level=" + n.env.opts.LogLevel,
			"--cni=false",
			"--key-file=" + n.KgKeyFile(),
			// meshlet's own.
			"--wireguard=userspace",
			"--namespace=" + Namespace,
			"--cluster-name=" + c.Name,
		}
		return append(args, n.extraArgs()...)
	}
	args := []string{"run",
		"--wireguard=userspace",
		"--hostname=" + n.Name,
		"--kubeconfig=" + c.AgentKubeconfig,
		"--namespace=" + Namespace,
		"--cluster-name=" + c.Name,
		"--subnet=" + c.WGSubnet.String(),
		"--internal-cidr=" + n.IP.String(),
		// No ipip on this kernel: nodes of a location share a subnet, so
		// non-leaders reach their leader directly on the underlay.
		"--encapsulate=never",
		"--local=true",
		"--mesh-granularity=location",
		"--listen=" + MetricsAddr,
		"--key-file=" + filepath.Join(n.Dir, "key"),
		"--resync-period=" + n.env.opts.ResyncPeriod.String(),
		"--log-level=" + n.env.opts.LogLevel,
	}
	return append(args, n.extraArgs()...)
}

// extraArgs follow meshlet's command line in either shape: the Env's,
// then the cluster's, then the node's, so the later override the earlier.
func (n *Node) extraArgs() []string {
	args := append([]string(nil), n.env.opts.MeshletArgs...)
	if n.IP6.IsValid() {
		args = append(args, "--dual-stack-subnet="+n.Cluster.WGSubnet6.String(), "--internal-cidr="+n.IP6.String())
	}
	args = append(args, n.Cluster.ExtraArgs...)
	return append(args, n.ExtraArgs...)
}

// Start starts meshlet on the node (it starts or adopts the node's
// userspace WireGuard device) and waits until /readyz answers.
func (n *Node) Start(ctx context.Context) error {
	if err := n.start(); err != nil {
		return err
	}
	return n.WaitReady(ctx, 60*time.Second)
}

// Launch starts meshlet on the node without waiting for /readyz: for a
// node whose reconciles are meant to fail (a fault the test causes).
func (n *Node) Launch() error { return n.start() }

func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.agent != nil {
		return fmt.Errorf("node %s: meshlet already running", n.Name)
	}
	if n.kg != nil {
		return fmt.Errorf("node %s: kg runs there; kg and meshlet both own kilo0", n.Name)
	}
	log, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	w := n.wrap(append([]string{n.env.opts.Meshlet}, n.Args()...)...)
	cmd := exec.Command(w[0], w[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// The agent dies with the harness; its detached WireGuard device does
	// not (by design) and is killed through the namespace at Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(log, "=== harness: starting %s\n", strings.Join(w, " "))
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("node %s: starting meshlet: %w", n.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(done)
	}()
	n.agent, n.done = cmd, done
	return nil
}

// PID is the agent's process id (0 when not running). ip netns exec and sh
// exec into meshlet, so this is meshlet itself.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.agent == nil {
		return 0
	}
	return n.agent.Process.Pid
}

// Stop stops the agent with sig (SIGTERM: graceful, SIGKILL: a crash) and
// waits for it to exit. The WireGuard device process stays (by design).
func (n *Node) Stop(sig syscall.Signal) error {
	n.mu.Lock()
	cmd, done := n.agent, n.done
	n.agent = nil
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("node %s: meshlet ignored %v for 10s", n.Name, sig)
	}
}

// PowerOff kills every process of the node (agent and WireGuard device),
// like a node that lost power: its last-seen is no longer refreshed.
func (n *Node) PowerOff() {
	_ = n.Stop(syscall.SIGKILL)
	_ = n.StopKg(false)
	for _, p := range nsPIDs(context.Background(), n.NS) {
		if p != os.Getpid() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	// Its loss must also be a loss of connectivity: take the underlay down.
	_ = ipn(context.Background(), n.NS, "link", "set", "eth0", "down")
}

// Running reports whether the agent process is alive.
func (n *Node) Running() bool {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// httpClient talks to meshlet's listener inside the node.
func (n *Node) httpClient() *http.Client {
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return DialInNetns(ctx, n.NS, addr)
		},
	}}
}

// HTTPGet fetches url from inside the node's network namespace, as any
// process on the node (or on the underlay, for another node's address)
// could.
func (n *Node) HTTPGet(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := n.httpClient().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// statusClient talks to meshlet's status socket.
func (n *Node) statusClient() *http.Client {
	return status.SocketClient(n.StatusSocket(), 3*time.Second)
}

func (n *Node) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+MetricsAddr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	hc := n.httpClient()
	if path == "/status" {
		hc = n.statusClient()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// WaitReady waits until meshlet's /readyz answers 200.
func (n *Node) WaitReady(ctx context.Context, timeout time.Duration) error {
	err := Poll(ctx, timeout, 100*time.Millisecond, n.Name+" /readyz", func() (bool, error) {
		if !n.Running() {
			return false, errors.New("meshlet exited; log: " + n.LogTail(15))
		}
		code, body, err := n.get(ctx, "/readyz")
		if err != nil {
			return false, err
		}
		if code != http.StatusOK {
			return false, fmt.Errorf("%d %s", code, strings.TrimSpace(string(body)))
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// LogTail returns the last lines of the node's meshlet log.
func (n *Node) LogTail(lines int) string {
	b, err := os.ReadFile(n.LogPath)
	if err != nil {
		return err.Error()
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// Metrics scrapes meshlet's /metrics.
func (n *Node) Metrics(ctx context.Context) (Metrics, error) {
	code, body, err := n.get(ctx, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("node %s: scraping: %w", n.Name, err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("node %s: /metrics: %d", n.Name, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("node %s: parsing metrics: %w", n.Name, err)
	}
	return Metrics(fams), nil
}

// Metrics is one scrape.
type Metrics map[string]*dto.MetricFamily

// Value returns the value of the series of family name whose labels
// include every given label (pairs: k, v, ...), and whether one exists.
// Counters and gauges give their value; histograms their sample count.
func (m Metrics) Value(name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
	for _, s := range m.Series(name, labels...) {
		found = true
		switch {
		case s.Counter != nil:
			sum += s.Counter.GetValue()
		case s.Gauge != nil:
			sum += s.Gauge.GetValue()
		case s.Histogram != nil:
			sum += float64(s.Histogram.GetSampleCount())
		case s.Untyped != nil:
			sum += s.Untyped.GetValue()
		}
	}
	return sum, found
}

// Series returns the series of family name matching labels.
func (m Metrics) Series(name string, labels ...string) []*dto.Metric {
	f := m[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
next:
	for _, s := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			ok := false
			for _, l := range s.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					ok = true
				}
			}
			if !ok {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// Label returns a series' label value.
func Label(s *dto.Metric, name string) string {
	for _, l := range s.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Device reads the node's WireGuard device (nil, nil when there is none:
// meshlet not started, or the device process is gone).
func (n *Node) Device() (*WGDevice, error) {
	if _, err := os.Stat(filepath.Join(n.WGDir, Iface+".sock")); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	d, err := readUAPI(n.WGDir, Iface)
	if err != nil {
		return nil, fmt.Errorf("node %s: reading %s: %w", n.Name, Iface, err)
	}
	return d, nil
}

// PublicKey is the key meshlet published on the Node.
func (n *Node) PublicKey(ctx context.Context) (string, error) {
	a, err := n.Cluster.Annotations(ctx, n.Name)
	if err != nil {
		return "", err
	}
	return a[topology.AnnotationKey], nil
}

// PingResult is the outcome of one ping run.
type PingResult struct {
	Sent, Received int
	Output         string
}

// Lost is the number of unanswered echo requests.
func (p PingResult) Lost() int { return p.Sent - p.Received }

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// Ping pings dst from the node's pod address (so the packet takes the
// mesh, not the underlay): count requests every interval, each waiting up
// to wait for its reply.
func (n *Node) Ping(ctx context.Context, dst netip.Addr, count int, interval, wait time.Duration) (PingResult, error) {
	args := []string{"netns", "exec", n.NS, "ping", "-n", "-q", "-c", strconv.Itoa(count),
		"-i", fmt.Sprintf("%.3f", interval.Seconds()), "-W", fmt.Sprintf("%.3f", wait.Seconds()),
		"-I", n.podIP(dst).String(), dst.String()}
	cmd := exec.CommandContext(ctx, "ip", args...)
	out, _ := cmd.CombinedOutput() // exit 1 = some lost: read the numbers
	m := pingStats.FindStringSubmatch(string(out))
	if m == nil {
		return PingResult{Output: string(out)}, fmt.Errorf("node %s: ping %s: %s", n.Name, dst, strings.TrimSpace(string(out)))
	}
	r := PingResult{Output: string(out)}
	r.Sent, _ = strconv.Atoi(m[1])
	r.Received, _ = strconv.Atoi(m[2])
	return r, nil
}

// podIP is the node's pod address of dst's family.
func (n *Node) podIP(dst netip.Addr) netip.Addr {
	if dst.Is6() && n.PodIP6.IsValid() {
		return n.PodIP6
	}
	return n.PodIP
}

// PodIPs are the node's pod addresses: IPv4, IPv6, or both.
func (n *Node) PodIPs() []netip.Addr {
	if n.PodIP6.IsValid() {
		return []netip.Addr{n.PodIP, n.PodIP6}
	}
	return []netip.Addr{n.PodIP}
}

func host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// Reachable reports whether one ping (from the pod address) gets a reply
// within wait.
func (n *Node) Reachable(ctx context.Context, dst netip.Addr, wait time.Duration) bool {
	r, err := n.Ping(ctx, dst, 1, 200*time.Millisecond, wait)
	return err == nil && r.Received == 1
}

// WaitReachable polls until dst answers a ping from the node's pod address.
func (n *Node) WaitReachable(ctx context.Context, dst netip.Addr, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	err := Poll(ctx, timeout, 0, fmt.Sprintf("%s → %s", n.Name, dst), func() (bool, error) {
		return n.Reachable(ctx, dst, 500*time.Millisecond), nil
	})
	return time.Since(start), err
}

// CutUDP drops every UDP packet between the node and addr, in the node's
// namespace, as a firewall or a broken path would: WireGuard to and from
// that address stops, everything else (the API servers over the loopback
// forwards, other peers) keeps working. It lasts as long as the node.
func (n *Node) CutUDP(ctx context.Context, addr netip.Addr) error {
	rules := fmt.Sprintf(`table inet e2e_cut {
	chain in { type filter hook input priority 0; ip saddr %[1]s meta l4proto udp drop; }
	chain out { type filter hook output priority 0; ip daddr %[1]s meta l4proto udp drop; }
}
`, addr)
	if err := nftLoad(ctx, n.NS, rules); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// BlockWireGuard drops every UDP packet to or from port 51820 in the
// node's namespace, both ways, as a firewall or a broken uplink would:
// WireGuard to and from the node stops while its agent keeps talking to
// its API server (TCP). The returned function lifts it.
func (n *Node) BlockWireGuard(ctx context.Context) (func() error, error) {
	rules := `table inet e2e_wg {
	chain in { type filter hook input priority 0; udp dport 51820 drop; udp sport 51820 drop; }
	chain out { type filter hook output priority 0; udp dport 51820 drop; udp sport 51820 drop; }
}
`
	if err := nftLoad(ctx, n.NS, rules); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return func() error {
		if _, err := run(context.Background(), "ip", "netns", "exec", n.NS, "nft", "delete", "table", "inet", "e2e_wg"); err != nil {
			return fmt.Errorf("node %s: lifting the WireGuard block: %w", n.Name, err)
		}
		return nil
	}, nil
}

// DropForeignAddresses makes the node's underlay behave as a cloud port
// with anti-spoofing (AWS's source/destination check, OpenStack's port
// security): packets leaving eth0 from an address that is not the node's,
// and packets arriving on eth0 for one, are dropped. What a leader
// forwards for its non-leaders unencapsulated is exactly such packets.
func (n *Node) DropForeignAddresses(ctx context.Context) (func() error, error) {
	ip := n.IP.Addr().String()
	rules := `table inet e2e_antispoof {
	chain in { type filter hook prerouting priority -300; iifname "eth0" ip daddr != ` + ip + ` drop; }
	chain out { type filter hook postrouting priority 300; oifname "eth0" ip saddr != ` + ip + ` drop; }
}
`
	if err := nftLoad(ctx, n.NS, rules); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return func() error {
		if _, err := run(context.Background(), "ip", "netns", "exec", n.NS, "nft", "delete", "table", "inet", "e2e_antispoof"); err != nil {
			return fmt.Errorf("node %s: lifting the anti-spoofing rules: %w", n.Name, err)
		}
		return nil
	}, nil
}

// RouteProtocol is meshlet's routing protocol number (netlinkx).
const RouteProtocol = "109"

// Routes lists meshlet's routes on the node (every table, IPv4 then IPv6), one per line as
// `ip route` prints them.
func (n *Node) Routes(ctx context.Context) ([]string, error) {
	var rs []string
	for _, family := range []string{"-4", "-6"} {
		out, err := run(ctx, "ip", "-n", n.NS, family, "route", "show", "table", "all", "proto", RouteProtocol)
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				rs = append(rs, l)
			}
		}
	}
	return rs, nil
}

// HistogramQuantile estimates quantile q of a histogram series from its
// buckets, as PromQL's histogram_quantile does (linear inside a bucket).
func HistogramQuantile(s *dto.Metric, q float64) float64 {
	h := s.GetHistogram()
	if h == nil || h.GetSampleCount() == 0 {
		return 0
	}
	rank := q * float64(h.GetSampleCount())
	prevBound, prevCount := 0.0, 0.0
	for _, b := range h.Bucket {
		c := float64(b.GetCumulativeCount())
		if c >= rank {
			if c == prevCount {
				return b.GetUpperBound()
			}
			return prevBound + (b.GetUpperBound()-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevBound, prevCount = b.GetUpperBound(), c
	}
	return prevBound
}

// RemovePeer removes a peer from the node's device behind meshlet's back,
// as `wg set kilo0 peer KEY remove` does (same UAPI operation).
func (n *Node) RemovePeer(pubKey string) error {
	if err := setUAPI(n.WGDir, Iface, "public_key="+HexKey(pubKey), "remove=true"); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// HistogramDelta returns after − before for one histogram series (same
// buckets): the observations made between two scrapes, so quantiles can be
// taken over just those.
func HistogramDelta(before, after *dto.Metric) *dto.Metric {
	ha, hb := after.GetHistogram(), before.GetHistogram()
	if ha == nil {
		return after
	}
	count := ha.GetSampleCount() - hb.GetSampleCount()
	sum := ha.GetSampleSum() - hb.GetSampleSum()
	h := &dto.Histogram{SampleCount: &count, SampleSum: &sum}
	for i, b := range ha.Bucket {
		c := b.GetCumulativeCount()
		if hb != nil && i < len(hb.Bucket) {
			c -= hb.Bucket[i].GetCumulativeCount()
		}
		ub := b.GetUpperBound()
		h.Bucket = append(h.Bucket, &dto.Bucket{CumulativeCount: &c, UpperBound: &ub})
	}
	return &dto.Metric{Histogram: h}
}
