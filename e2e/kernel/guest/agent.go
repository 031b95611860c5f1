package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Agent mode: the real agent, `meshlet run --wireguard=kernel`, one per
// node namespace, against the kube-apiserver that e2e/kernel/host runs on
// the host. run.sh packs into the initramfs (under /etc/meshlet):
//
//	mode                "agent"
//	api-port            the API server's port on the host's loopback
//	meshlet.kubeconfig  meshlet's ServiceAccount, server https://127.0.0.1:6443
//	keys/NODE           each node's WireGuard private key (the host checks
//	                    the published key annotations against them)
//
// The guest reaches the host's 127.0.0.1:PORT at 10.0.2.2:PORT (QEMU user
// networking, eth0 in the guest's root namespace). The node namespaces
// have no route there; for each node the runner listens on 127.0.0.1:6443
// inside the node's namespace (a socket keeps the namespace it was made
// in) and forwards every connection to 10.0.2.2:PORT from the root
// namespace. That stands in for a node's path to its API server.
const (
	etcDir        = "/etc/meshlet"
	guestAddr     = "10.0.2.15/24"
	hostGateway   = "10.0.2.2"
	apiListenAddr = "127.0.0.1:6443"
	metricsAddr   = "127.0.0.1:1107"
)

// agentSteps are agent mode's checks, in order.
var agentSteps = []string{
	"fixture",
	"api-reachable",
	"plan",
	"agent-ready-leader",
	"agent-ready-worker",
	"agent-ready-remote",
	"kernel-wireguard-leader",
	"kernel-wireguard-remote",
	"worker-kilo0-down-no-peers",
	"worker-route-via-cilium_tunl",
	"pod-ping-worker-to-remote",
	"pod-ping6-worker-to-remote",
	"pod-ping6-remote-to-worker",
	"traffic-via-leader",
	"remote-handshake-with-leader",
	"leader-return-rule-table-1107",
	"private-ip-ping-returns-via-tunnel",
	"agent-metrics-steady",
	"route-restored-by-watch",
	"return-rule-needed",
	"leader-restart-session-kept",
	"rolling-restart-under-ping",
	"encapsulate-always-dual-stack",
	"leader-power-off-failover",
	"agents-stopped-dataplane-kept",
}

// agentProc is one running `meshlet run`.
type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

type agentDriver struct {
	// always runs the agents in Kilo's default modes instead of
	// Cozystack's (encapsulateAlways).
	always bool
	dir    string // /run/meshlet: per-node key, log
	kc     string // kubeconfig
	procs  map[string]*agentProc
	exits  map[string][]string // node -> exit status of every stopped meshlet
}

func (d *agentDriver) logPath(n nodeDef) string { return filepath.Join(d.dir, n.Name, "meshlet.log") }

// args is meshlet's command line on node n: Cozystack's Kilo flags, and
// the location Lease on (the default): location a (leader, worker) is
// governed by it (docs/failover.md#governed), node "leader" takes it first
// (Kilo's order), keeps it across its agent's graceful restart and loses it
// to "worker" when it is powered off.
func (d *agentDriver) args(n nodeDef) []string {
	return []string{"run",
		"--wireguard=kernel",
		"--hostname=" + n.Name,
		"--kubeconfig=" + d.kc,
		"--internal-cidr=" + n.Private.String(),
		"--internal-cidr=" + n.Private6.String(),
		"--dual-stack-subnet=" + settings().DualStackSubnet.String(),
		"--compatibility=" + compatibility(d.always),
		"--encapsulate=" + encapsulate(d.always),
		"--local=" + strconv.FormatBool(d.always),
		"--mesh-granularity=location",
		"--subnet=" + settings().Subnet.String(),
		"--port=" + strconv.Itoa(wgPort),
		"--listen=" + metricsAddr,
		"--key-file=" + filepath.Join(d.dir, n.Name, "key"),
		"--status-socket=" + filepath.Join(d.dir, n.Name, "status.sock"),
		"--log-level=info",
	}
}

func compatibility(always bool) string {
	if always {
		return ""
	}
	return "cilium"
}

