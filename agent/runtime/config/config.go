// Package config holds meshlet's command-line settings: the flags keep kg's
// names and defaults where the meaning is the same, and Validate rejects
// bad values at start with a message that names the flag.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
)

// PodNamespace is the namespace of the pod the agent runs in (its
// ServiceAccount's, mounted by the kubelet), else kilo-system: in Kilo's
// own DaemonSet (kube-system, Cozystack's cozy-kilo) the agent finds its
// ClusterMeshes and Leases there without a flag.
func PodNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if ns := strings.TrimSpace(string(b)); err == nil && len(validation.IsDNS1123Label(ns)) == 0 {
		return ns
	}
	return "kilo-system"
}

// DefaultStatusSocket is where the agent serves /status and meshlet status
// reads it: a unix socket, never the network (docs/security.md#status).
const DefaultStatusSocket = "/run/meshlet/status.sock"

// Config is the agent's configuration.
type Config struct {
	Hostname    string
	Kubeconfig  string
	Namespace   string
	ClusterName string
	Interface   string
	Port        int
	Subnet      string
	// DualStackSubnet is --dual-stack-subnet (docs/dual-stack.md).
	DualStackSubnet string
	Granularity     string
	TopologyLabel   string
	Local           bool
	Compatibility   string
	Encapsulate     string
	MTU             string
	// InternalCIDRs limit the discovery of the private IP (kg's
	// --internal-cidr); PrivateIP sets it outright.
	InternalCIDRs stringList
	PrivateIP     string
	ServiceCIDRs  stringList
	ResyncPeriod  time.Duration
	Listen        string
	// StatusSocket is where /status is served ("" = nowhere).
	StatusSocket  string
	WireGuardMode string // kernel | userspace | auto
	MetricsCompat string // "", or a comma list of wireguard-exporter and kilo
	// ClusterMeshStatus: compete for the Lease and write ClusterMesh status.
	ClusterMeshStatus bool
	KeyFile           string
	LogLevel          string
	// RepairSessions re-establishes half-dead sessions to kg-run peers
	// (docs/kilo-compatibility.md#half-dead).
	RepairSessions bool
	// LeaderElection: one Lease per location, whose holder leads it
	// (docs/failover.md); LeaseDuration and LeaseRenew its timing.
	LeaderElection            bool
	LeaseDuration, LeaseRenew time.Duration
	// LeaseRestartGrace: a holder stopping for a restart stretches its
	// Lease to this, so its next process resumes it (0: it just stops
	// renewing; docs/failover.md#restart).
	LeaseRestartGrace time.Duration
	// HealthProbeInterval is how often leaders probe their tunnels and
	// nodes their underlay gateway (0: never).
	HealthProbeInterval time.Duration
	// InsecureKubeconfigExec lets remote kubeconfigs run exec credential
	// plugins (docs/security.md#kubeconfig); off, they are refused.
	InsecureKubeconfigExec bool

	// kg's flags that meshlet run has too (docs/dropin.md#flags), with
	// meshlet's defaults there and kg's in kg mode (KgDefaults).
	//
	// Backend is kg's --backend: only "kubernetes" exists.
	Backend string
	// CNI: manage the node's CNI configuration (Kilo as CNI): the pod
	// CIDR in CNIPath's IPAM, the bridge's NAT.
	CNI     bool
	CNIPath string
	// CleanUp: on exit, remove what the agent set up when the node is
	// left (an uninstall), not when a new agent follows (a rolling update);
	// CleanUpInterface also removes the WireGuard interface then
	// (docs/dropin.md#clean-up).
	CleanUp, CleanUpInterface bool
	// CreateInterface false: another process runs the WireGuard device
	// (kg's userspace manifests: wireguard-go in a sidecar).
	CreateInterface bool
	// Master is the API server's address, over the kubeconfig's.
	Master string
	// PrioritisePrivateAddresses: advertise the private IP as the endpoint.
	PrioritisePrivateAddresses bool
	// IptablesForwardRules: ACCEPT rules in FORWARD for the pod subnets
	// (with CNI only, as kg).
	IptablesForwardRules bool
	// PrintVersion is kg's --version.
	PrintVersion bool
	// MaxPeerAllowedIPs, MaxAllowedLocationIPs, MaxPeers and MaxRemoteNodes
	// bound hostile input (kilo.Limits; 0: no limit, as Kilo).
	MaxPeerAllowedIPs, MaxAllowedLocationIPs, MaxPeers, MaxRemoteNodes int

	parsed parsed
}

