// Command demo brings up a local meshlet mesh that shows what meshlet is
// for: two clusters (two real kube-apiservers, nodes as network namespaces,
// meshlet with userspace WireGuard on each), one of them behind a NAT router
// with a persistentKeepalive in its ClusterMesh entry, a laptop outside as a
// Kilo Peer with its own keepalive, each location led by the holder of its
// Lease. It prints the mesh, makes one change (a Peer added) under a running
// ping and shows that no other session was touched, prints the next steps,
// and tears it all down on Ctrl-C. `make demo` runs it; --once also runs the
// next steps it printed, then tears down and exits (0 when everything
// worked), which a test uses.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/harness"
)

func main() {
	meshlet := flag.String("meshlet", os.Getenv("MESHLET_BIN"), "meshlet binary (make build)")
	once := flag.Bool("once", false, "bring the mesh up, print it, run the printed next steps, tear down and exit (0 = all worked)")
	verbose := flag.Bool("v", false, "log the harness' progress")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (network namespaces, WireGuard devices): sudo make demo")
		os.Exit(2)
	}
	if *meshlet == "" {
		fmt.Fprintln(os.Stderr, "demo: no meshlet binary: --meshlet bin/meshlet (make demo builds it)")
		os.Exit(2)
	}
	// Ctrl-C is the demo's own: in a process group of its own in the
	// terminal's foreground, so make, which started it, does not take the
	// interrupt for a failure of its recipe (it would say "Interrupt").
	restore := foreground()
	defer restore()
	// Teardown must run however the demo ends: a closed terminal (SIGHUP)
	// or output piped into `head` (SIGPIPE would kill the process before
	// it removes its namespaces and API servers).
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	code := run(ctx, os.Stdout, *meshlet, *once, *verbose)
	restore()
	os.Exit(code)
}

// foreground moves the demo into a process group of its own and makes it
// the terminal's foreground group, when standard input is a terminal; the
// returned function gives the terminal back to the group that had it.
func foreground() func() {
	fd := int(os.Stdin.Fd())
	orig, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	if err != nil {
		return func() {} // not a terminal
	}
	signal.Ignore(syscall.SIGTTOU) // a background group may set the foreground
	if err := unix.Setpgid(0, 0); err != nil {
		return func() {}
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, unix.Getpgrp()); err != nil {
		return func() {}
	}
	done := false
	return func() {
		if !done {
			done = true
			_ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, orig)
		}
	}
}

// The layout: cluster-a with locations x (two nodes, under a Lease) and y;
// cluster-b with location n, two nodes behind the NAT router r1, its
// ClusterMesh entry asking for a 25 s keepalive; a laptop on the underlay,
// a Kilo Peer of cluster-a with a 10 s keepalive.
const (
	remoteKeepalive = 25
	laptopKeepalive = 10
)

var laptopAddr = netip.MustParseAddr("10.9.0.1")

func run(ctx context.Context, out io.Writer, meshlet string, once, verbose bool) int {
	logf := func(string, ...any) {}
	if verbose {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "demo: "+f+"\n", a...) }
	}
	fmt.Fprintln(out, "meshlet demo: two API servers, seven nodes (network namespaces), a NAT router and a laptop...")
	env, err := harness.New(harness.Options{Meshlet: meshlet, Logf: logf, LogLevel: "info"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer func() {
		fmt.Fprintln(out, "tearing down (processes, namespaces, API servers)...")
		env.Close()
		fmt.Fprintln(out, "torn down: nothing of the demo is left on this machine.")
	}()
	start := time.Now()
	d, err := build(ctx, env, meshlet)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: bringing the mesh up:", err)
		return 1
	}
	fmt.Fprintf(out, "mesh up in %v\n\n", time.Since(start).Round(100*time.Millisecond))
	ok := d.show(ctx, out)
	ok = d.change(ctx, out) && ok
	steps := d.nextSteps(out)
	if once {
		ok = d.runSteps(ctx, out, steps) && ok
		if ok {
			fmt.Fprintln(out, "\nRESULT: the mesh works; the change kept every other session; every next step ran.")
			return 0
		}
		fmt.Fprintln(out, "\nRESULT: FAILED (see above).")
		return 1
	}
	if ok {
		fmt.Fprintln(out, "\nRESULT: the mesh works; the change kept every other session.")
	} else {
		fmt.Fprintln(out, "\nRESULT: FAILED (see above).")
	}
	fmt.Fprintln(out, "\nRunning. Ctrl-C tears everything down.")
	<-ctx.Done()
	fmt.Fprintln(out)
	return 0
}

type demo struct {
	env     *harness.Env
	meshlet string
	router  *harness.Router
	laptop  *harness.PeerHost
	a, b    *harness.Cluster
}