func encapsulate(always bool) string {
	if always {
		return "always"
	}
	return "crosssubnet"
}

// start starts meshlet in node n's namespace (`ip netns exec` execs it, so
// the process is meshlet itself).
func (d *agentDriver) start(n nodeDef) error {
	if p := d.procs[n.Name]; p != nil {
		return fmt.Errorf("%s: meshlet already running", n.Name)
	}
	log, err := os.OpenFile(d.logPath(n), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(ipBin, append([]string{"netns", "exec", n.Name, "/bin/meshlet"}, d.args(n)...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(log, "=== kernel-guest: starting %s\n", strings.Join(cmd.Args, " "))
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	p := &agentProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		fmt.Fprintf(log, "=== kernel-guest: meshlet exited: %v\n", cmd.ProcessState)
		log.Close()
		close(p.done)
	}()
	d.procs[n.Name] = p
	return nil
}

// stop sends SIGTERM and waits for the exit (meshlet leaves the data
// plane in place on SIGTERM).
func (d *agentDriver) stop(ctx context.Context, n nodeDef) error {
	p := d.procs[n.Name]
	if p == nil {
		return fmt.Errorf("%s: meshlet not running", n.Name)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(pollTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s: meshlet did not stop within %s of SIGTERM", n.Name, pollTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	d.reaped(n, p)
	return nil
}

// reaped forgets node n's exited meshlet p and records its exit status.
func (d *agentDriver) reaped(n nodeDef, p *agentProc) {
	delete(d.procs, n.Name)
	d.exits[n.Name] = append(d.exits[n.Name], p.cmd.ProcessState.String())
}

// kill stops meshlet on node n with SIGKILL, as a power loss would: nothing
// runs its shutdown (the Lease is neither released nor stretched).
func (d *agentDriver) kill(n nodeDef) error {
	p := d.procs[n.Name]
	if p == nil {
		return fmt.Errorf("%s: meshlet not running", n.Name)
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	d.reaped(n, p)
	return nil
}

// get fetches http://127.0.0.1:1107/PATH inside node n (`guest httpget`
// through `ip netns exec`; the static busybox's wget segfaults there).
func get(ctx context.Context, n nodeDef, path string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return inNS(ctx, n.Name, exe, "httpget", "http://"+metricsAddr+path)
}

// httpgetCmd is `guest httpget URL`: print the body, fail unless 200.
func httpgetCmd(url string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, oneLine(string(b)))
	}
	_, err = os.Stdout.Write(b)
	return err
}

// waitReady polls /readyz until it answers 200 or meshlet exits.
func (d *agentDriver) waitReady(ctx context.Context, n nodeDef, timeout time.Duration) error {
	p := d.procs[n.Name]
	if p == nil {
		return fmt.Errorf("%s: meshlet not running", n.Name)
	}
	var last error
	err := poll(ctx, timeout, func() error {
		select {
		case <-p.done:
			return errStop{fmt.Errorf("meshlet exited: %v", p.cmd.ProcessState)}
		default:
		}
		_, last = get(ctx, n, "/readyz")
		return last
	})
	if err != nil {
		return fmt.Errorf("%s: /readyz: %w", n.Name, err)
	}
	return nil
}

// errStop ends a poll at once.
type errStop struct{ error }

// poll calls fn until it returns nil, errStop, or timeout passes; it
// returns fn's last error.
func poll(ctx context.Context, timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		var stop errStop
		if errors.As(err, &stop) {
			return stop.error
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dumpLogs prints the tail of every node's meshlet log.
func (d *agentDriver) dumpLogs(lines int) {
	for _, n := range scenarioNodes {
		b, err := os.ReadFile(d.logPath(n))
		if err != nil {
			info("log %s: %v", n.Name, err)
			continue
		}
		ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		for _, l := range ls {
			fmt.Printf("AGENTLOG %s: %s\n", n.Name, l)
		}
	}
}

// warnings prints every WARN and ERROR line of every node's meshlet log
// (AGENTWARN lines; they do not fail the lane but end up in the summary's
// serial log for whoever reads it).
func (d *agentDriver) warnings() {
	for _, n := range scenarioNodes {
		b, err := os.ReadFile(d.logPath(n))
		if err != nil {
			continue
		}
		count := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
				count++
				fmt.Printf("AGENTWARN %s: %s\n", n.Name, l)
			}
		}
		info("%s: meshlet logged %d warnings/errors, exited %v", n.Name, count, d.exits[n.Name])
	}
}

// guestNetwork brings up the guest's user-networking NIC (QEMU's slirp:
// the guest is 10.0.2.15, the host's loopback is 10.0.2.2).
func guestNetwork(ctx context.Context) error {
	// virtio_net was just loaded by /init; its eth0 may still be coming.
	if err := poll(ctx, 10*time.Second, func() error {
		_, err := ip(ctx, "link", "show", "dev", "eth0")
		return err
	}); err != nil {
		return fmt.Errorf("no eth0 (QEMU user networking): %w", err)
	}
	for _, c := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", guestAddr, "dev", "eth0"},
		{"link", "set", "eth0", "up"},
	} {
		if _, err := ip(ctx, c...); err != nil {
			return err
		}
	}
	return nil
}

// forwardAPI listens on 127.0.0.1:6443 inside node ns's namespace and
// copies every connection to target, dialled from the root namespace.
func forwardAPI(ns, target string) error {
	ln, err := listenInNS(ns, apiListenAddr)
	if err != nil {
		return fmt.Errorf("%s: listening on %s: %w", ns, apiListenAddr, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.DialTimeout("tcp", target, 10*time.Second)
				if err != nil {
					info("forwarder %s: dial %s: %v", ns, target, err)
					return
				}
				defer u.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(u, c); closeWrite(u); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, u); closeWrite(c); done <- struct{}{} }()
				<-done
				<-done
			}()
		}
	}()
	return nil
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// listenInNS opens a TCP listener inside the named network namespace: on a
// locked OS thread switched into it and back. The socket stays in ns.
func listenInNS(ns, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return nil, err
	}
	ln, lerr := net.Listen("tcp", addr)
	if err := netns.Set(orig); err != nil {
		// This thread is in the wrong namespace: never let it run
		// anything else (a locked thread that exits is destroyed).
		runtime.LockOSThread()
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("switching back to the root namespace: %w", err)
	}
	return ln, lerr
}

