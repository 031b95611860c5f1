// Command demo brings up a local two-cluster meshlet mesh (two real
// kube-apiservers, eight nodes as network namespaces, meshlet with
// userspace WireGuard on each), prints it the way a person wants to see it,
// and tears it down on Ctrl-C. `make demo` runs it; --once prints and exits
// (0 when the mesh works, 1 otherwise), which a test uses.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

func main() {
	meshlet := flag.String("meshlet", os.Getenv("MESHLET_BIN"), "meshlet binary (make build)")
	once := flag.Bool("once", false, "bring the mesh up, print it, tear it down and exit (0 = works)")
	verbose := flag.Bool("v", false, "log the harness' progress")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (network namespaces, WireGuard devices)")
		os.Exit(2)
	}
	// Teardown must run however the demo ends: a closed terminal (SIGHUP)
	// or output piped into `head` (SIGPIPE would kill the process before
	// it removes its namespaces and API servers).
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	code := run(ctx, os.Stdout, *meshlet, *once, *verbose)
	os.Exit(code)
}

func run(ctx context.Context, out io.Writer, meshlet string, once, verbose bool) int {
	logf := func(string, ...any) {}
	if verbose {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "demo: "+f+"\n", a...) }
	}
	fmt.Fprintln(out, "meshlet demo: starting two API servers and eight nodes (network namespaces)...")
	env, err := harness.New(harness.Options{Meshlet: meshlet, Logf: logf, LogLevel: "info"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer func() {
		fmt.Fprintln(out, "tearing down (processes, namespaces, API servers)...")
		env.Close()
	}()
	start := time.Now()
	if err := env.Build(ctx, harness.TwoByTwo()); err != nil {
		fmt.Fprintln(os.Stderr, "demo: bringing the mesh up:", err)
		return 1
	}
	fmt.Fprintf(out, "mesh up in %v\n\n", time.Since(start).Round(100*time.Millisecond))
	ok := show(ctx, out, env)
	if once {
		if !ok {
			return 1
		}
		return 0
	}
	fmt.Fprintln(out, "\nRunning. Ctrl-C tears everything down.")
	<-ctx.Done()
	return 0
}

// show prints the mesh and returns whether the cross-cluster ping worked.
func show(ctx context.Context, out io.Writer, env *harness.Env) bool {
	// A ping from a non-leader pod address in one cluster to a non-leader
	// pod address in the other: through both leaders and the tunnel. Done
	// first, so the peer tables below show the handshakes it caused.
	a, b := env.Clusters()[0].Nodes(), env.Clusters()[1].Nodes()
	src, dst := a[1], b[len(b)-1]
	_, _ = src.WaitReachable(ctx, dst.PodIP, 30*time.Second)
	r, err := src.Ping(ctx, dst.PodIP, 3, 200*time.Millisecond, time.Second)
	works := err == nil && r.Received == r.Sent

	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tAPI SERVER\tADMIN KUBECONFIG")
	for _, c := range env.Clusters() {
		fmt.Fprintf(w, "%s\t%s\t%s\n", c.Name, c.Server.URL(), c.AdminKubeconfig())
	}
	w.Flush()
	fmt.Fprintln(out)

	// Locations and leaders, from what meshlet published on the Nodes.
	type loc struct {
		cluster, name string
		nodes         []*harness.Node
	}
	var locs []*loc
	idx := map[string]*loc{}
	for _, n := range env.Nodes() {
		k := n.Cluster.Name + "/" + n.Location
		if idx[k] == nil {
			idx[k] = &loc{cluster: n.Cluster.Name, name: n.Location}
			locs = append(locs, idx[k])
		}
		idx[k].nodes = append(idx[k].nodes, n)
	}
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tLOCATION\tNODE\tUNDERLAY IP\tPOD CIDR\tROLE\tWIREGUARD IP")
	var leaders []*harness.Node
	for _, l := range locs {
		for _, n := range l.nodes {
			ann, _ := n.Cluster.Annotations(ctx, n.Name)
			role := "via leader"
			if wip := ann[topology.AnnotationWireGuardIP]; wip != "" {
				role = "LEADER"
				leaders = append(leaders, n)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.cluster, l.name, n.Name, n.IP.Addr(), n.PodCIDR, role,
				dash(ann[topology.AnnotationWireGuardIP]))
		}
	}
	w.Flush()

	// Peers of every leader: names and kinds from meshlet's metrics, live
	// state from the device.
	for _, l := range leaders {
		fmt.Fprintf(out, "\nWireGuard peers of %s (%s, location %s):\n", l.Name, l.Cluster.Name, l.Location)
		m, err := l.Metrics(ctx)
		if err != nil {
			fmt.Fprintln(out, "  metrics:", err)
			continue
		}
		dev, err := l.Device()
		if err != nil || dev == nil {
			fmt.Fprintln(out, "  device:", err)
			continue
		}
		w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "  PEER\tKIND\tCLUSTER\tENDPOINT\tKEEPALIVE\tHANDSHAKE\tALLOWED IPS")
		series := m.Series("meshlet_peer_receive_bytes_total")
		sort.Slice(series, func(i, j int) bool { return harness.Label(series[i], "peer") < harness.Label(series[j], "peer") })
		for _, s := range series {
			p := dev.Peers[harness.Label(s, "public_key")]
			ka := "off"
			if p.Keepalive > 0 {
				ka = fmt.Sprintf("%ds", p.Keepalive)
			}
			hs := "never"
			if !p.LastHandshake.IsZero() {
				hs = time.Since(p.LastHandshake).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", harness.Label(s, "peer"), harness.Label(s, "kind"),
				harness.Label(s, "cluster"), dash(p.Endpoint), ka, hs, strings.Join(p.AllowedIPs, ","))
		}
		w.Flush()
	}

	fmt.Fprintf(out, "\nping %s (%s, pod %s) → %s (%s, pod %s):\n", src.Name, src.Cluster.Name, src.PodIP,
		dst.Name, dst.Cluster.Name, dst.PodIP)
	if err != nil {
		fmt.Fprintln(out, "  ", err)
	} else {
		for _, line := range strings.Split(strings.TrimSpace(r.Output), "\n") {
			if strings.Contains(line, "transmitted") || strings.Contains(line, "rtt") {
				fmt.Fprintln(out, "  "+line)
			}
		}
	}

	// Where to look further.
	fmt.Fprintln(out, "\nMetrics (meshlet listens on 127.0.0.1:1107 inside each node), forwarded to the host:")
	for _, l := range leaders {
		addr, stop, err := harness.ForwardIntoNetns("127.0.0.1:0", l.NS, harness.MetricsAddr)
		if err != nil {
			fmt.Fprintln(out, "  forward:", err)
			continue
		}
		_ = stop // closed with the process; the demo ends with it
		fmt.Fprintf(out, "  %-5s curl -s http://%s/metrics | grep ^meshlet_\n", l.Name, addr)
	}
	n0 := env.Nodes()[0]
	fmt.Fprintf(out, "  any node: ip netns exec %s curl -s http://%s/metrics\n", n0.NS, harness.MetricsAddr)
	fmt.Fprintf(out, "WireGuard state: ip netns exec %s sh -c 'mount --bind %s /run/wireguard && wg show kilo0'\n", n0.NS, n0.WGDir)
	c0 := env.Clusters()[0]
	fmt.Fprintf(out, "Logs: %s/nodes/<node>/meshlet.log\nkubectl: %s --kubeconfig %s get nodes -o wide\n",
		env.Dir(), c0.Server.KubectlPath(), c0.AdminKubeconfig())
	if works {
		fmt.Fprintln(out, "\nRESULT: the mesh works (cross-cluster ping answered).")
	} else {
		fmt.Fprintln(out, "\nRESULT: cross-cluster ping FAILED.")
	}
	return works
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