type parsed struct {
	subnet    netip.Prefix
	dualStack netip.Prefix
	private   netip.Prefix
	internals []netip.Prefix
	services  []netip.Prefix
	mtu       int
}

type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Type() string   { return "strings" }
func (s *stringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

// RegisterTopology registers the flags that shape the plan (shared by
// `meshlet run` and `meshlet plan`). A caller that defines its own "local"
// flag first (meshlet plan, where --local names a file) keeps it.
func (c *Config) RegisterTopology(fs *pflag.FlagSet) {
	fs.StringVar(&c.ClusterName, "cluster-name", "", "this cluster's name in ClusterMesh objects (default: the entry marked local)")
	fs.StringVar(&c.Interface, "interface", "kilo0", "name of the WireGuard interface")
	fs.IntVar(&c.Port, "port", 51820, "WireGuard listen port")
	fs.StringVar(&c.Subnet, "subnet", "10.4.0.0/16", "CIDR from which segment leaders get their WireGuard IPs")
	fs.StringVar(&c.DualStackSubnet, "dual-stack-subnet", "", "CIDR of the other address family than --subnet's: the mesh carries both families, leaders get WireGuard IPs of both (docs/dual-stack.md)")
	fs.StringVar(&c.Granularity, "mesh-granularity", "location", "location, full or cross")
	fs.StringVar(&c.TopologyLabel, "topology-label", "topology.kubernetes.io/region", "node label that names a node's location")
	if fs.Lookup("local") == nil {
		fs.BoolVar(&c.Local, "local", true, "route traffic inside a location (false when the CNI does it, e.g. Cilium)")
	}
	fs.StringVar(&c.Compatibility, "compatibility", "", `CNI compatibility: "", cilium or flannel`)
	fs.StringVar(&c.Encapsulate, "encapsulate", "always", "IPIP encapsulation inside a location: never, crosssubnet or always")
	fs.StringVar(&c.MTU, "mtu", "auto", "MTU of the WireGuard interface: a number or auto (underlay MTU − 80)")
	fs.Var(&c.InternalCIDRs, "internal-cidr", "CIDRs the private IP is discovered in, as kg's flag (repeatable or comma-separated; default: any)")
	fs.StringVar(&c.PrivateIP, "private-ip", "", "this node's private IP with its mask, instead of discovering it (e.g. 192.168.1.10/24)")
	fs.Var(&c.ServiceCIDRs, "service-cidr", "service CIDR, not masqueraded (repeatable or comma-separated)")
	fs.BoolVar(&c.CNI, "cni", false, "manage the node's CNI configuration (Kilo as the CNI: the pod CIDR in --cni-path's IPAM, NAT for the pod subnet)")
	fs.BoolVar(&c.IptablesForwardRules, "iptables-forward-rules", false, "with --cni, add ACCEPT rules to FORWARD for the pod subnets (kg's)")
	fs.BoolVar(&c.PrioritisePrivateAddresses, "prioritise-private-addresses", false, "advertise the private IP as the node's endpoint")
}

// RegisterAgent registers the flags only the agent uses.
func (c *Config) RegisterAgent(fs *pflag.FlagSet) {
	fs.StringVar(&c.Hostname, "hostname", "", "name of this node (default: $NODE_NAME, else the host name)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	fs.StringVar(&c.Namespace, "namespace", PodNamespace(), "namespace of meshlet's Leases, of ClusterMesh objects and their Secrets (in a pod: the pod's own)")
	fs.DurationVar(&c.ResyncPeriod, "resync-period", 30*time.Second, "period of the full reconcile")
	fs.StringVar(&c.Listen, "listen", ":1107", "address of /metrics, /healthz and /readyz (as kg's)")
	fs.StringVar(&c.StatusSocket, "status-socket", DefaultStatusSocket, "unix socket of /status (meshlet status), readable by root only; \"\" = none")
	fs.StringVar(&c.WireGuardMode, "wireguard", "auto", "WireGuard implementation: kernel, userspace or auto")
	fs.StringVar(&c.MetricsCompat, "metrics-compat", "", `also export other exporters' series: "" or a comma-separated list of wireguard-exporter (prometheus_wireguard_exporter) and kilo (kg's kilo_*)`)
	fs.StringVar(&c.KeyFile, "key-file", "/var/lib/meshlet/key", "private key file (created 0600 if missing)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "all, debug, info, warn, error or none")
	fs.BoolVar(&c.ClusterMeshStatus, "clustermesh-status", true, "write ClusterMesh status (one agent per cluster: the leader of the first segment that runs meshlet; never over another manager's status)")
	fs.BoolVar(&c.RepairSessions, "repair-sessions", true, "re-establish WireGuard sessions that a kg peer forgot when it rewrote its device (mixed clusters)")
	fs.BoolVar(&c.LeaderElection, "leader-election", true, "elect each location's leader with a Lease where every node of it runs meshlet: failover in seconds, a degraded leader steps aside (false: Kilo's rule alone)")
	fs.DurationVar(&c.LeaseDuration, "leader-lease-duration", 3*time.Second, "how long a location's leader that stopped renewing its Lease is presumed alive (whole seconds)")
	fs.DurationVar(&c.LeaseRenew, "leader-lease-renew", time.Second, "how often a location's leader renews its Lease")
	fs.DurationVar(&c.LeaseRestartGrace, "leader-restart-grace", 30*time.Second, "how long a location's leader stopping for a restart (SIGTERM, its node not going away) keeps its Lease for its next agent (whole seconds; 0: the Lease expires after --leader-lease-duration)")
	fs.BoolVar(&c.InsecureKubeconfigExec, "insecure-kubeconfig-exec", false, "let remote clusters' kubeconfig Secrets run exec credential plugins (the command runs as root on every segment leader; default: such kubeconfigs are refused, as are auth providers and file paths)")
	d := kilo.DefaultLimits
	fs.IntVar(&c.MaxPeerAllowedIPs, "max-peer-allowed-ips", d.PeerAllowedIPs, "a Peer with more spec.allowedIPs is rejected (0: no limit; docs/kilo-compatibility.md#limits)")
	fs.IntVar(&c.MaxAllowedLocationIPs, "max-allowed-location-ips", d.AllowedLocationIPs, "a node's kilo.squat.ai/allowed-location-ips with more prefixes is ignored (0: no limit)")
	fs.IntVar(&c.MaxPeers, "max-peers", d.Peers, "Peers planned per cluster (local, each remote), the oldest first; the others are rejected (0: no limit)")
	fs.IntVar(&c.MaxRemoteNodes, "max-remote-nodes", d.RemoteNodes, "Nodes planned per remote cluster, the oldest first; the others are rejected (0: no limit)")
	fs.DurationVar(&c.HealthProbeInterval, "health-probe-interval", time.Second, "how often leaders probe their tunnels to the other leaders and nodes their underlay gateway (0: never, and no step-aside for health)")
}

// DefaultCNIPath is kg's --cni-path.
const DefaultCNIPath = "/etc/cni/net.d/10-kilo.conflist"

// RegisterKg registers the rest of kg's agent flags (kg 0.7's command
// line; docs/dropin.md#flags), with meshlet run's defaults.
func (c *Config) RegisterKg(fs *pflag.FlagSet) {
	fs.StringVar(&c.Backend, "backend", "kubernetes", "the backend for the mesh (kg's): kubernetes")
	fs.StringVar(&c.CNIPath, "cni-path", DefaultCNIPath, "the CNI configuration list --cni manages")
	fs.BoolVar(&c.CleanUp, "clean-up", false, "on exit, remove the routes, rules, chains and annotations meshlet set up when the node is left (uninstall), not when a new agent follows (rolling update)")
	fs.BoolVar(&c.CleanUpInterface, "clean-up-interface", false, "with --clean-up, also delete the WireGuard interface when the node is left")
	fs.BoolVar(&c.CreateInterface, "create-interface", true, "create the WireGuard interface (false: another process runs it, e.g. wireguard-go in a sidecar)")
	fs.StringVar(&c.Master, "master", "", "the API server's address (overrides the kubeconfig's)")
	fs.BoolVar(&c.PrintVersion, "version", false, "print the version and exit")
}

// KgDefaults are kg's defaults where they differ from meshlet run's: the
// image in Kilo's own DaemonSet runs with kg's command line, so a flag
// the manifest leaves out means what it means to kg.
var KgDefaults = map[string]string{
	"cni":            "true",
	"clean-up":       "true",
	"key-file":       "/var/lib/kilo/key",
	"metrics-compat": "kilo",
}

// SetDefaults replaces registered flags' defaults (the value and what
// --help shows).
func SetDefaults(fs *pflag.FlagSet, defaults map[string]string) error {
	for name, v := range defaults {
		f := fs.Lookup(name)
		if f == nil {
			return fmt.Errorf("no flag --%s", name)
		}
		if err := f.Value.Set(v); err != nil {
			return fmt.Errorf("default of --%s: %w", name, err)
		}
		f.DefValue = v
	}
	return nil
}

// Validate checks every flag and returns all problems at once. Each
// check is one group of related flags, so a rule can be read (and
// tested) alone; the ones that parse keep the parsed value for Settings.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	for _, check := range []func(problem){
		c.checkDevice, c.checkModes, c.checkAddresses, c.checkCluster, c.checkLease, c.checkLimits, c.checkOutput,
	} {
		check(bad)
	}
	return errors.Join(errs...)
}