// checkAPI does an HTTPS GET /readyz on the host's API server over QEMU
// user networking, verifying its certificate with the kubeconfig's CA
// (the certificate is for 127.0.0.1, the address the nodes use).
func checkAPI(ctx context.Context, kubeconfig, target string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cfg.CAData) {
		return errors.New("kubeconfig has no CA certificate")
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
	}}
	return poll(ctx, pollTimeout, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+target+"/readyz", nil)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /readyz: %s: %s", resp.Status, oneLine(string(b)))
		}
		return nil
	})
}

// loadKeys reads the private keys the host made.
func loadKeys() (keys, error) {
	ks := keys{}
	for _, n := range scenarioNodes {
		b, err := os.ReadFile(filepath.Join(etcDir, "keys", n.Name))
		if err != nil {
			return nil, err
		}
		k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("key of %s: %w", n.Name, err)
		}
		ks[n.Name] = k
	}
	return ks, nil
}

// metric returns the sum of a counter's series whose label set contains
// match (e.g. `object="peer"`) from node n's /metrics; 0 when absent.
func metric(ctx context.Context, n nodeDef, name, match string) (float64, error) {
	out, err := get(ctx, n, "/metrics")
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		if match != "" && !strings.Contains(l, match) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", name, l, err)
		}
		sum += v
	}
	return sum, nil
}

// series parses one metric's series from a /metrics page: label set (the
// text between the braces, "" for none) -> value.
func series(page, name string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, l := range strings.Split(page, "\n") {
		var labels, rest string
		switch {
		case strings.HasPrefix(l, name+"{"):
			i := strings.Index(l, "}")
			if i < 0 {
				return nil, fmt.Errorf("%s: %q", name, l)
			}
			labels, rest = l[len(name)+1:i], l[i+1:]
		case strings.HasPrefix(l, name+" "):
			rest = l[len(name):]
		default:
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", name, l, err)
		}
		out[labels] = v
	}
	return out, nil
}

