// Package status is what `meshlet status` shows: the running agent's view of
// its node — role, device, every peer with its health, the routes and rules
// it owns and whether the host still matches them, the last reconcile, the
// remote clusters. The agent serves it as JSON on its listener (/status);
// the command prints it for people (Print) or passes the JSON on.
package status

import (
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/grants"
)

// Status is one node's state as its agent sees it.
type Status struct {
	Node    string    `json:"node"`
	Cluster string    `json:"cluster,omitempty"`
	Version string    `json:"version"`
	At      time.Time `json:"at"`
	// Role is "leader", "non-leader" or "not in the mesh" (not Ready yet).
	Role        string       `json:"role"`
	Segment     string       `json:"segment,omitempty"`
	Location    string       `json:"location,omitempty"`
	WireGuardIP netip.Prefix `json:"wireguardIP,omitzero"`
	PrivateIP   netip.Prefix `json:"privateIP,omitzero"`
	// DualStackWireGuardIP and DualStackPrivateIP are the node's addresses
	// of the second family, in a dual-stack mesh (docs/dual-stack.md).
	DualStackWireGuardIP netip.Prefix     `json:"dualStackWireguardIP,omitzero"`
	DualStackPrivateIP   netip.Prefix     `json:"dualStackPrivateIP,omitzero"`
	Endpoint             string           `json:"endpoint,omitempty"`
	Device               Device           `json:"device"`
	Peers                []Peer           `json:"peers"`
	Routes               []topology.Route `json:"routes"`
	Rules                []topology.Rule  `json:"rules"`
	// Drift lists what differs on the host from the plan (empty: nothing).
	Drift      []string             `json:"drift,omitempty"`
	LastRun    Run                  `json:"lastReconcile"`
	Remotes    []Remote             `json:"remotes,omitempty"`
	Rejections []topology.Rejection `json:"rejections,omitempty"`
	// ClusterMeshStatusWriter: this agent writes the status of the
	// cluster's ClusterMeshes (the plan names it; docs/clustermesh.md#status).
	ClusterMeshStatusWriter bool `json:"clusterMeshStatusWriter,omitempty"`
	// Leadership is the location's Lease as this agent sees it and what
	// the last plan decided of it (absent without Leases).
	Leadership *Leadership `json:"leadership,omitempty"`
	// FeaturesOff are the features the agent may not use: the grants or
	// CRDs each lacks (docs/dropin.md#grants).
	FeaturesOff []grants.Feature `json:"featuresOff,omitempty"`
	// Findings are the named faults this agent proves about its node
	// (diagnose.NodeFindings; docs/runbooks.md has one entry each).
	Findings []diagnose.Finding `json:"findings,omitempty"`
}

// Leadership is the last plan's decisions on the location's Lease and the
// elector's state: whether this node holds it, and the history of its role
// (docs/failover.md).
type Leadership struct {
	topology.Leadership
	Held bool `json:"held"`
	// TakesAt: when this candidate takes the free Lease (its rank's
	// stagger counted out) unless something changes first.
	TakesAt   time.Time `json:"takesAt,omitzero"`
	RenewedAt time.Time `json:"renewedAt,omitzero"`
	// Roles are this node's role changes, oldest first: from At on it was
	// (Leader) or was not configured as the location's leader.
	Roles []Role `json:"roles"`
}

// Role is one change of this node's role.
type Role struct {
	At     time.Time `json:"at"`
	Leader bool      `json:"leader"`
}

// Device is the WireGuard device.
type Device struct {
	Interface  string `json:"interface"`
	Type       string `json:"type"` // as wgctrl reports it: "Linux kernel", "userspace"
	ListenPort int    `json:"listenPort"`
	PublicKey  string `json:"publicKey"`
	MTU        int    `json:"mtu"`
	Error      string `json:"error,omitempty"`
}

// Peer is one WireGuard peer: what the plan says and what the device says.
type Peer struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Cluster   string `json:"cluster,omitempty"`
	Location  string `json:"location,omitempty"`
	PublicKey string `json:"publicKey"`
	// Endpoint is the planned one and its source; Learned what the device
	// has now (a roaming peer's learned NAT address).
	Endpoint        string    `json:"endpoint,omitempty"`
	EndpointSource  string    `json:"endpointSource,omitempty"`
	Learned         string    `json:"learned,omitempty"`
	Roaming         bool      `json:"roaming"`
	Keepalive       int       `json:"keepalive"`
	KeepaliveSource string    `json:"keepaliveSource,omitempty"`
	LastHandshake   time.Time `json:"lastHandshake,omitzero"`
	// State is the peer's health (agent/runtime/metrics: up, down, never,
	// new, idle) and Allowed how old its handshake may be; "missing" when
	// the planned peer is not on the device.
	State      string         `json:"state"`
	Allowed    time.Duration  `json:"allowedHandshakeAge,omitempty"`
	RxBytes    int64          `json:"rxBytes"`
	TxBytes    int64          `json:"txBytes"`
	AllowedIPs []netip.Prefix `json:"allowedIPs"`
}