// problem reports one flag's value as refused.
type problem func(flag, format string, args ...any)

// oneOf reports value unless it is one of allowed.
func oneOf[T comparable](bad problem, flag string, value T, allowed []T, format string) {
	if !slices.Contains(allowed, value) {
		bad(flag, format, value)
	}
}

// checkDevice: the WireGuard interface, its port and MTU, how it is run.
func (c *Config) checkDevice(bad problem) {
	if c.Interface == "" || len(c.Interface) > 15 || strings.ContainsAny(c.Interface, "/ ") {
		bad("interface", "%q is not a valid interface name", c.Interface)
	}
	if c.Port < 1 || c.Port > 65535 {
		bad("port", "%d is outside 1–65535", c.Port)
	}
	if c.MTU != "auto" {
		n, err := strconv.Atoi(c.MTU)
		if err != nil || n < 1280 || n > 65535 {
			bad("mtu", "%q must be auto or a number in 1280–65535", c.MTU)
		}
		c.parsed.mtu = n
	}
	oneOf(bad, "wireguard", c.WireGuardMode, []string{"", "kernel", "userspace", "auto"}, "%q must be kernel, userspace or auto")
	if c.CNI && c.CNIPath == "" {
		bad("cni-path", "must name the CNI configuration list --cni manages")
	}
	if c.CleanUpInterface && !c.CleanUp {
		bad("clean-up-interface", "needs --clean-up (as kg: the interface goes with the rest)")
	}
}