func build(ctx context.Context, env *harness.Env, meshlet string) (*demo, error) {
	d := &demo{env: env, meshlet: meshlet}
	var err error
	if d.router, err = env.AddRouter(ctx, "r1"); err != nil {
		return nil, err
	}
	if d.laptop, err = env.AddPeerHost(ctx, "laptop", laptopAddr); err != nil {
		return nil, err
	}
	l := harness.Layout{Clusters: []harness.ClusterLayout{
		{ClusterSpec: harness.ClusterSpec{Name: "cluster-a", PodNet: netip.MustParsePrefix("10.1.0.0/16"), WGSubnet: netip.MustParsePrefix("100.66.0.0/24")},
			Nodes: []harness.NodeSpec{{Name: "a-x1", Location: "x"}, {Name: "a-x2", Location: "x"}, {Name: "a-y1", Location: "y"}}},
		{ClusterSpec: harness.ClusterSpec{Name: "cluster-b", PodNet: netip.MustParsePrefix("10.2.0.0/16"), WGSubnet: netip.MustParsePrefix("100.66.1.0/24"),
			Keepalive: remoteKeepalive},
			Nodes: []harness.NodeSpec{{Name: "b-n1", Location: "n", Behind: d.router}, {Name: "b-n2", Location: "n", Behind: d.router}}},
	}}
	if err := env.Build(ctx, l); err != nil {
		return nil, err
	}
	d.a, d.b = env.Cluster("cluster-a"), env.Cluster("cluster-b")
	// The laptop: a Kilo Peer of cluster-a, and its own side as `kgctl
	// showconf peer` would give it, with cluster-a's leader of x as its
	// peer for the pods of cluster-a.
	x1 := env.Node("a-x1")
	if err := d.a.Apply(ctx, peerObject("laptop", d.laptop.Public, laptopAddr, d.laptop.IP.Addr(), laptopKeepalive)); err != nil {
		return nil, err
	}
	key, err := x1.PublicKey(ctx)
	if err != nil {
		return nil, err
	}
	if err := d.laptop.SetPeer(ctx, key, x1.IP.Addr().String()+":51820", []netip.Prefix{d.a.PodNet}); err != nil {
		return nil, err
	}
	// Every tunnel used once, so the tables show live sessions: the pods
	// of cluster-b (behind NAT: they dial out first), and the laptop.
	for _, n := range []*harness.Node{env.Node("a-x2"), env.Node("a-y1")} {
		if _, err := n.WaitReachable(ctx, env.Node("b-n2").PodIP, 40*time.Second); err != nil {
			for _, m := range []string{"a-x1", "b-n1", "b-n2"} {
				out, _ := exec.CommandContext(ctx, meshlet, "status", "--socket", env.Node(m).StatusSocket()).CombinedOutput()
				fmt.Fprintf(os.Stderr, "demo: meshlet status of %s:\n%s\n", m, out)
			}
			return nil, fmt.Errorf("%s → b-n2: %w", n.Name, err)
		}
	}
	if !d.laptop.Reachable(ctx, env.Node("a-x2").PodIP, 20*time.Second) {
		return nil, fmt.Errorf("the laptop does not reach a-x2's pod")
	}
	return d, nil
}