// leaseHolder: node n holds location a's Lease and the other node of a
// does not (meshlet_lease_held on both; the killed leader has no agent to
// ask and counts as not holding it).
func leaseHolder(ctx context.Context, n nodeDef) error {
	for _, o := range []nodeDef{leaderNode, workerNode} {
		held, err := metric(ctx, o, "meshlet_lease_held", "")
		if err != nil && o.Name == n.Name {
			return err
		}
		want := 0.0
		if o.Name == n.Name {
			want = 1
		}
		if held != want {
			return fmt.Errorf("%s: meshlet_lease_held %v, want %v", o.Name, held, want)
		}
	}
	return nil
}

// checkSteady: every agent reports its role (meshlet_leader, meshlet_peers)
// and, once converged, a full reconcile changes nothing on the data plane.
func checkSteady(ctx context.Context) error {
	type snap struct{ reconciles, changes float64 }
	read := func(n nodeDef) (snap, error) {
		page, err := get(ctx, n, "/metrics")
		if err != nil {
			return snap{}, err
		}
		var s snap
		rs, err := series(page, "meshlet_reconciles_total")
		if err != nil {
			return s, err
		}
		for _, v := range rs {
			s.reconciles += v
		}
		cs, err := series(page, "meshlet_dataplane_changes_total")
		if err != nil {
			return s, err
		}
		for _, v := range cs {
			s.changes += v
		}
		return s, nil
	}
	var errs []error
	before := map[string]snap{}
	for _, n := range scenarioNodes {
		page, err := get(ctx, n, "/metrics")
		if err != nil {
			return err
		}
		leader, err := series(page, "meshlet_leader")
		if err != nil {
			return err
		}
		peers, err := series(page, "meshlet_peers")
		if err != nil {
			return err
		}
		want, wantPeers := 0.0, 0.0
		if n.Leader || n.Name == remoteNode.Name {
			want, wantPeers = 1, 1
		}
		if leader[""] != want || peers[`kind="segment"`] != wantPeers {
			errs = append(errs, fmt.Errorf("%s: meshlet_leader %v, meshlet_peers{kind=\"segment\"} %v; want %v and %v",
				n.Name, leader[""], peers[`kind="segment"`], want, wantPeers))
		}
		if before[n.Name], err = read(n); err != nil {
			return err
		}
	}
	// Reconciles run on every Node update (each agent refreshes its
	// last-seen every 30 s) and on the resync period.
	for _, n := range scenarioNodes {
		var after snap
		if err := poll(ctx, 45*time.Second, func() error {
			var err error
			if after, err = read(n); err != nil {
				return err
			}
			if after.reconciles <= before[n.Name].reconciles {
				return fmt.Errorf("%s: no reconcile since %v", n.Name, before[n.Name].reconciles)
			}
			return nil
		}); err != nil {
			errs = append(errs, err)
			continue
		}
		b := before[n.Name]
		info("%s: %v reconciles, data-plane changes +%v", n.Name, after.reconciles-b.reconciles, after.changes-b.changes)
		if after.changes != b.changes {
			errs = append(errs, fmt.Errorf("%s: %v data-plane changes in a steady reconcile, want 0", n.Name, after.changes-b.changes))
		}
	}
	return errors.Join(errs...)
}

