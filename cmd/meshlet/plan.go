package main

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/status"
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

func (l *localOrFile) Type() string { return "FILE|true|false" }

func (l *localOrFile) Set(v string) error {
	if b, err := strconv.ParseBool(v); err == nil && (v == "true" || v == "false") {
		*l.routes = b
		return nil
	}
	l.file = v
	return nil
}

type remoteFiles map[string]string

// String is the flag's default in --help: nothing when empty (not
// "map[]").
func (r remoteFiles) String() string {
	pairs := make([]string, 0, len(r))
	for name, file := range r {
		pairs = append(pairs, name+"="+file)
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}
func (r remoteFiles) Type() string { return "CLUSTER=FILE" }
func (r remoteFiles) Set(v string) error {
	name, file, ok := strings.Cut(v, "=")
	if !ok || name == "" || file == "" {
		return fmt.Errorf("want CLUSTER=FILE, got %q", v)
	}
	r[name] = file
	return nil
}

// planFlags are `meshlet plan`'s own flags (the topology flags are the
// agent's).
type planFlags struct {
	cfg                              config.Config
	local                            localOrFile
	output                           *outputFlag
	node, iface, cilium, tunnel, now string
	remotes                          remoteFiles
}

// newPlanCmd is `meshlet plan`: the planner on files, what would meshlet do
// on node --node?
func newPlanCmd() *cobra.Command {
	f := &planFlags{cfg: config.Config{Local: true}, remotes: remoteFiles{}}
	f.local.routes = &f.cfg.Local
	c := &cobra.Command{
		Use:   "plan --node NAME --local FILE [--remote CLUSTER=FILE ...]",
		Short: "Compute a node's plan from kubectl dumps (what meshlet would do there)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runPlan(c, f)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.node, "node", "", "the node to plan for (required)")
	fs.Var(&f.local, "local", "the local cluster's dump, a file of what kubectl get nodes,peers.kilo.squat.ai,clustermeshes -A -o yaml prints (required; - = stdin); --local=true|false sets kg's --local (routes inside a location) as for the agent")
	fs.Var(f.remotes, "remote", "a remote cluster's dump, CLUSTER=FILE (repeatable)")
	f.output = registerOutput(fs, "text", "json", "yaml")
	f.cfg.RegisterTopology(fs)
	f.cfg.CNIPath = config.DefaultCNIPath // not read: the plan takes the pod CIDR as the conflist's range (printed as assumed)
	fs.StringVar(&f.iface, "private-interface", "eth0", "this node's underlay interface (it holds the default route)")
	fs.StringVar(&f.cilium, "cilium-host-ip", "", "this node's cilium_host address (default: its cni-compatibility-ip annotation)")
	fs.StringVar(&f.tunnel, "tunnel-device", "", `IPIP device present on the node: cilium_tunl, tunl0 or "" (none yet)`)
	fs.StringVar(&f.now, "now", "", "the time to plan at, RFC 3339 or unix seconds (default: the newest last-seen in the local file, so a dump plans as it was taken)")
	return c
}

func runPlan(c *cobra.Command, f *planFlags) error {
	cfg, stdout := &f.cfg, c.OutOrStdout() // Validate parses into f.cfg, which planObjects reads
	switch {
	case f.node == "":
		return usage(errors.New("--node is required"))
	case f.local.file == "":
		return usage(errors.New("--local is required"))
	}
	if err := f.output.check(); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return usage(fmt.Errorf("invalid flags: %w", err))
	}
	localFile, remotes, nodeName, output := &f.local.file, f.remotes, &f.node, &f.output.value
	local, err := readObjectsFile(*localFile)
	if err != nil {
		return err
	}
	// The topology flags not given: what the dump's nodes publish, the
	// agents' own settings (not meshlet's defaults).
	if set := publishedSettings(c.Flags(), &f.cfg, local.Nodes); len(set) > 0 {
		if err := f.cfg.Validate(); err != nil {
			return fmt.Errorf("the settings the nodes publish (%s): %w", strings.Join(set, " "), err)
		}
	}
	rem := map[string]cluster.Objects{}
	for name, file := range remotes {
		if rem[name], err = readObjectsFile(file); err != nil {
			return err
		}
	}
	plan, now, err := planObjects(f, *nodeName, c.Flags().Changed("port"), local, rem)
	if err != nil {
		return err
	}
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
	return printPlan(stdout, plan, now)
}

// planObjects plans for node from the objects the files hold, at the time
// it plans at (the fuzz target FuzzPlanInput drives it as runPlan does).
func planObjects(f *planFlags, node string, portSet bool, local cluster.Objects, rem map[string]cluster.Objects) (planned, time.Time, error) {
	snap := cluster.Snapshot(local, rem, f.cfg.ClusterName)
	snap.Settings = f.cfg.Settings()
	var err error
	if snap.Now, err = planTime(f.now, snap.Nodes); err != nil {
		return planned{}, snap.Now, usage(err)
	}
	for i := range snap.Remotes {
		snap.Remotes[i].HeardOnce(snap.Now)
	}
	self, assumed, err := selfFromFile(node, snap.Nodes, &snap.Settings, portSet, f.iface, f.cilium, f.tunnel)
	if err != nil {
		return planned{}, snap.Now, err
	}
	// The node's annotations as the dump has them: what the agent would
	// find published (its heartbeat, what an earlier run left).
	for _, n := range local.Nodes {
		if n.Name == node {
			snap.Published = n.Annotations
		}
	}
	return planned{Plan: planner.Compute(snap, self), Assumed: assumed}, snap.Now, nil
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
	return newest, nil // zero without nodes: nothing is judged by it
}

// selfFromFile stands in for what the agent would observe on the node,
// from what the dump says of it and nothing else (docs/kilo-compatibility.md#own-address):
// its internal-ip (or --private-ip) as the address of the private interface
// (which holds the default route), its published endpoint as the endpoint
// it keeps advertising (Kilo's rule for a node's own endpoint), its key,
// its cni-compatibility-ip as cilium_host's address (--cilium-host-ip
// overrides), and its discovered-endpoints as what its device learned.
// Unless --port is given, the listen port is its endpoint's. It returns
// what it assumed, for people.
func selfFromFile(name string, nodes []topology.Node, set *topology.Settings, portSet bool, iface, cilium, tunnel string) (topology.Self, []string, error) {
	self := topology.Self{Name: name, DefaultInterface: iface, TunnelDevice: tunnel}
	var n *topology.Node
	for i := range nodes {
		if nodes[i].Name == name {
			n = &nodes[i]
		}
	}
	if n == nil {
		return self, nil, fmt.Errorf("node %q is not in the local file", name)
	}
	var assumed []string
	self.PublicKey, self.CiliumHostIP, self.Version = n.PublicKey, n.CNICompatibilityIP, n.MeshletVersion
	if n.PublicKey.IsZero() {
		// The node's agent has its own key, publishes it and plans with it,
		// as kg does (docs/kilo-compatibility.md#own-address).
		self.PublicKey = standInKey(name)
		assumed = append(assumed, "WireGuard key "+self.PublicKey.String()+": a stand-in, the dump has none valid for the node (its agent publishes and plans with its own)")
	}
	addrs := []netip.Prefix{n.InternalIP, set.PrivateIP}
	if set.DualStack() {
		addrs = append(addrs, n.DualStackInternalIP)
	}
	for _, a := range addrs {
		if a.IsValid() && !slices.ContainsFunc(self.Addresses, func(h topology.HostAddress) bool { return h.Prefix == a }) {
			self.Addresses = append(self.Addresses, topology.HostAddress{Interface: iface, Prefix: a})
			assumed = append(assumed, fmt.Sprintf("host address %s on %s", a, iface))
		}
	}
	if len(self.Addresses) == 0 {
		assumed = append(assumed, "no private address (the dump has no internal-ip for the node)")
	}
	if n.Endpoint != "" {
		self.Advertised = n.Endpoint
		assumed = append(assumed, "endpoint "+n.Endpoint+" (published)")
	}
	if ap, err := netip.ParseAddrPort(n.Endpoint); err == nil && !portSet {
		set.Port = int(ap.Port())
	}
	for k, ep := range n.DiscoveredEndpoints {
		self.Device = append(self.Device, topology.DevicePeer{PublicKey: k, Endpoint: ep, Handshake: true})
	}
	if cilium != "" {
		p, err := kilo.ParsePrefix(cilium)
		if err != nil {
			return self, nil, usage(fmt.Errorf("--cilium-host-ip: %w", err))
		}
		self.CiliumHostIP = p
	}
	return self, assumed, nil
}

// planned is meshlet plan's output: the plan and what it assumed of the
// node where the dump says nothing of the host.
type planned struct {
	topology.Plan
	Assumed []string `json:"assumed"`
}

// printPlan is the plan for people.
func printPlan(w io.Writer, pa planned, now time.Time) error {
	p := pa.Plan
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	role := "non-leader (kilo0 down, routes via its leader)"
	if p.Leader {
		role = "leader (kilo0 up with " + p.WireGuardIP.String() + ")"
		if p.DualStackWireGuardIP.IsValid() {
			role = "leader (kilo0 up with " + p.WireGuardIP.String() + " and " + p.DualStackWireGuardIP.String() + ")"
		}
	}
	fmt.Fprintf(tw, "Node %s at %s: %s, segment %s\n\n", p.Node, now.UTC().Format(time.RFC3339), role, orDash(p.Segment))
	fmt.Fprintln(tw, "SEGMENT\tLOCATION\tLEADER\tWIREGUARD IP\tNODES")
	for _, s := range p.Segments {
		wg := prefixOrDash(s.WireGuardIP)
		if s.DualStackWireGuardIP.IsValid() {
			wg += "," + s.DualStackWireGuardIP.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, orDash(s.Location), s.Leader, wg, strings.Join(s.Nodes, ","))
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
	fmt.Fprintln(tw, "\nROUTES AND RULES")
	status.WriteRoutes(tw, p.Routes, p.Rules)
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
	status.WriteRejections(tw, p.Rejections)
	if len(pa.Assumed) > 0 {
		fmt.Fprintln(tw, "\nASSUMED OF THE NODE (from the dump: meshlet plan sees no host)")
		for _, a := range pa.Assumed {
			fmt.Fprintf(tw, "- %s\n", a)
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

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// standInKey is a public key for a node whose dump has none valid: derived
// from its name, so a plan is reproducible.
func standInKey(name string) topology.Key {
	return topology.Key(sha256.Sum256([]byte("meshlet plan: stand-in key of " + name)))
}
