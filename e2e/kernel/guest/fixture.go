package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// ipBin is Debian's iproute2. Busybox's shell would run its own `ip` applet
// for a bare `ip`, which lacks netns and JSON support.
const ipBin = "/usr/bin/ip"

// busybox provides ping and sysctl inside the guest.
const busybox = "/bin/busybox"

// cmdTimeout bounds every helper command; TCG is slow but no single command
// should take this long.
const cmdTimeout = 30 * time.Second

// run runs a command and returns its stdout; the error carries stderr.
func command(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func ip(ctx context.Context, args ...string) (string, error) { return command(ctx, ipBin, args...) }

// ipJSON runs `ip -j ARGS` and decodes the output into v.
func ipJSON(ctx context.Context, v any, args ...string) error {
	out, err := ip(ctx, append([]string{"-j"}, args...)...)
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) == "" {
		out = "[]"
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("ip -j %s: decode %q: %w", strings.Join(args, " "), out, err)
	}
	return nil
}

// inNS runs a command inside a named network namespace.
func inNS(ctx context.Context, ns, name string, args ...string) (string, error) {
	return command(ctx, ipBin, append([]string{"netns", "exec", ns, name}, args...)...)
}

func podNS(n nodeDef) string { return n.Name + "-pod" }

// setupFixture builds what exists on the nodes before meshlet runs: the
// underlay, Cilium's devices (cilium_host/cilium_net, cilium_tunl), the pods
// and the part of Cilium's routing that meshlet relies on.
func setupFixture(ctx context.Context) error {
	var cmds [][]string
	add := func(args ...string) { cmds = append(cmds, args) }

	// The underlay: one bridge in the guest's root namespace. Location a's
	// private subnet 192.168.1.0/24 and location b's 192.168.2.0/24 share
	// it but nothing routes between them; public addresses (198.51.100.0/24,
	// the WireGuard endpoints) reach each other directly.
	// forward_delay 0: without STP a new bridge port still spends the
	// forward delay (15 s) learning before it forwards.
	add("link", "add", "br0", "type", "bridge", "forward_delay", "0")
	add("link", "set", "br0", "up")
	for _, n := range scenarioNodes {
		ns := n.Name
		add("netns", "add", ns)
		add("-n", ns, "link", "set", "lo", "up")
		add("link", "add", "u-"+ns, "type", "veth", "peer", "name", underlay, "netns", ns)
		add("link", "set", "u-"+ns, "master", "br0", "up")
		add("-n", ns, "addr", "add", n.Private.String(), "dev", underlay)
		add("-n", ns, "addr", "add", fmt.Sprintf("%s/%d", n.Public, publicNet.Bits()), "dev", underlay)
		// nodad: unique here, and usable at once.
		add("-n", ns, "addr", "add", n.Private6.String(), "dev", underlay, "nodad")
		add("-n", ns, "link", "set", underlay, "up")

		// cilium_host/cilium_net are a veth pair in Cilium too;
		// cilium_host carries the node's router IP (cni-compatibility-ip).
		add("-n", ns, "link", "add", "cilium_host", "type", "veth", "peer", "name", "cilium_net")
		add("-n", ns, "addr", "add", n.CiliumHost.String(), "dev", "cilium_host")
		add("-n", ns, "link", "set", "cilium_net", "up")
		add("-n", ns, "link", "set", "cilium_host", "up")

		// cilium_tunl. Cilium's real one is an `external` (collect_md) ipip
		// device: it receives every IPIP packet and its eBPF programs set
		// the tunnel metadata for sending. Without eBPF a collect_md device
		// cannot send, so here it is a plain ipip device that the kernel
		// drives from `via GW dev cilium_tunl onlink` routes (the outer
		// destination is the route's gateway). It gets an explicit local
		// address, the node's cilium_host IP: a second wildcard ipip device
		// would clash with the fallback tunl0 that the ipip module creates
		// in every namespace (EEXIST), and with local = cilium_host IP it
		// receives exactly what other nodes send to this node's
		// cni-compatibility-ip — which is where meshlet's routes point
		// (non-leader -> leader's cilium_host, table 1107 -> non-leader's
		// cilium_host). The outer packets reach those addresses through
		// the Cilium-like pod CIDR routes below.
		add("-n", ns, "link", "add", tunnelDev, "type", "ipip", "local", n.CiliumHost.Addr().String())
		add("-n", ns, "link", "set", tunnelDev, "up")

		if n.Pod.IsValid() {
			// A pod: its own namespace behind a veth, default route via the
			// node's cilium_host IP (the host answers ARP for it), and a
			// /32 route to it on the node, as Cilium installs per endpoint.
			pod := podNS(n)
			add("netns", "add", pod)
			add("-n", pod, "link", "set", "lo", "up")
			add("-n", ns, "link", "add", "lxc0", "type", "veth", "peer", "name", "eth0", "netns", pod)
			add("-n", pod, "addr", "add", n.Pod.String()+"/32", "dev", "eth0")
			add("-n", pod, "link", "set", "eth0", "up")
			add("-n", pod, "route", "add", "default", "via", n.CiliumHost.Addr().String(), "dev", "eth0", "onlink")
			add("-n", ns, "link", "set", "lxc0", "up")
			add("-n", ns, "route", "add", n.Pod.String()+"/32", "dev", "lxc0")
			// IPv6: the pod's default route via the node's link-local
			// fe80::1 on lxc0, a /128 to the pod on the node.
			add("-n", pod, "addr", "add", n.Pod6.String()+"/128", "dev", "eth0", "nodad")
			add("-n", ns, "addr", "add", "fe80::1/64", "dev", "lxc0", "nodad")
			add("-n", pod, "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0")
			add("-n", ns, "-6", "route", "add", n.Pod6.String()+"/128", "dev", "lxc0")
		}
	}
	// Cilium's native routing inside location a (auto-direct-node-routes):
	// each node's pod CIDR via that node's private IP. meshlet runs with
	// --local=false there, so these are Cilium's, not meshlet's. They also
	// carry the IPIP outer packets to the cilium_host addresses.
	add("-n", leaderNode.Name, "route", "add", workerNode.PodCIDR.String(), "via", workerNode.Private.Addr().String(), "dev", underlay)
	add("-n", workerNode.Name, "route", "add", leaderNode.PodCIDR.String(), "via", leaderNode.Private.Addr().String(), "dev", underlay)
	add("-n", leaderNode.Name, "-6", "route", "add", workerNode.PodCIDR6.String(), "via", workerNode.Private6.Addr().String(), "dev", underlay)
	add("-n", workerNode.Name, "-6", "route", "add", leaderNode.PodCIDR6.String(), "via", leaderNode.Private6.Addr().String(), "dev", underlay)

	// The worker refuses mesh replies to its private IP that arrive on the
	// underlay instead of the tunnel (iif eth0 from location b). This
	// stands in for a datapath that drops asymmetric return traffic
	// (Cilium's eBPF, anti-spoofing): Kilo's table 1107 exists so that such
	// replies come back the way the request left, through the tunnel, and
	// this rule makes "they did not" observable as a failed ping. The
	// local table moves from priority 0 to 100 so the rule is consulted
	// before local delivery.
	add("-n", workerNode.Name, "rule", "add", "pref", "50", "iif", underlay,
		"from", remoteNode.PodCIDR.String(), "to", workerNode.Private.Addr().String()+"/32", "prohibit")
	add("-n", workerNode.Name, "rule", "add", "pref", "100", "lookup", "local")
	add("-n", workerNode.Name, "rule", "del", "pref", "0", "lookup", "local")

	for _, c := range cmds {
		if _, err := ip(ctx, c...); err != nil {
			return err
		}
	}
	// Cilium nodes forward; meshlet asserts it too, but the pods' traffic
	// must not depend on the order.
	for _, n := range scenarioNodes {
		// keep_addr_on_down: the power-off step takes eth0 down and up,
		// which would flush its IPv6 addresses for good; a node that
		// boots again configures them again.
		for _, s := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf." + underlay + ".keep_addr_on_down=1"} {
			if _, err := inNS(ctx, n.Name, busybox, "sysctl", "-q", "-w", s); err != nil {
				return err
			}
		}
	}
	return nil
}

