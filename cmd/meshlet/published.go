package main

import (
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/config"
)

// publishedSettings sets the topology flags not given on the command line
// from what the agents publish in Kilo's own annotations, where every node
// that publishes it agrees: --subnet from the leaders' wireguard-ip (the
// mesh subnet's mask rides with each address), --mesh-granularity from the
// granularity annotation, --port from the endpoints' port. kg publishes the
// same, so this holds for kg's nodes too; --dual-stack-subnet comes from
// meshlet's leaders' dual-stack-wireguard-ip. It is what diagnose, graph and plan
// fall back to without a DaemonSet to read (a cluster of the demo, a dump):
// the agents' settings, not meshlet's defaults. It returns the flags it set,
// as "--flag=value".
func publishedSettings(fs *pflag.FlagSet, cfg *config.Config, nodes []*corev1.Node) []string {
	subnets, dualStack, granularities, ports := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, n := range nodes {
		a := n.Annotations
		if p, err := netip.ParsePrefix(strings.TrimSpace(a[topology.AnnotationWireGuardIP])); err == nil {
			subnets[p.Masked().String()] = true
		}
		if p, err := netip.ParsePrefix(strings.TrimSpace(a[topology.AnnotationDualStackWireGuardIP])); err == nil {
			dualStack[p.Masked().String()] = true
		}
		if g := strings.TrimSpace(a[topology.AnnotationGranularity]); g != "" {
			granularities[g] = true
		}
		if _, port, err := net.SplitHostPort(strings.TrimSpace(a[topology.AnnotationEndpoint])); err == nil {
			ports[port] = true
		}
	}
	var set []string
	one := func(flag string, values map[string]bool, assign func(string) bool) {
		if fs.Changed(flag) || len(values) != 1 {
			return
		}
		for v := range values {
			if assign(v) {
				set = append(set, "--"+flag+"="+v)
			}
		}
	}
	one("subnet", subnets, func(v string) bool { cfg.Subnet = v; return true })
	one("dual-stack-subnet", dualStack, func(v string) bool { cfg.DualStackSubnet = v; return true })
	one("mesh-granularity", granularities, func(v string) bool { cfg.Granularity = v; return true })
	one("port", ports, func(v string) bool {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return false
		}
		cfg.Port = p
		return true
	})
	sort.Strings(set)
	return set
}
