package metrics

import (
	"strings"

	"github.com/meshlet/meshlet/netlinkx"
)

// kg's protocol label values (Kilo's pkg/iptables registers one counter per
// client, IPv4 and IPv6); netlinkx names its families the same way.
const (
	protoIPv4 = "IPv4"
	protoIPv6 = "IPv6"
)

// chainTables are the tables of the chains meshlet writes (netlinkx's
// desiredChains): its own two and the built-in chains that jump to them.
var chainTables = map[string]string{
	netlinkx.ChainNAT: "nat", "POSTROUTING": "nat",
	netlinkx.ChainForward: "filter", "FORWARD": "filter",
}

// iptablesOp is one call of kg's iptables client: its operation, table and
// chain labels and its protocol.
type iptablesOp struct {
	proto, operation, table, chain string
}

// IPTablesChanges counts the changes the host actuator made to iptables
// (netlinkx.FirewallReport.Changes, one line per change) as kg's
// kilo_iptables_operations_total counts the calls of its client: by kg's
// operation names, table and chain, per protocol. Only writes are counted:
// kg also counts its reads (List, ListChains, Exists at every resync), which
// meshlet does not (docs/metrics.md#kilo). A line of another form is
// ignored.
func (k *Kilo) IPTablesChanges(changes []string) {
	for _, c := range changes {
		for _, op := range kgIPTablesOps(c) {
			k.iptables[op.proto].WithLabelValues(op.operation, op.table, op.chain).Inc()
		}
	}
}

// kgIPTablesOps maps one line of netlinkx's firewall report ("IPv4 created
// chain nat/MESHLET-NAT", "IPv4 MESHLET-NAT: insert 1 \"-j MASQUERADE\"",
// "IPv6 POSTROUTING: add \"…\"", "IPv4 FORWARD: delete \"…\"", "IPv4
// deleted chain filter/MESHLET-FORWARD") to the calls kg's client would
// count for it.
func kgIPTablesOps(line string) []iptablesOp {
	proto, rest, ok := strings.Cut(line, " ")
	if !ok || (proto != protoIPv4 && proto != protoIPv6) {
		return nil
	}
	for verb, ops := range map[string][]string{"created chain ": {"NewChain"}, "deleted chain ": {"ClearChain", "DeleteChain"}} {
		if tc, ok := strings.CutPrefix(rest, verb); ok {
			table, chain, ok := strings.Cut(tc, "/")
			if !ok || table == "" || chain == "" {
				return nil
			}
			var out []iptablesOp
			for _, o := range ops {
				out = append(out, iptablesOp{proto, o, table, chain})
			}
			return out
		}
	}
	chain, edit, ok := strings.Cut(rest, ": ")
	table := chainTables[chain]
	if !ok || table == "" {
		return nil
	}
	verb, _, _ := strings.Cut(edit, " ")
	var operation string
	switch verb {
	case "insert":
		operation = "InsertUnique"
	case "delete":
		operation = "Delete"
	case "add":
		// A jump added to a built-in chain: appended to POSTROUTING,
		// inserted first in FORWARD (ahead of a host's DROP rules).
		operation = "AppendUnique"
		if chain == "FORWARD" {
			operation = "InsertUnique"
		}
	default:
		return nil
	}
	return []iptablesOp{{proto, operation, table, chain}}
}
