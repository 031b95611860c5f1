package planner

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// randomInput is a seeded generator of planner inputs that reach every
// stage: locations of one or several nodes with and without private IPs,
// public, private and DNS endpoints, leader annotations and meshlet's
// marks, stale nodes, allowed-location-ips that overlap, Peers that clash,
// remote clusters with leaders inside and outside their networks, every
// granularity, encapsulation and CNI mode, a Lease in any state and health
// probes. It is the input of TestRandomInputs, and of the differential
// check a refactoring of the planner is held to (MESHLET_PLAN_DUMP).
func randomInput(seed uint64) (topology.Snapshot, topology.Self) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	pick := func(n int) int { return r.IntN(n) }
	chance := func(p float64) bool { return r.Float64() < p }
	set := topology.Settings{
		Granularity:   []topology.Granularity{topology.GranularityLocation, topology.GranularityLocation, topology.GranularityFull, topology.GranularityCross}[pick(4)],
		Subnet:        pfx([]string{"10.4.0.0/16", "100.66.0.0/24", "10.4.0.0/30"}[pick(3)]),
		Encapsulate:   []topology.Encapsulate{topology.EncapsulateAlways, topology.EncapsulateCrossSubnet, topology.EncapsulateNever}[pick(3)],
		Local:         chance(0.6),
		Compatibility: []topology.Compatibility{topology.CompatibilityNone, topology.CompatibilityCilium}[pick(2)],
		HealthProbes:  chance(0.5),
	}
	if chance(0.3) {
		set.ServiceCIDRs = pfxs("10.96.0.0/12")
	}
	if chance(0.2) {
		set.ClusterName = "local"
	}
	if chance(0.2) {
		set.MTU = 1380
	}
	locs := []string{"a", "b", "c"}[:1+pick(3)]
	nNodes := 1 + pick(7)
	snap := topology.Snapshot{Now: now, Settings: set}
	endpoint := func(i int, priv string) string {
		switch pick(5) {
		case 0:
			return fmt.Sprintf("203.0.113.%d:51820", i+1)
		case 1:
			return fmt.Sprintf("node-%d.example.com:51820", i)
		case 2:
			return ""
		}
		if priv != "" {
			return netip.MustParsePrefix(priv).Addr().String() + ":51820"
		}
		return fmt.Sprintf("192.168.99.%d:51820", i+1)
	}
	for i := 0; i < nNodes; i++ {
		loc := locs[pick(len(locs))]
		priv := ""
		if chance(0.85) {
			priv = fmt.Sprintf("10.0.%d.%d/24", loc[0]-'a'+1, i+1)
		}
		n := node(i+1, fmt.Sprintf("n-%d", i), loc, priv, endpoint(i, priv), fmt.Sprintf("10.244.%d.0/24", i))
		switch pick(10) {
		case 0:
			n.LastSeen = now.Add(-2 * time.Minute) // stale
		case 1:
			n.PodCIDRs = nil
		case 2:
			n.LocationAnnotation, n.Labels = "", map[string]string{"topology.kubernetes.io/region": loc}
		}
		n.Leader = chance(0.15)
		n.LeaderMark = n.Leader && chance(0.5)
		if chance(0.8) {
			n.MeshletVersion = "v1"
		}
		if chance(0.3) {
			n.PersistentKeepalive = []int{5, 25}[pick(2)]
		}
		if chance(0.15) {
			n.AllowedLocationIPs = pfxs([]string{"192.168.50.0/24", "192.168.50.0/25", "10.244.1.7/32", "10.2.5.0/24"}[pick(4)])
		}
		if chance(0.3) {
			n.DiscoveredEndpoints = map[topology.Key]netip.AddrPort{key(1 + pick(nNodes)): netip.MustParseAddrPort(fmt.Sprintf("198.51.100.%d:4000", i+1))}
		}
		if chance(0.1) {
			n.ForceEndpoint = fmt.Sprintf("198.18.0.%d:51820", i+1)
		}
		if chance(0.3) {
			n.WireGuardIP = pfx(fmt.Sprintf("10.4.0.%d/16", 1+pick(3)))
		}
		n.Tunnels = []string{"", topology.TunnelsUp, topology.TunnelsDown}[pick(3)]
		if chance(0.1) {
			n.Degraded = failover.ReasonWireGuardDegraded
		}
		if chance(0.2) {
			n.CNICompatibilityIP = pfx(fmt.Sprintf("10.244.%d.1/32", i))
		}
		snap.Nodes = append(snap.Nodes, n)
	}
	for i := 0; i < pick(4); i++ {
		p := topology.Peer{Name: fmt.Sprintf("peer-%d", i), PublicKey: key(100 + i), AllowedIPs: pfxs(fmt.Sprintf("10.5.%d.0/24", i))}
		switch pick(6) {
		case 0:
			p.AllowedIPs = append(p.AllowedIPs, pfx("10.244.0.0/24")) // a node's pod CIDR
		case 1:
			p.PublicKey = key(1) // a node's key
		case 2:
			p.AllowedIPs = pfxs("10.5.0.0/24") // clashes with peer-0
		}
		if chance(0.5) {
			p.Endpoint = fmt.Sprintf("198.51.100.%d:51820", 50+i)
		}
		if chance(0.4) {
			p.PersistentKeepalive = 25
		}
		if chance(0.2) {
			p.NodeKeepalive = []topology.KeepaliveRule{{Value: 7, Location: locs[0]}}
		}
		snap.Peers = append(snap.Peers, p)
	}
	if chance(0.6) {
		mesh := topology.Mesh{Namespace: "kilo-system", Name: "mesh", Clusters: []topology.MeshCluster{
			{Name: "local", Local: true, AllowedNetworks: pfxs("10.244.0.0/16", "10.4.0.0/16"), PersistentKeepalive: []int{0, 25}[pick(2)]}}}
		for c := 0; c < 1+pick(2); c++ {
			name := fmt.Sprintf("remote-%d", c)
			nets := pfxs(fmt.Sprintf("10.%d.0.0/16", 10+c), fmt.Sprintf("100.%d.0.0/24", 70+c))
			if chance(0.1) {
				nets = append(nets, pfx("10.244.5.0/24")) // overlaps the local cluster
			}
			mesh.Clusters = append(mesh.Clusters, topology.MeshCluster{Name: name, AllowedNetworks: nets, WireGuardPort: 51820, PersistentKeepalive: []int{0, 10}[pick(2)]})
			if chance(0.2) {
				continue // declared, not watched yet
			}
			rc := topology.RemoteCluster{Name: name, Synced: chance(0.85)}
			if chance(0.2) {
				rc.ObservedAt = now.Add(-30 * time.Second)
			}
			for j := 0; j < 1+pick(4); j++ {
				rn := topology.Node{Name: fmt.Sprintf("r%d-%d", c, j), LocationAnnotation: []string{"x", "y"}[pick(2)], PublicKey: key(200 + 10*c + j),
					PodCIDRs: pfxs(fmt.Sprintf("10.%d.%d.0/24", 10+c, j)), LastSeen: now.Add(-time.Duration(pick(90)) * time.Second),
					Endpoint: fmt.Sprintf("192.0.2.%d:51820", 10*c+j+1), InternalIP: pfx(fmt.Sprintf("172.16.%d.%d/24", c, j+1))}
				if chance(0.6) {
					rn.WireGuardIP = pfx(fmt.Sprintf("100.%d.0.%d/24", 70+c, 1+pick(2)))
					if chance(0.1) {
						rn.WireGuardIP = pfx("100.99.0.1/24") // outside its networks
					}
				}
				if chance(0.3) {
					rn.MeshletVersion = "v1"
				}
				if chance(0.2) {
					rn.ClusterMeshEndpoint = fmt.Sprintf("198.51.100.%d:51820", 100+j)
				}
				if chance(0.1) {
					rn.MalformedEndpoint = true
				}
				if chance(0.3) {
					rn.Heard, rn.HeardChange = now.Add(-time.Duration(pick(80))*time.Second), chance(0.5)
				}
				rc.Nodes = append(rc.Nodes, rn)
			}
			if chance(0.3) {
				rc.Peers = []topology.Peer{{Name: "laptop", PublicKey: key(250 + c), AllowedIPs: pfxs(fmt.Sprintf("10.%d.200.0/24", 10+c), "0.0.0.0/0")}}
			}
			snap.Remotes = append(snap.Remotes, rc)
		}
		snap.Meshes = []topology.Mesh{mesh}
	}
	selfIdx := pick(nNodes)
	sn := snap.Nodes[selfIdx]
	self := selfOf(sn, "eth0")
	self.Version = "v1"
	if chance(0.2) {
		self.CiliumHostIP = pfx(fmt.Sprintf("10.244.%d.1/32", selfIdx))
	}
	self.TunnelDevice = []string{"", topology.TunnelIPIP, topology.TunnelCilium}[pick(3)]
	if chance(0.5) {
		self.DefaultGateway = addr("10.0.1.254")
	}
	for k := 1; k <= nNodes; k++ {
		if chance(0.3) {
			self.Device = append(self.Device, topology.DevicePeer{PublicKey: key(k), Endpoint: netip.MustParseAddrPort(fmt.Sprintf("198.51.100.%d:5000", k)), Handshake: chance(0.8)})
		}
	}
	if chance(0.2) {
		self.Device = append(self.Device, topology.DevicePeer{PublicKey: key(240), AllowedIPs: pfxs("10.10.9.0/24"), PersistentKeepalive: 10})
	}
	if chance(0.5) {
		holder := []string{"", sn.Name, snap.Nodes[pick(nNodes)].Name}[pick(3)]
		snap.Lease = &topology.LeaseState{Name: failover.LeaseName(topology.NodeLocation(sn, set)), Exists: chance(0.8), Holder: holder,
			Duration: 3 * time.Second, Fresh: now.Add(-time.Duration(pick(6)) * time.Second)}
		if chance(0.2) {
			snap.Lease.StepAsides = map[string]topology.StepAside{snap.Nodes[pick(nNodes)].Name: {Reason: failover.ReasonWireGuardDegraded, At: now.Add(-time.Minute)}}
		}
	}
	if chance(0.4) {
		h := &topology.Health{}
		for k := 1; k <= 2; k++ {
			t := topology.TunnelProbe{PublicKey: key(k), Since: now.Add(-10 * time.Second)}
			if chance(0.5) {
				t.Answered = now.Add(-time.Duration(pick(8)) * time.Second)
			}
			h.Peers = append(h.Peers, t)
		}
		if chance(0.5) {
			h.Gateway = topology.GatewayProbe{Addr: addr("10.0.1.254"), Since: now.Add(-time.Minute), Answered: now.Add(-time.Duration(pick(10)) * time.Second)}
		}
		self.Health = h
	}
	// Drawn last, so the inputs above stay what they were before these
	// modes existed.
	if chance(0.1) {
		snap.Settings.Compatibility = topology.CompatibilityFlannel
	}
	if chance(0.15) {
		snap.Settings.CNI, snap.Settings.ForwardRules = true, chance(0.5)
	}
	snap.Settings.PrivateEndpoint = chance(0.1)
	if chance(0.1) {
		forced := &snap.Nodes[selfIdx]
		forced.InternalIPForced = true
		forced.InternalIP = []netip.Prefix{{}, pfx("10.0.9.9/24")}[pick(2)]
	}
	return snap, self
}

// TestRandomInputs: on every generated input the planner is deterministic
// and its output well formed. With MESHLET_PLAN_DUMP=DIR it also writes
// every plan as JSON, one file per seed, so a refactoring of the planner
// can be compared with the code before it: dump with both, diff -r.
func TestRandomInputs(t *testing.T) {
	dump := os.Getenv("MESHLET_PLAN_DUMP")
	n := 2000
	if testing.Short() {
		n = 200
	}
	for seed := uint64(0); seed < uint64(n); seed++ {
		snap, self := randomInput(seed)
		a, b := Compute(snap, self), Compute(snap, self)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: not deterministic", seed)
		}
		if a.Node != self.Name || a.WireGuard.Peers == nil || a.Routes == nil || a.Rejections == nil {
			t.Fatalf("seed %d: malformed plan %+v", seed, a)
		}
		if dump == "" {
			continue
		}
		out, err := json.MarshalIndent(a, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dump, fmt.Sprintf("%04d.json", seed)), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