func peerObject(name, key string, addr, endpoint netip.Addr, keepalive int) string {
	return fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":%q},
"spec":{"allowedIPs":["%s/32"],"publicKey":%q,"endpoint":{"dnsOrIP":{"ip":%q},"port":51820},"persistentKeepalive":%d}}`,
		name, addr, key, endpoint, keepalive)
}

// agentStatus is `meshlet status -o json` of node n, read on its socket.
func (d *demo) agentStatus(ctx context.Context, n *harness.Node) (status.Status, error) {
	var st status.Status
	b, err := exec.CommandContext(ctx, d.meshlet, "status", "--socket", n.StatusSocket(), "-o", "json").Output()
	if err != nil {
		return st, fmt.Errorf("meshlet status of %s: %w", n.Name, err)
	}
	return st, json.Unmarshal(b, &st)
}

// show prints the mesh: clusters, locations with their Lease holders,
// every leader's peers with their keepalive and why, and a ping across the
// NAT.
func (d *demo) show(ctx context.Context, out io.Writer) bool {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tAPI SERVER\tADMIN KUBECONFIG")
	for _, c := range d.env.Clusters() {
		fmt.Fprintf(w, "%s\t%s\t%s\n", c.Name, c.Server.URL(), c.AdminKubeconfig())
	}
	w.Flush()
	fmt.Fprintf(out, "\nClusterMesh \"mesh\" in each cluster: cluster-b's entry asks for persistentKeepalive %d (its nodes are behind NAT).\n", remoteKeepalive)
	fmt.Fprintf(out, "Kilo Peer \"laptop\" in cluster-a: %s/32, endpoint %s:51820, persistentKeepalive %d.\n\n", laptopAddr, d.laptop.IP.Addr(), laptopKeepalive)

	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tLOCATION\tNODE\tADDRESS\tPOD CIDR\tROLE\tWIREGUARD IP")
	var leaders []*harness.Node
	for _, n := range d.env.Nodes() {
		st, err := d.agentStatus(ctx, n)
		if err != nil {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", n.Cluster.Name, n.Location, n.Name, err)
			continue
		}
		role := "via its leader"
		if st.Role == "leader" {
			role = "LEADER"
			if st.Leadership != nil && st.Leadership.Held {
				role = "LEADER, holds Lease " + failover.LeaseName(n.Location)
			}
			leaders = append(leaders, n)
		}
		addr := n.IP.Addr().String()
		if n.Behind != nil {
			addr += " (behind NAT " + n.Behind.WAN.Addr().String() + ")"
		}
		wip := "-"
		if st.WireGuardIP.IsValid() {
			wip = st.WireGuardIP.String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Cluster.Name, n.Location, n.Name, addr, n.PodCIDR, role, wip)
	}
	w.Flush()

	for _, l := range leaders {
		st, err := d.agentStatus(ctx, l)
		if err != nil {
			continue
		}
		fmt.Fprintf(out, "\nWireGuard peers of %s (%s, location %s):\n", l.Name, l.Cluster.Name, l.Location)
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "  PEER\tKIND\tCLUSTER\tENDPOINT\tKEEPALIVE (WHY)\tHANDSHAKE")
		for _, p := range st.Peers {
			ep := dash(p.Endpoint)
			if p.EndpointSource == "discovered" {
				ep += " (learned)"
			}
			if p.Learned != "" && p.Learned != p.Endpoint {
				ep = p.Learned + " (learned; configured " + dash(p.Endpoint) + ")"
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Kind, dash(p.Cluster), ep, keepalive(p), ago(p.LastHandshake))
		}
		w.Flush()
	}

	x2, n2 := d.env.Node("a-x2"), d.env.Node("b-n2")
	r, err := x2.Ping(ctx, n2.PodIP, 3, 200*time.Millisecond, time.Second)
	fmt.Fprintf(out, "\nping %s (cluster-a, pod %s) → %s (cluster-b behind NAT, pod %s): ", x2.Name, x2.PodIP, n2.Name, n2.PodIP)
	if err != nil || r.Received != r.Sent {
		fmt.Fprintf(out, "FAILED (%d of %d answered, %v)\n", r.Received, r.Sent, err)
		return false
	}
	fmt.Fprintf(out, "%d of %d answered\n", r.Received, r.Sent)
	return true
}

// keepalive is a peer's keepalive and the rule of docs/architecture.md#keepalive
// it came from.
func keepalive(p status.Peer) string {
	if p.Keepalive == 0 {
		return "off"
	}
	why := map[string]string{"peer-spec": "the Peer's spec", "peer-annotation": "the Peer's node-persistent-keepalive",
		"remote-cluster": "its ClusterMesh entry", "local-cluster": "this cluster's ClusterMesh entry",
		"node-annotation": "this node's annotation"}[p.KeepaliveSource]
	if why == "" {
		why = p.KeepaliveSource
	}
	return fmt.Sprintf("%ds (%s)", p.Keepalive, why)
}

// change adds a Peer under a running ping and shows what it did to the
// leader's device: the peer added, every other session kept.
func (d *demo) change(ctx context.Context, out io.Writer) bool {
	x1, x2, n2 := d.env.Node("a-x1"), d.env.Node("a-x2"), d.env.Node("b-n2")
	before, err := x1.Device()
	if err != nil || before == nil {
		fmt.Fprintln(out, "reading a-x1's device:", err)
		return false
	}
	pinger, err := x2.StartPinger(ctx, n2.PodIP, 100*time.Millisecond)
	if err != nil {
		fmt.Fprintln(out, err)
		return false
	}
	laptopPing, err := d.laptop.StartPinger(ctx, x2.PodIP, 100*time.Millisecond)
	if err != nil {
		fmt.Fprintln(out, err)
		return false
	}
	pause(ctx, time.Second)
	_, phone := harness.NewKeyPair()
	fmt.Fprintln(out, "\nOne change, under a ping a-x2 → b-n2 and the laptop → a-x2 (10/s each): Peer \"phone\" added to cluster-a.")
	t0 := time.Now()
	ok := d.a.Apply(ctx, peerObject("phone", phone, netip.MustParseAddr("10.9.0.2"), netip.MustParseAddr("198.51.100.7"), 0)) == nil
	var after *harness.WGDevice
	ok = ok && harness.Poll(ctx, 20*time.Second, 20*time.Millisecond, "the phone on a-x1's device", func() (bool, error) {
		after, err = x1.Device()
		if err != nil || after == nil {
			return false, err
		}
		_, in := after.Peers[phone]
		return in, nil
	}) == nil
	took := time.Since(t0)
	pause(ctx, 2*time.Second)
	tl, ltl := pinger.Stop(), laptopPing.Stop()
	if !ok {
		fmt.Fprintln(out, "  the phone never reached a-x1's device")
		return false
	}
	fmt.Fprintf(out, "  a-x1's device: the phone added %v after the Peer was created; of its other %d peers:\n", took.Round(time.Millisecond), len(before.Peers))
	kept := true
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	keys := make([]string, 0, len(before.Peers))
	for k := range before.Peers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	names := d.peerNames(ctx, x1)
	for _, k := range keys {
		b, a := before.Peers[k], after.Peers[k]
		same := a.LastHandshake.Equal(b.LastHandshake) && a.Endpoint == b.Endpoint
		verdict := "session kept (same handshake, same endpoint)"
		if !same {
			verdict = fmt.Sprintf("CHANGED (handshake %s → %s, endpoint %s → %s)", ago(b.LastHandshake), ago(a.LastHandshake), b.Endpoint, a.Endpoint)
			kept = false
		}
		fmt.Fprintf(w, "    %s\t%s\n", names[k], verdict)
	}
	w.Flush()
	fmt.Fprintf(out, "  pings a-x2 → b-n2: %d of %d answered; laptop → a-x2: %d of %d answered.\n", tl.Sent-tl.Lost, tl.Sent, ltl.Sent-ltl.Lost, ltl.Sent)
	fmt.Fprintln(out, "  kg 0.7 rewrites a node's whole device on any change (ReplacePeers): every session above would have")
	fmt.Fprintln(out, "  re-handshaken, and the NATed ones waited for a keepalive (docs/kilo-compatibility.md#incremental).")
	return kept && tl.Lost == 0 && ltl.Lost == 0 && tl.Sent > 0 && ltl.Sent > 0
}

// peerNames are the names of node n's peers by public key, from its agent.
func (d *demo) peerNames(ctx context.Context, n *harness.Node) map[string]string {
	out := map[string]string{}
	if st, err := d.agentStatus(ctx, n); err == nil {
		for _, p := range st.Peers {
			out[p.PublicKey] = p.Name + " (" + p.Kind + ")"
		}
	}
	return out
}

// step is one next step: what it shows and the exact command.
type step struct{ what, cmd string }

// nextSteps prints the commands that look further into the running demo.
func (d *demo) nextSteps(out io.Writer) []step {
	x1 := d.env.Node("a-x1")
	akc := d.a.AdminKubeconfig()
	wg := "wg"
	if _, err := exec.LookPath("wg"); err != nil {
		wg = ""
	}
	steps := []step{
		{"what the agent on a-x1 does (role, peers and their health, routes)", d.meshlet + " status --socket " + x1.StatusSocket()},
		{"the whole of cluster-a and its remote cluster, checked", d.meshlet + " diagnose --kubeconfig " + akc},
		{"the mesh as a picture (Graphviz dot: | dot -Tsvg > mesh.svg)", d.meshlet + " graph --kubeconfig " + akc},
		{"a-x1's WireGuard device", "ip netns exec " + x1.NS + " sh -c 'mount --bind " + x1.WGDir + " /run/wireguard && " + wg + " show kilo0'"},
		{"kubectl on cluster-a", d.a.Server.KubectlPath() + " --kubeconfig " + akc + " get nodes,peers.kilo.squat.ai -o wide"},
	}
	if wg == "" {
		steps[3].cmd = d.meshlet + " status --socket " + x1.StatusSocket() + " -o json   # wg(8) is not installed: apt-get install wireguard-tools"
	}
	fmt.Fprintln(out, "\nNext steps (while the demo runs; logs in "+filepath.Join(d.env.Dir(), "nodes")+"/<node>/meshlet.log):")
	for _, s := range steps {
		fmt.Fprintf(out, "  # %s\n  %s\n", s.what, s.cmd)
	}
	return steps
}

// runSteps runs each next step as printed and says how it went.
func (d *demo) runSteps(ctx context.Context, out io.Writer, steps []step) bool {
	fmt.Fprintln(out, "\nRunning the next steps:")
	ok := true
	for _, s := range steps {
		cmd, _, _ := strings.Cut(s.cmd, "   #")
		res, err := exec.CommandContext(ctx, "sh", "-c", cmd).CombinedOutput()
		first, _, _ := strings.Cut(strings.TrimSpace(string(res)), "\n")
		if err != nil {
			ok = false
			fmt.Fprintf(out, "  FAILED %s: %v: %s\n", s.what, err, strings.TrimSpace(string(res)))
			continue
		}
		fmt.Fprintf(out, "  ok     %s: %s\n", s.what, first)
	}
	return ok
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