// checkModes: kg's topology and compatibility modes.
func (c *Config) checkModes(bad problem) {
	oneOf(bad, "mesh-granularity", topology.Granularity(c.Granularity),
		[]topology.Granularity{topology.GranularityLocation, topology.GranularityFull, topology.GranularityCross},
		"%q must be location, full or cross")
	oneOf(bad, "compatibility", topology.Compatibility(c.Compatibility),
		[]topology.Compatibility{topology.CompatibilityNone, topology.CompatibilityCilium, topology.CompatibilityFlannel},
		`%q must be "", cilium or flannel`)
	oneOf(bad, "encapsulate", topology.Encapsulate(c.Encapsulate),
		[]topology.Encapsulate{topology.EncapsulateNever, topology.EncapsulateCrossSubnet, topology.EncapsulateAlways},
		"%q must be never, crosssubnet or always")
	oneOf(bad, "backend", c.Backend, []string{"", "kubernetes"}, "%q: meshlet has only kg's kubernetes backend")
}

// checkAddresses: the mesh subnet and the prefixes given on the command line.
func (c *Config) checkAddresses(bad problem) {
	c.parsed.subnet = meshSubnet(bad, "subnet", c.Subnet)
	if c.DualStackSubnet != "" {
		c.parsed.dualStack = meshSubnet(bad, "dual-stack-subnet", c.DualStackSubnet)
		if s, d := c.parsed.subnet, c.parsed.dualStack; s.IsValid() && d.IsValid() && s.Addr().Is4() == d.Addr().Is4() {
			bad("dual-stack-subnet", "%q must be of the other address family than --subnet %s", c.DualStackSubnet, c.Subnet)
		}
	}
	c.parsed.internals = parseCIDRs(bad, "internal-cidr", c.InternalCIDRs)
	c.parsed.services = parseCIDRs(bad, "service-cidr", c.ServiceCIDRs)
	if c.PrivateIP != "" {
		p, err := netip.ParsePrefix(c.PrivateIP)
		if err != nil {
			bad("private-ip", "%q is not an address with its mask (e.g. 192.168.1.10/24)", c.PrivateIP)
		}
		c.parsed.private = p
	}
}

// meshSubnet parses a subnet leaders' WireGuard IPs come from: IPv4 of /30
// or larger, or IPv6 of /126 or larger (room for a few segments).
func meshSubnet(bad problem, flag, s string) netip.Prefix {
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() || p.Bits() > p.Addr().BitLen()-2 {
		bad(flag, "%q must be an IPv4 CIDR of /30 or larger or an IPv6 CIDR of /126 or larger", s)
		return netip.Prefix{}
	}
	return p.Masked()
}