// Run is the last reconcile.
type Run struct {
	At       time.Time     `json:"at,omitzero"`
	Duration time.Duration `json:"duration"`
	Error    string        `json:"error,omitempty"`
	Ready    bool          `json:"ready"`
}

// Remote is one remote cluster as this node's watcher sees it (leaders
// only): the watcher's state and what the plan makes of it.
type Remote struct {
	cluster.RemoteStatus
	Mesh    string   `json:"mesh,omitempty"`
	Leaders []string `json:"leaders,omitempty"`
}

// Print writes the status for people.
func Print(w io.Writer, s Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Node %s (cluster %s), meshlet %s, at %s\n", s.Node, orDash(s.Cluster), s.Version, s.At.UTC().Format(time.RFC3339))
	role := s.Role
	if s.Role == "leader" {
		role += " with " + s.WireGuardIP.String()
		if s.DualStackWireGuardIP.IsValid() {
			role += " and " + s.DualStackWireGuardIP.String()
		}
	}
	if s.ClusterMeshStatusWriter {
		role += ", writes the ClusterMesh status"
	}
	priv := prefix(s.PrivateIP)
	if s.DualStackPrivateIP.IsValid() {
		priv += " and " + s.DualStackPrivateIP.String()
	}
	fmt.Fprintf(tw, "Role: %s, segment %s, private IP %s, endpoint %s\n", role, orDash(s.Segment), priv, orDash(s.Endpoint))
	dev := fmt.Sprintf("Device %s: %s, listen port %d, MTU %d, public key %s", s.Device.Interface, orDash(s.Device.Type), s.Device.ListenPort, s.Device.MTU, s.Device.PublicKey)
	if s.Device.Error != "" {
		dev += " (unreadable: " + s.Device.Error + ")"
	}
	fmt.Fprintln(tw, dev)
	last := "Last reconcile: " + orDash(formatTime(s.LastRun.At, s.At)) + fmt.Sprintf(" (%s)", s.LastRun.Duration.Round(time.Microsecond))
	if s.LastRun.Error != "" {
		last += ", failed: " + s.LastRun.Error
	} else if !s.LastRun.At.IsZero() {
		last += ", applied"
	}
	fmt.Fprintln(tw, last)
	if l := s.Leadership; l != nil {
		fmt.Fprintln(tw, leadershipLine(l))
	}
	for _, f := range s.FeaturesOff {
		fmt.Fprintf(tw, "Feature %s off: lacks %s (docs/dropin.md#grants)\n", f.Name, strings.Join(f.Missing, "; "))
	}

	if len(s.Peers) == 0 {
		fmt.Fprintln(tw, "\nNo WireGuard peers.")
	} else {
		fmt.Fprintln(tw, "\nPEER\tKIND\tCLUSTER\tENDPOINT (SOURCE)\tLEARNED\tKEEPALIVE (SOURCE)\tHANDSHAKE\tSTATE\tRX\tTX")
		for _, p := range s.Peers {
			ep := orDash(p.Endpoint)
			if p.EndpointSource != "" {
				ep += " (" + p.EndpointSource + ")"
			}
			ka := "off"
			if p.Keepalive > 0 {
				ka = fmt.Sprintf("%ds (%s)", p.Keepalive, p.KeepaliveSource)
			}
			state := p.State
			if p.Allowed > 0 {
				state += fmt.Sprintf(" (≤ %s)", p.Allowed.Round(time.Second))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Kind, orDash(p.Cluster), ep, orDash(p.Learned), ka,
				orDash(formatTime(p.LastHandshake, s.At)), state, byteSize(p.RxBytes), byteSize(p.TxBytes))
		}
	}
	if len(s.Remotes) > 0 {
		fmt.Fprintln(tw, "\nREMOTE CLUSTER\tMESH\tSYNCED\tREADY\tNODES\tPEERS\tLEADERS\tERROR")
		for _, r := range s.Remotes {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%v\t%d\t%d\t%s\t%s\n", r.Cluster, orDash(r.Mesh), r.Synced, r.Ready, r.Nodes, r.Peers,
				orDash(strings.Join(r.Leaders, ",")), orDash(r.Error))
		}
	}
	fmt.Fprintf(tw, "\nROUTES (%d) AND RULES (%d) MESHLET OWNS\n", len(s.Routes), len(s.Rules))
	WriteRoutes(tw, s.Routes, s.Rules)
	if len(s.Drift) > 0 {
		fmt.Fprintln(tw, "\nDRIFT (the host differs from the plan; the next reconcile restores it)")
		for _, d := range s.Drift {
			fmt.Fprintln(tw, "  "+d)
		}
	} else {
		fmt.Fprintln(tw, "\nNo drift: the host matches the plan.")
	}
	WriteRejections(tw, s.Rejections)
	if len(s.Findings) > 0 {
		fmt.Fprintln(tw, "\nFINDINGS (faults proven on this node; meshlet diagnose shows them too)")
		for _, f := range s.Findings {
			fmt.Fprintf(tw, "%s ", strings.ToUpper(string(f.Severity)))
			WriteFinding(tw, f)
		}
	}
	return tw.Flush()
}

