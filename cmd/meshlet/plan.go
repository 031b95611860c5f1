package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/config"
)

// localOrFile is plan's --local: the command line uses --local FILE
// for the dump, and the agent's --local=true|false keeps kg's meaning. The
// two never collide: a boolean value sets the routing mode, anything else
// names the file.
type localOrFile struct {
	file   string
	routes *bool
}

func (l *localOrFile) String() string {
	if l == nil {
		return ""
	}
	return l.file
}

func (l *localOrFile) Set(v string) error {
	if b, err := strconv.ParseBool(v); err == nil && (v == "true" || v == "false") {
		*l.routes = b
		return nil
	}
	l.file = v
	return nil
}

type remoteFiles map[string]string

func (r remoteFiles) String() string { return fmt.Sprint(map[string]string(r)) }
func (r remoteFiles) Set(v string) error {
	name, file, ok := strings.Cut(v, "=")
	if !ok || name == "" || file == "" {
		return fmt.Errorf("want CLUSTER=FILE, got %q", v)
	}
	r[name] = file
	return nil
}

// runPlan is the planner on files: what would meshlet do on node --node?
func runPlan(_ context.Context, args []string, stdout io.Writer) error {
	cfg := config.Config{Local: true}
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	localFlag := &localOrFile{routes: &cfg.Local}
	fs.Var(localFlag, "local", "the local cluster's dump: output of `kubectl get nodes,peers.kilo.squat.ai,clustermeshes -A -o yaml` (required; - = stdin).\n"+
		"--local=true|false sets kg's --local (routes inside a location) as for the agent")
	cfg.RegisterTopology(fs)
	nodeName := fs.String("node", "", "the node to plan for (required)")
	localFile := &localFlag.file
	remotes := remoteFiles{}
	fs.Var(remotes, "remote", "a remote cluster's dump, CLUSTER=FILE (repeatable)")
	output := fs.String("o", "text", "output: json, yaml or text")
	privateIP := fs.String("private-ip", "", "this node's private IP as a CIDR (default: its internal-ip annotation)")
	privateIface := fs.String("private-interface", "eth0", "this node's underlay interface")
	ciliumHost := fs.String("cilium-host-ip", "", "this node's cilium_host address (default: its cni-compatibility-ip annotation)")
	tunnel := fs.String("tunnel-device", "", `IPIP device present on the node: cilium_tunl, tunl0 or "" (none yet)`)
	nowFlag := fs.String("now", "", "the time to plan at, RFC 3339 or unix seconds (default: the newest last-seen in the local file, so a dump plans as it was taken)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodeName == "" {
		return errors.New("--node is required")
	}
	if *localFile == "" {
		return errors.New("--local is required")
	}
	switch *output {
	case "json", "yaml", "text":
	default:
		return fmt.Errorf("-o: %q must be json, yaml or text", *output)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid flags:\n%w", err)
	}
	local, err := readObjectsFile(*localFile)
	if err != nil {
		return err
	}
	rem := map[string]cluster.Objects{}
	for name, file := range remotes {
		if rem[name], err = readObjectsFile(file); err != nil {
			return err
		}
	}
	snap := cluster.Snapshot(local, rem, cfg.ClusterName)
	snap.Settings = cfg.Settings()
	if snap.Now, err = planTime(*nowFlag, snap.Nodes); err != nil {
		return err
	}
	portSet := false
	fs.Visit(func(f *flag.Flag) { portSet = portSet || f.Name == "port" })
	self, err := selfFromFile(*nodeName, snap.Nodes, &snap.Settings, portSet, *privateIP, *privateIface, *ciliumHost, *tunnel)
	if err != nil {
		return err
	}
	plan := topology.Compute(snap, self)
	switch *output {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(plan)
	case "yaml":
		b, err := yaml.Marshal(plan)
		if err != nil {
			return err
		}
		_, err = stdout.Write(b)
		return err
	}
	return printPlan(stdout, plan, snap.Now)
}

func readObjectsFile(path string) (cluster.Objects, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return cluster.Objects{}, err
		}
		defer f.Close()
		r = f
	}
	o, err := cluster.ReadObjects(r)
	if err != nil {
		return o, fmt.Errorf("%s: %w", path, err)
	}
	return o, nil
}

func planTime(v string, nodes []topology.Node) (time.Time, error) {
	if v != "" {
		if sec, err := strconv.ParseInt(v, 10, 64); err == nil {
			return time.Unix(sec, 0), nil
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return t, fmt.Errorf("--now: %q is neither RFC 3339 nor unix seconds", v)
		}
		return t, nil
	}
	var newest time.Time
	for _, n := range nodes {
		if n.LastSeen.After(newest) {
			newest = n.LastSeen
		}
	}
	if newest.IsZero() {
		return time.Now(), nil
	}
	return newest, nil
}