// runAgentMode is `guest run` in agent mode.
// rollingRestart replaces the leader's agent as a rolling update of the
// DaemonSet replaces its pod (SIGTERM, then a new process) while the
// worker's pod pings the remote pod through the leader ten times a second:
// kilo0 is the kernel's and outlives the process, so no ping may be lost,
// and the new agent changes no peer.
func rollingRestart(ctx context.Context, d *agentDriver, ps map[string]topology.Plan) error {
	var down time.Duration
	sent, lost, err := pingDuring(ctx, podNS(workerNode), remoteNode.Pod.String(), func() error {
		// A reply first, so the window starts with traffic flowing.
		if err := pingAll(ctx, podNS(workerNode), remoteNode.Pod.String(), 1); err != nil {
			return err
		}
		start := time.Now()
		if err := d.stop(ctx, leaderNode); err != nil {
			return err
		}
		if err := d.start(leaderNode); err != nil {
			return err
		}
		if err := d.waitReady(ctx, leaderNode, 60*time.Second); err != nil {
			return err
		}
		down = time.Since(start)
		return checkKernelDevice(ctx, leaderNode, ps[leaderNode.Name])
	})
	if err != nil {
		return err
	}
	// The new process's counter: it starts at 0.
	after, err := metric(ctx, leaderNode, "meshlet_dataplane_changes_total", `object="peer"`)
	if err != nil {
		return err
	}
	info("rolling restart of the leader's agent under a 10/s pod ping worker -> remote: %d sent, %d lost; old agent stopped to new one ready %s; peer changes by the new agent %v",
		sent, lost, down.Round(time.Millisecond), after)
	switch {
	case lost > 0:
		return fmt.Errorf("%d of %d pings lost across the agent's restart, want 0 (kilo0 outlives the process)", lost, sent)
	case after != 0:
		return fmt.Errorf("the new agent changed %v WireGuard peers, want 0", after)
	}
	return leaseHolder(ctx, leaderNode)
}

// encapsulateAlways restarts every agent in Kilo's default modes
// (--encapsulate=always --local=true, no Cilium compatibility) on the same
// dual-stack nodes without Cilium's cilium_tunl: the worker sends IPv4 to
// its leader's private IP through IPIP (tunl0, the kernel's) and IPv6 on
// the underlay to the leader's IPv6 private IP (IPIP carries IPv4 alone:
// docs/dual-stack.md#encapsulation); both families answer both ways. Then
// cilium_tunl is back and the agents go back to Cozystack's modes and
// their data plane, whatever happened.
func encapsulateAlways(ctx context.Context, d *agentDriver, ps map[string]topology.Plan) (err error) {
	restart := func(always bool) error {
		d.always = always
		for _, n := range scenarioNodes {
			if err := d.stop(ctx, n); err != nil {
				return err
			}
			if err := d.start(n); err != nil {
				return err
			}
		}
		for _, n := range scenarioNodes {
			if err := d.waitReady(ctx, n, 60*time.Second); err != nil {
				return err
			}
		}
		return nil
	}
	tunl := func(add bool) error {
		for _, n := range scenarioNodes {
			args := []string{"-n", n.Name, "link", "del", tunnelDev}
			if add {
				args = []string{"-n", n.Name, "link", "add", tunnelDev, "type", "ipip", "local", n.CiliumHost.Addr().String()}
			}
			if _, err := ip(ctx, args...); err != nil {
				return err
			}
			if add {
				if _, err := ip(ctx, "-n", n.Name, "link", "set", tunnelDev, "up"); err != nil {
					return err
				}
			}
		}
		return nil
	}
	defer func() {
		back := tunl(true)
		if back == nil {
			back = restart(false)
		}
		if back != nil || err != nil {
			err = errors.Join(err, back)
			return
		}
		err = poll(ctx, pollTimeout, func() error {
			return errors.Join(checkWorkerRoute(ctx), checkKernelDevice(ctx, leaderNode, ps[leaderNode.Name]),
				pingAll(ctx, podNS(workerNode), remoteNode.Pod6.String(), 1))
		})
	}()
	if err := tunl(false); err != nil {
		return err
	}
	if err := restart(true); err != nil {
		return err
	}
	if err := poll(ctx, pollTimeout, func() error {
		return errors.Join(routeVia(ctx, workerNode, remoteNode.PodCIDR, leaderNode.Private.Addr(), topology.TunnelIPIP),
			routeVia(ctx, workerNode, remoteNode.PodCIDR6, leaderNode.Private6.Addr(), underlay))
	}); err != nil {
		return fmt.Errorf("--encapsulate=always: %w", err)
	}
	for _, p := range [][2]string{{podNS(workerNode), remoteNode.Pod.String()}, {podNS(workerNode), remoteNode.Pod6.String()},
		{podNS(remoteNode), workerNode.Pod.String()}, {podNS(remoteNode), workerNode.Pod6.String()}} {
		if err := pingUntil(ctx, p[0], p[1]); err != nil {
			return fmt.Errorf("--encapsulate=always, %s -> %s: %w", p[0], p[1], err)
		}
	}
	info("--encapsulate=always --local=true: worker -> remote through IPIP (IPv4) and the underlay (IPv6), both ways")
	return nil
}

