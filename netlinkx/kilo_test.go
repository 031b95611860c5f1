package netlinkx

import (
	"context"
	"reflect"
	"strings"
	"testing"
)

func TestSplitRule(t *testing.T) {
	for in, want := range map[string][]string{
		`-s 10.244.1.0/24 -m comment --comment "Kilo: jump to KILO-NAT chain" -j KILO-NAT`: {"-s", "10.244.1.0/24", "-m", "comment", "--comment", "Kilo: jump to KILO-NAT chain", "-j", "KILO-NAT"},
		`-m comment --comment "a \"quoted\" word" -j ACCEPT`:                               {"-m", "comment", "--comment", `a "quoted" word`, "-j", "ACCEPT"},
		`-m comment --comment "" -j RETURN`:                                                {"-m", "comment", "--comment", "", "-j", "RETURN"},
		`-j MASQUERADE`:                                                                    {"-j", "MASQUERADE"},
	} {
		got, err := splitRule(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("splitRule(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := splitRule(`--comment "open`); err == nil {
		t.Error("unterminated quote accepted")
	}
}

func TestIsKiloRule(t *testing.T) {
	for rule, want := range map[string]bool{
		`-s 10.244.1.0/24 -m comment --comment "Kilo: jump to KILO-NAT chain" -j KILO-NAT`: true,
		`-p ipencap -j KILO-IPIP`: true,
		// kg's --cni=true FORWARD rule: not a jump, left in place.
		`-s 10.244.1.0/24 -m comment --comment "Kilo: forward packets from the pod subnet" -j ACCEPT`: false,
		`-m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`:                     false,
		`-s 10.2.0.0/24 -j MESHLET-NAT`:                        false,
		`-m comment --comment "not Kilo: something" -j ACCEPT`: false,
	} {
		args, err := splitRule(rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := isKiloRule(args); got != want {
			t.Errorf("isKiloRule(%q) = %v, want %v", rule, got, want)
		}
	}
}

// kgLeftovers are the rules kg leaves on a leader when it stops without
// cleaning up, with its default --cni=true (the FORWARD rules), in iptables
// commands.
var kgLeftovers = [][]string{
	{"-t", "nat", "-N", "KILO-NAT"},
	{"-t", "nat", "-A", "KILO-NAT", "-d", "10.4.0.0/16", "-m", "comment", "--comment", "Kilo: do not NAT packets destined for WireGuared IPs", "-j", "RETURN"},
	{"-t", "nat", "-A", "KILO-NAT", "-m", "comment", "--comment", "Kilo: NAT remaining packets", "-j", "MASQUERADE"},
	{"-t", "nat", "-A", "POSTROUTING", "-s", "10.244.1.0/24", "-m", "comment", "--comment", "Kilo: jump to KILO-NAT chain", "-j", "KILO-NAT"},
	{"-t", "filter", "-N", "KILO-IPIP"},
	{"-t", "filter", "-N", "KILO-DROP"},
	{"-t", "filter", "-A", "KILO-DROP", "-m", "comment", "--comment", "Kilo: reject other IPIP traffic", "-j", "DROP"},
	{"-t", "filter", "-A", "KILO-IPIP", "-s", "192.168.50.2/32", "-m", "comment", "--comment", "Kilo: allow IPIP traffic", "-j", "ACCEPT"},
	{"-t", "filter", "-A", "KILO-IPIP", "-j", "KILO-DROP"},
	{"-t", "filter", "-A", "INPUT", "-p", "4", "-m", "comment", "--comment", "Kilo: jump to IPIP chain", "-j", "KILO-IPIP"},
	{"-t", "filter", "-A", "FORWARD", "-s", "10.244.1.0/24", "-m", "comment", "--comment", "Kilo: forward packets from the pod subnet", "-j", "ACCEPT"},
	{"-t", "filter", "-A", "FORWARD", "-d", "10.244.1.0/24", "-m", "comment", "--comment", "Kilo: forward packets to the pod subnet", "-j", "ACCEPT"},
}

// Someone else's rules in the same chains, which must stay.
var foreignRules = [][]string{
	{"-t", "nat", "-N", "KUBE-POSTROUTING"},
	{"-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING"},
	{"-t", "filter", "-A", "FORWARD", "-s", "10.9.0.0/16", "-m", "comment", "--comment", "cni: keep", "-j", "ACCEPT"},
}

func TestCleanupKilo(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	ctx := context.Background()
	for _, r := range append(append([][]string{}, kgLeftovers...), foreignRules...) {
		ns.exec(t, append([]string{"iptables", "-w"}, r...)...)
	}
	// kg writes the same for IPv6 (ip6tables), with v6 prefixes.
	ns.exec(t, "ip6tables", "-w", "-t", "nat", "-N", "KILO-NAT")
	ns.exec(t, "ip6tables", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", "fd00:244:1::/64", "-m", "comment", "--comment", "Kilo: jump to KILO-NAT chain", "-j", "KILO-NAT")
	// meshlet's own chains are in place first (the agent calls CleanupKilo
	// after its first reconcile).
	spec := leaderSpec()
	if _, err := ns.host.Apply(ctx, spec); err != nil {
		t.Fatal(err)
	}
	before4 := ns.exec(t, "iptables-save")

	rep, err := ns.host.CleanupKilo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removed: %s", strings.Join(rep.Removed, "; "))
	after := ns.exec(t, "iptables-save") + ns.exec(t, "ip6tables-save")
	if strings.Contains(after, "KILO-") {
		t.Errorf("kg's chains or jumps left:\n%s", after)
	}
	for _, keep := range []string{"-j KUBE-POSTROUTING", `--comment "cni: keep"`, "-j MESHLET-NAT",
		// kg's --cni=true FORWARD rules stay (a CNI kg set up needs them).
		`--comment "Kilo: forward packets from the pod subnet" -j ACCEPT`, `--comment "Kilo: forward packets to the pod subnet" -j ACCEPT`} {
		if !strings.Contains(after, keep) {
			t.Errorf("%q removed (before: %s)\nafter:\n%s", keep, before4, after)
		}
	}
	if len(rep.Removed) != 7 {
		t.Errorf("removed %d items, want 7 (IPv4: 3 chains + 2 jumps; IPv6: 1 chain + 1 jump): %v", len(rep.Removed), rep.Removed)
	}
	// Idempotent: nothing more the second time.
	rep, err = ns.host.CleanupKilo(ctx)
	if err != nil || len(rep.Removed) != 0 {
		t.Errorf("second CleanupKilo: %v, %v", rep.Removed, err)
	}
}