// selfFromFile stands in for what the agent would observe on the node, from
// what the dump says of it: its internal-ip and its endpoint's IP on the
// private interface (which holds the default route), its
// cni-compatibility-ip as cilium_host's address, and its
// discovered-endpoints as what its device learned. Flags override. Unless
// --port is given, the listen port is its endpoint's.
func selfFromFile(name string, nodes []topology.Node, set *topology.Settings, portSet bool, priv, iface, cilium, tunnel string) (topology.Self, error) {
	self := topology.Self{Name: name, DefaultInterface: iface, TunnelDevice: tunnel}
	var n *topology.Node
	for i := range nodes {
		if nodes[i].Name == name {
			n = &nodes[i]
		}
	}
	if n == nil {
		return self, fmt.Errorf("node %q is not in the local file", name)
	}
	self.PublicKey, self.CiliumHostIP, self.Version = n.PublicKey, n.CNICompatibilityIP, n.MeshletVersion
	if n.InternalIP.IsValid() {
		self.Addresses = append(self.Addresses, topology.HostAddress{Interface: iface, Prefix: n.InternalIP})
	}
	if ap, err := netip.ParseAddrPort(n.Endpoint); err == nil {
		if a := ap.Addr().Unmap(); !n.InternalIP.IsValid() || a != n.InternalIP.Addr() {
			self.Addresses = append(self.Addresses, topology.HostAddress{Interface: iface, Prefix: netip.PrefixFrom(a, a.BitLen())})
		}
		if !portSet {
			set.Port = int(ap.Port())
		}
	}
	for k, ep := range n.DiscoveredEndpoints {
		self.Device = append(self.Device, topology.DevicePeer{PublicKey: k, Endpoint: ep, Handshake: true})
	}
	for _, f := range []struct {
		flag, v string
		dst     *netip.Prefix
	}{{"private-ip", priv, &set.PrivateIP}, {"cilium-host-ip", cilium, &self.CiliumHostIP}} {
		if f.v == "" {
			continue
		}
		p, err := kilo.ParsePrefix(f.v)
		if err != nil {
			return self, fmt.Errorf("--%s: %w", f.flag, err)
		}
		*f.dst = p
	}
	return self, nil
}

// printPlan is the plan for people.
func printPlan(w io.Writer, p topology.Plan, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	role := "non-leader (kilo0 down, routes via its leader)"
	if p.Leader {
		role = "leader (kilo0 up with " + p.WireGuardIP.String() + ")"
	}
	fmt.Fprintf(tw, "Node %s at %s: %s, segment %s\n\n", p.Node, now.UTC().Format(time.RFC3339), role, orDash(p.Segment))
	fmt.Fprintln(tw, "SEGMENT\tLOCATION\tLEADER\tWIREGUARD IP\tNODES")
	for _, s := range p.Segments {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, orDash(s.Location), s.Leader, prefixOrDash(s.WireGuardIP), strings.Join(s.Nodes, ","))
	}
	if len(p.Remotes) > 0 {
		fmt.Fprintln(tw, "\nREMOTE CLUSTER\tMESH\tSYNCED\tLEADERS\tALLOWED NETWORKS")
		for _, r := range p.Remotes {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", r.Cluster, r.Mesh, r.Synced, orDash(strings.Join(r.Leaders, ",")), joinPrefixes(r.AllowedNetworks))
		}
	}
	fmt.Fprintf(tw, "\nWIREGUARD PEERS (listen port %d)\n", p.WireGuard.ListenPort)
	fmt.Fprintln(tw, "NAME\tKIND\tCLUSTER\tENDPOINT (SOURCE)\tKEEPALIVE (SOURCE)\tALLOWED IPS")
	for _, peer := range p.WireGuard.Peers {
		ep := orDash(peer.Endpoint)
		if peer.EndpointSource != "" {
			ep += " (" + peer.EndpointSource + ")"
		}
		if peer.Roaming {
			ep += " roams"
		}
		ka := "off"
		if peer.PersistentKeepalive > 0 {
			ka = fmt.Sprintf("%ds (%s)", peer.PersistentKeepalive, peer.KeepaliveSource)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", peer.Name, peer.Kind, orDash(peer.Cluster), ep, ka, joinPrefixes(peer.AllowedIPs))
	}
	fmt.Fprintln(tw, "\nROUTES\nDESTINATION\tGATEWAY\tDEVICE\tSOURCE\tTABLE\tONLINK")
	for _, r := range p.Routes {
		table := "main"
		if r.Table != 0 {
			table = strconv.Itoa(r.Table)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\n", r.Dst, addrOrDash(r.Gw), r.Dev, addrOrDash(r.Src), table, r.OnLink)
	}
	if len(p.Rules) > 0 {
		fmt.Fprintln(tw, "\nRULES\nIIF\tFROM\tTO\tTABLE")
		for _, r := range p.Rules {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", orDash(r.Iif), prefixOrDash(r.Src), prefixOrDash(r.Dst), r.Table)
		}
	}
	if p.Tunnel.Name != "" {
		create := ""
		if p.Tunnel.Create {
			create = " (to be created)"
		}
		fmt.Fprintf(tw, "\nTunnel device: %s%s\n", p.Tunnel.Name, create)
	}
	fmt.Fprintln(tw, "\nANNOTATIONS TO PUBLISH")
	keys := make([]string, 0, len(p.Annotations))
	for k := range p.Annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\n", k, orDash(p.Annotations[k]))
	}
	if len(p.Rejections) > 0 {
		fmt.Fprintln(tw, "\nREJECTED\nOBJECT\tFIELD\tREASON\tMESSAGE")
		for _, r := range p.Rejections {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Object, orDash(r.Field), r.Reason, r.Message)
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func prefixOrDash(p netip.Prefix) string {
	if !p.IsValid() {
		return "-"
	}
	return p.String()
}

func addrOrDash(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