// routeVia: node n's route to dst is meshlet's, via gw on dev.
func routeVia(ctx context.Context, n nodeDef, dst netip.Prefix, gw netip.Addr, dev string) error {
	family := "-4"
	if dst.Addr().Is6() {
		family = "-6"
	}
	var rs []ipRoute
	if err := ipJSON(ctx, &rs, "-n", n.Name, family, "route", "show", dst.String()); err != nil {
		return err
	}
	if len(rs) != 1 || rs[0].Dev != dev || rs[0].Gateway != gw.String() || fmt.Sprint(rs[0].Protocol) != "109" {
		return fmt.Errorf("%s route to %s: %+v, want via %s dev %s proto 109", n.Name, dst, rs, gw, dev)
	}
	return nil
}

func runAgentMode() int {
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
	defer cancel()
	r := &reporter{steps: agentSteps}
	d := &agentDriver{dir: "/run/meshlet", kc: filepath.Join(etcDir, "meshlet.kubeconfig"), procs: map[string]*agentProc{}, exits: map[string][]string{}}
	defer func() {
		for _, n := range scenarioNodes {
			if d.procs[n.Name] != nil {
				_ = d.stop(context.Background(), n)
			}
		}
	}()
	if !r.step("fixture", func() error {
		if err := guestNetwork(ctx); err != nil {
			return err
		}
		return setupFixture(ctx)
	}) {
		r.skipRest("no fixture")
		return 1
	}

	portB, err := os.ReadFile(filepath.Join(etcDir, "api-port"))
	if err != nil {
		r.skipRest(err.Error())
		return 1
	}
	target := net.JoinHostPort(hostGateway, strings.TrimSpace(string(portB)))
	if !r.step("api-reachable", func() error {
		if err := checkAPI(ctx, d.kc, target); err != nil {
			return err
		}
		for _, n := range scenarioNodes {
			if err := forwardAPI(n.Name, target); err != nil {
				return err
			}
		}
		info("API server %s reached over QEMU user networking; forwarders on %s in every node", target, apiListenAddr)
		return nil
	}) {
		r.skipRest("no API server")
		return 1
	}

	ks, err := loadKeys()
	if err != nil {
		r.skipRest(err.Error())
		return 1
	}
	// The expected plans: the planner on the scenario as data, with the
	// keys the agents use. The kernel checks compare the device with them.
	ps := plans(ks, time.Now())
	r.step("plan", func() error { return checkPlans(ps, ks) })

	started := true
	for _, n := range scenarioNodes {
		ok := r.step("agent-ready-"+n.Name, func() error {
			nd := filepath.Join(d.dir, n.Name)
			if err := os.MkdirAll(nd, 0o700); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(nd, "key"), []byte(ks[n.Name].String()+"\n"), 0o600); err != nil {
				return err
			}
			if err := d.start(n); err != nil {
				return err
			}
			return d.waitReady(ctx, n, 60*time.Second)
		})
		started = started && ok
	}
	if !started {
		d.dumpLogs(30)
		r.skipRest("meshlet not ready")
		return 1
	}

	// The agents converge as the others publish their annotations: every
	// kernel check polls until it holds.
	converge := func(fn func() error) func() error {
		return func() error { return poll(ctx, pollTimeout, fn) }
	}
	if !datapathSteps(ctx, r, ks, ps, converge) {
		d.dumpLogs(20)
	}
	remotePod := remoteNode.Pod.String()

	r.step("agent-metrics-steady", func() error { return checkSteady(ctx) })

	r.step("route-restored-by-watch", func() error {
		dst := remoteNode.PodCIDR.String()
		if _, err := ip(ctx, "-n", workerNode.Name, "route", "del", dst); err != nil {
			return err
		}
		start := time.Now()
		if err := poll(ctx, 5*time.Second, func() error { return checkWorkerRoute(ctx) }); err != nil {
			return fmt.Errorf("the deleted route did not come back: %w", err)
		}
		took := time.Since(start)
		info("worker route %s deleted, meshlet restored it after %s", dst, took.Round(time.Millisecond))
		if took > time.Second {
			return fmt.Errorf("route restored after %s, want within 1s (meshlet watches netlink)", took.Round(time.Millisecond))
		}
		return nil
	})

	returnRule := []string{"iif", "kilo0", "to", workerNode.Private.Addr().String() + "/32", "lookup", strconv.Itoa(topology.KiloTable)}
	var hs1 [2]time.Time
	r.step("return-rule-needed", func() error {
		// Stopped, meshlet leaves the data plane as it is; nothing
		// puts the rule back while it is down.
		if err := d.stop(ctx, leaderNode); err != nil {
			return err
		}
		if hs1, err = handshakes(ctx, ks, false); err != nil {
			return err
		}
		if err := checkKernelDevice(ctx, leaderNode, ps[leaderNode.Name]); err != nil {
			return fmt.Errorf("after SIGTERM: %w", err)
		}
		if _, err := ip(ctx, append([]string{"-n", leaderNode.Name, "rule", "del"}, returnRule...)...); err != nil {
			return err
		}
		return checkReturnRuleNeeded(ctx, remotePod)
	})
	r.step("leader-restart-session-kept", func() error {
		if err := d.start(leaderNode); err != nil {
			return err
		}
		if err := d.waitReady(ctx, leaderNode, 60*time.Second); err != nil {
			return err
		}
		if err := poll(ctx, pollTimeout, func() error { return checkReturnPath(ctx) }); err != nil {
			return fmt.Errorf("the restarted meshlet did not restore the return path: %w", err)
		}
		if err := checkKernelDevice(ctx, leaderNode, ps[leaderNode.Name]); err != nil {
			return err
		}
		// Before any new traffic: the sessions are the ones from before.
		hs2, err := handshakes(ctx, ks, false)
		if err != nil {
			return err
		}
		if hs1 != hs2 {
			return fmt.Errorf("handshake times moved across the restart: %v -> %v", hs1, hs2)
		}
		peers, err := metric(ctx, leaderNode, "meshlet_dataplane_changes_total", `object="peer"`)
		if err != nil {
			return err
		}
		rules, err := metric(ctx, leaderNode, "meshlet_dataplane_changes_total", `object="rule"`)
		if err != nil {
			return err
		}
		info("restarted leader: dataplane changes peer=%v rule=%v; handshake times unchanged (leader %s, remote %s)",
			peers, rules, hs1[0].Format(time.RFC3339Nano), hs1[1].Format(time.RFC3339Nano))
		if peers != 0 {
			return fmt.Errorf("the restarted meshlet changed %v WireGuard peers, want 0", peers)
		}
		if rules < 1 {
			return fmt.Errorf("the restarted meshlet reports %v rule changes, want the return rule", rules)
		}
		// The role is kept: the restarted agent resumes the Lease its
		// predecessor stretched, and the worker never took it.
		if err := poll(ctx, pollTimeout, func() error { return leaseHolder(ctx, leaderNode) }); err != nil {
			return fmt.Errorf("after the restart: %w", err)
		}
		if took, err := metric(ctx, workerNode, "meshlet_leader_changes_total", ""); err != nil || took != 0 {
			return fmt.Errorf("worker: meshlet_leader_changes_total %v (%v), want 0: the restart moved the role", took, err)
		}
		return pingAll(ctx, workerNode.Name, remotePod, 2)
	})

	r.step("rolling-restart-under-ping", func() error { return rollingRestart(ctx, d, ps) })
	r.step("encapsulate-always-dual-stack", func() error { return encapsulateAlways(ctx, d, ps) })

	// After the power-off the worker leads location a: the plans of the
	// same scenario with the Lease's mark on worker.
	led := plansLedBy(ks, time.Now(), workerNode.Name)
	r.step("leader-power-off-failover", func() error {
		// Power off: the agent killed (no shutdown runs, the Lease is not
		// stretched) and the node cut from the underlay. The worker takes
		// the Lease once the holder's renewals stop (its duration, 3 s,
		// then its rank's wait), leads, and the remote location follows
		// its mark.
		off := time.Now()
		if err := d.kill(leaderNode); err != nil {
			return err
		}
		if _, err := ip(ctx, "-n", leaderNode.Name, "link", "set", underlay, "down"); err != nil {
			return err
		}
		if err := poll(ctx, pollTimeout, func() error { return leaseHolder(ctx, workerNode) }); err != nil {
			return err
		}
		tookLease := time.Since(off)
		if err := poll(ctx, pollTimeout, func() error {
			return errors.Join(checkKernelDevice(ctx, workerNode, led[workerNode.Name]), checkKernelDevice(ctx, remoteNode, led[remoteNode.Name]))
		}); err != nil {
			return fmt.Errorf("after the worker took the Lease (%s): %w", tookLease.Round(time.Millisecond), err)
		}
		followed := time.Since(off)
		if err := pingUntil(ctx, podNS(workerNode), remotePod); err != nil {
			return err
		}
		traffic := time.Since(off)
		info("leader powered off: worker holds the Lease after %s, worker's and remote's kilo0 as planned after %s, pod traffic worker -> remote after %s",
			tookLease.Round(time.Millisecond), followed.Round(time.Millisecond), traffic.Round(time.Millisecond))
		// Power back on: the old leader rejoins as a follower (nobody
		// takes a held Lease), its kilo0 down with no peers.
		if _, err := ip(ctx, "-n", leaderNode.Name, "link", "set", underlay, "up"); err != nil {
			return err
		}
		if err := d.start(leaderNode); err != nil {
			return err
		}
		if err := d.waitReady(ctx, leaderNode, 60*time.Second); err != nil {
			return err
		}
		if err := poll(ctx, pollTimeout, func() error {
			return errors.Join(leaseHolder(ctx, workerNode), checkIdle(ctx, leaderNode))
		}); err != nil {
			return fmt.Errorf("after the old leader came back: %w", err)
		}
		return pingAll(ctx, podNS(workerNode), remotePod, 2)
	})

	r.step("agents-stopped-dataplane-kept", func() error {
		// SIGTERM, as a DaemonSet rollout would: every meshlet exits 0
		// and leaves the data plane as it is, so traffic keeps flowing
		// with no agent running.
		var errs []error
		for _, n := range scenarioNodes {
			if err := d.stop(ctx, n); err != nil {
				errs = append(errs, err)
			} else if st := d.exits[n.Name][len(d.exits[n.Name])-1]; st != "exit status 0" {
				errs = append(errs, fmt.Errorf("%s: meshlet %s on SIGTERM, want exit status 0", n.Name, st))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if err := checkKernelDevice(ctx, workerNode, led[workerNode.Name]); err != nil {
			return err
		}
		if err := checkKernelDevice(ctx, remoteNode, led[remoteNode.Name]); err != nil {
			return err
		}
		return pingAll(ctx, podNS(workerNode), remotePod, 2)
	})

	// Whatever failed, no agent outlives the scenario; then their logs.
	for _, n := range scenarioNodes {
		if d.procs[n.Name] != nil {
			if err := d.stop(ctx, n); err != nil {
				info("stopping meshlet on %s: %v", n.Name, err)
			}
		}
	}
	d.warnings()
	if r.failed > 0 {
		d.dumpLogs(25)
	}
	fmt.Printf("SUMMARY %d passed, %d failed\n", len(agentSteps)-r.failed, r.failed)
	if r.failed > 0 {
		return 1
	}
	return 0
}