// diagnose prints every namespace's link counters and neighbours, for a
// failed datapath check.
func diagnose(ctx context.Context) {
	nss := []string{}
	for _, n := range scenarioNodes {
		nss = append(nss, n.Name)
		if n.Pod.IsValid() {
			nss = append(nss, podNS(n))
		}
	}
	for _, ns := range nss {
		var ls []struct {
			Ifname  string `json:"ifname"`
			Stats64 struct {
				Rx struct{ Packets, Dropped uint64 } `json:"rx"`
				Tx struct{ Packets, Dropped uint64 } `json:"tx"`
			} `json:"stats64"`
		}
		if err := ipJSON(ctx, &ls, "-n", ns, "-s", "link", "show"); err != nil {
			info("diag %s: %v", ns, err)
			continue
		}
		var parts []string
		for _, l := range ls {
			parts = append(parts, fmt.Sprintf("%s rx %d/%d tx %d/%d", l.Ifname, l.Stats64.Rx.Packets, l.Stats64.Rx.Dropped,
				l.Stats64.Tx.Packets, l.Stats64.Tx.Dropped))
		}
		info("diag %s links (packets/dropped): %s", ns, strings.Join(parts, "; "))
		if out, err := ip(ctx, "-n", ns, "neigh", "show"); err == nil {
			info("diag %s neigh: %s", ns, oneLine(out))
		}
		if out, err := inNS(ctx, ns, busybox, "sh", "-c", "grep ^Ip: /proc/net/snmp; grep -H . /proc/sys/net/ipv4/conf/*/rp_filter /proc/sys/net/ipv4/conf/*/forwarding"); err == nil {
			info("diag %s snmp/sysctl: %s", ns, oneLine(out))
		}
	}
	for _, args := range [][]string{
		{"-n", leaderNode.Name, "route", "get", remoteNode.Pod.String(), "from", workerNode.Pod.String(), "iif", tunnelDev},
		{"-n", leaderNode.Name, "route", "get", remoteNode.Pod.String(), "from", workerNode.Private.Addr().String(), "iif", tunnelDev},
	} {
		out, err := ip(ctx, args...)
		info("diag ip %s: %s %v", strings.Join(args, " "), oneLine(out), err)
	}
}