// WriteFinding writes one named finding after its severity: what, the
// evidence, the fix and its runbook entry (`meshlet status`, `meshlet
// diagnose`).
func WriteFinding(w io.Writer, f diagnose.Finding) {
	fmt.Fprintf(w, "%s [%s]: %s\n", f.Subject, f.ID, f.Message)
	for _, e := range f.Evidence {
		fmt.Fprintf(w, "    evidence: %s\n", e)
	}
	fmt.Fprintf(w, "    → %s (%s)\n", f.Fix, f.Runbook)
}

// Agent is the peer as `meshlet diagnose` judges it.
func (p Peer) Agent() diagnose.AgentPeer {
	return diagnose.AgentPeer{Name: p.Name, Kind: p.Kind, Cluster: p.Cluster, Location: p.Location, State: p.State, LastHandshake: p.LastHandshake, Allowed: p.Allowed,
		Endpoint: p.Endpoint, Learned: p.Learned, Keepalive: p.Keepalive, RxBytes: p.RxBytes, TxBytes: p.TxBytes}
}

// leadershipLine says how the location's leader is chosen and this node's
// part in it.
func leadershipLine(l *Leadership) string {
	if !l.Governed {
		return "Leadership: Kilo's rule (" + l.Why + ")"
	}
	line := fmt.Sprintf("Leadership: Lease %s", l.Lease)
	switch {
	case l.Held:
		line += " held by this node"
	case l.Holder != "":
		line += " held by " + l.Holder
	default:
		line += " free"
	}
	if !l.Held && !l.TakesAt.IsZero() {
		line += ", this node takes it at " + l.TakesAt.UTC().Format(time.RFC3339)
	}
	if len(l.Candidates) > 0 {
		line += ", candidates " + strings.Join(l.Candidates, ",")
	}
	if l.Degraded != "" {
		line += ", this node degraded: " + l.Degraded
	}
	if l.StepAside != "" {
		line += ", stepping aside"
	}
	return line
}

// WriteRoutes writes routes and rules as tables (`meshlet status`,
// `meshlet plan -o text`).
func WriteRoutes(w io.Writer, routes []topology.Route, rules []topology.Rule) {
	fmt.Fprintln(w, "DESTINATION\tGATEWAY\tDEVICE\tSOURCE\tTABLE\tONLINK")
	for _, r := range routes {
		table := "main"
		if r.Table != 0 {
			table = strconv.Itoa(r.Table)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%v\n", r.Dst, addr(r.Gw), r.Dev, addr(r.Src), table, r.OnLink)
	}
	for _, r := range rules {
		rule := "rule:"
		if r.Iif != "" {
			rule += " iif " + r.Iif
		}
		if r.Src.IsValid() {
			rule += " from " + r.Src.String()
		}
		if r.Dst.IsValid() {
			rule += " to " + r.Dst.String()
		}
		fmt.Fprintf(w, "%s lookup %d\n", rule, r.Table)
	}
}

// WriteRejections writes the rejections, if any, as a table sorted by
// object.
func WriteRejections(w io.Writer, rejections []topology.Rejection) {
	if len(rejections) == 0 {
		return
	}
	fmt.Fprintln(w, "\nREJECTED\nOBJECT\tFIELD\tREASON\tMESSAGE")
	rs := append([]topology.Rejection(nil), rejections...)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Object.String() < rs[j].Object.String() })
	for _, r := range rs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", r.Object, orDash(r.Field), r.Reason, r.Message)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func prefix(p netip.Prefix) string {
	if !p.IsValid() {
		return "-"
	}
	return p.String()
}

func addr(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}

// formatTime is "never" for the zero time, else how long before now.
func formatTime(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