// parseCIDRs parses a repeated CIDR flag, reporting each value that is none.
func parseCIDRs(bad problem, flag string, values []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range values {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			bad(flag, "%q is not a CIDR", s)
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}

// checkCluster: the cluster's name and the informers' resync.
func (c *Config) checkCluster(bad problem) {
	if c.ClusterName != "" {
		if errs := validation.IsDNS1123Label(c.ClusterName); len(errs) > 0 {
			bad("cluster-name", "%q is not a DNS label: %s", c.ClusterName, strings.Join(errs, "; "))
		}
	}
	if c.ResyncPeriod != 0 && c.ResyncPeriod < time.Second {
		bad("resync-period", "%v is below 1s", c.ResyncPeriod)
	}
}

// checkLease: the location Lease's timing and the health probes it rests on.
func (c *Config) checkLease(bad problem) {
	if c.HealthProbeInterval != 0 && c.HealthProbeInterval < 100*time.Millisecond {
		bad("health-probe-interval", "%v must be 0 (off) or at least 100ms", c.HealthProbeInterval)
	}
	if !c.LeaderElection {
		return
	}
	if c.LeaseDuration < time.Second || c.LeaseDuration%time.Second != 0 {
		bad("leader-lease-duration", "%v must be whole seconds, at least 1s", c.LeaseDuration)
	}
	if c.LeaseRenew <= 0 || c.LeaseRenew >= c.LeaseDuration {
		bad("leader-lease-renew", "%v must be above 0 and below --leader-lease-duration (%v)", c.LeaseRenew, c.LeaseDuration)
	}
	if c.LeaseRestartGrace != 0 && (c.LeaseRestartGrace < c.LeaseDuration || c.LeaseRestartGrace%time.Second != 0) {
		bad("leader-restart-grace", "%v must be 0 or whole seconds, at least --leader-lease-duration (%v)", c.LeaseRestartGrace, c.LeaseDuration)
	}
}

// checkLimits: the bounds on hostile input (--max-*).
func (c *Config) checkLimits(bad problem) {
	for _, l := range []struct {
		flag string
		v    int
	}{{"max-peer-allowed-ips", c.MaxPeerAllowedIPs}, {"max-allowed-location-ips", c.MaxAllowedLocationIPs},
		{"max-peers", c.MaxPeers}, {"max-remote-nodes", c.MaxRemoteNodes}} {
		if l.v < 0 {
			bad(l.flag, "%d must be 0 (no limit) or more", l.v)
		}
	}
}

// checkOutput: metrics and logs.
func (c *Config) checkOutput(bad problem) {
	if _, err := metrics.ParseCompat(c.MetricsCompat); err != nil {
		bad("metrics-compat", `%v: must be "" or a comma-separated list of wireguard-exporter and kilo`, err)
	}
	oneOf(bad, "log-level", c.LogLevel, []string{"", "all", "debug", "info", "warn", "error", "none"},
		"%q must be all, debug, info, warn, error or none")
}

// Limits returns the bounds on hostile input (--max-*).
func (c *Config) Limits() kilo.Limits {
	return kilo.Limits{PeerAllowedIPs: c.MaxPeerAllowedIPs, AllowedLocationIPs: c.MaxAllowedLocationIPs,
		Peers: c.MaxPeers, RemoteNodes: c.MaxRemoteNodes}
}

// Settings returns the planner's settings. Call Validate first.
func (c *Config) Settings() topology.Settings {
	return topology.Settings{
		Interface:       c.Interface,
		Granularity:     topology.Granularity(c.Granularity),
		Subnet:          c.parsed.subnet,
		DualStackSubnet: c.parsed.dualStack,
		Port:            c.Port,
		Encapsulate:     topology.Encapsulate(c.Encapsulate),
		Local:           c.Local,
		Compatibility:   topology.Compatibility(c.Compatibility),
		TopologyLabel:   c.TopologyLabel,
		ServiceCIDRs:    c.parsed.services,
		ClusterName:     c.ClusterName,
		MTU:             c.parsed.mtu,
		PrivateIP:       c.parsed.private,
		InternalCIDRs:   c.parsed.internals,
		HealthProbes:    c.HealthProbeInterval > 0,
		CNI:             c.CNI,
		ForwardRules:    c.CNI && c.IptablesForwardRules,
		PrivateEndpoint: c.PrioritisePrivateAddresses,
	}
}
