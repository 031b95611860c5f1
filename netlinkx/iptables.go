package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// ChainNAT is meshlet's iptables chain (nat table, IPv4 and IPv6). It is
// owned entirely by meshlet; the only rules it touches outside it are the
// jumps into it.
const ChainNAT = "MESHLET-NAT"

// ChainForward is meshlet's chain in the filter table's FORWARD (kg's
// --iptables-forward-rules where Kilo is the CNI): it ACCEPTs the
// Firewall's Forward prefixes, to and from, ahead of a host's DROP rules.
const ChainForward = "MESHLET-FORWARD"

type family int

const (
	ipv4 family = 4
	ipv6 family = 6
)

func (f family) String() string { return fmt.Sprintf("IPv%d", int(f)) }

func (f family) has(p netip.Prefix) bool { return p.Addr().Is4() == (f == ipv4) }

// iptablesClient is the part of *iptables.IPTables meshlet uses.
type iptablesClient interface {
	List(table, chain string) ([]string, error)
	ChainExists(table, chain string) (bool, error)
	NewChain(table, chain string) error
	ClearAndDeleteChain(table, chain string) error
	Insert(table, chain string, pos int, rulespec ...string) error
	Append(table, chain string, rulespec ...string) error
	Delete(table, chain string, rulespec ...string) error
	DeleteById(table, chain string, id int) error
}

// Firewall is the desired iptables state.
type Firewall struct {
	NAT NAT
	// Forward are prefixes whose forwarded traffic is accepted, to and
	// from (ChainForward; none: no chain).
	Forward []netip.Prefix
}

// chainSpec is one meshlet chain and the jumps to it, in iptables -S form
// without the "-A CHAIN " prefix.
type chainSpec struct {
	table, chain, parent string
	rules                []string // empty = the chain must not exist
	jumps                []string // rules in parent jumping to chain
	// first: the jumps go first in parent (ahead of a host's DROP rules),
	// else last.
	first bool
}

// desiredChains renders a Firewall for one family. Pure.
func desiredChains(fw Firewall, f family) []chainSpec {
	nat := chainSpec{table: "nat", chain: ChainNAT, parent: "POSTROUTING"}
	for _, s := range fw.NAT.Sources {
		if f.has(s) {
			nat.jumps = append(nat.jumps, "-s "+s.Masked().String()+" -j "+ChainNAT)
		}
	}
	// Traffic to this location's allowed-location-ips (hosts that know no
	// mesh routes, e.g. an on-prem LAN) is masqueraded too, so their
	// replies come back — unless it comes from that network itself, which
	// needs no new source to be answered (as Cozystack's kg does; Kilo 0.7
	// masquerades it too: docs/kilo-compatibility.md#alip-nat). Written in
	// the order iptables -S prints it, which the chain's diff compares.
	for _, d := range fw.NAT.Destinations {
		if f.has(d) {
			nat.jumps = append(nat.jumps, "! -s "+d.Masked().String()+" -d "+d.Masked().String()+" -j "+ChainNAT)
		}
	}
	if len(nat.jumps) > 0 {
		for _, e := range fw.NAT.Exceptions {
			if f.has(e) {
				nat.rules = append(nat.rules, "-d "+e.Masked().String()+" -j RETURN")
			}
		}
		nat.rules = append(nat.rules, "-j MASQUERADE")
	}
	fwd := chainSpec{table: "filter", chain: ChainForward, parent: "FORWARD", first: true}
	for _, p := range fw.Forward {
		if f.has(p) {
			fwd.rules = append(fwd.rules, "-s "+p.Masked().String()+" -j ACCEPT", "-d "+p.Masked().String()+" -j ACCEPT")
		}
	}
	if len(fwd.rules) > 0 {
		fwd.jumps = []string{"-j " + ChainForward}
	}
	return []chainSpec{nat, fwd}
}

// chainOp is one edit of a chain: insert rule at 1-based position pos, or
// delete the rule at position pos.
type chainOp struct {
	insert bool
	pos    int
	rule   string
}

// planChain returns the edits that turn current into desired, keeping every
// rule that is already in place so the chain is never empty or half
// reordered in between (no packet goes un-masqueraded during a rewrite).
// Pure.
func planChain(current, desired []string) []chainOp {
	var ops []chainOp
	cur := slices.Clone(current)
	for i, r := range desired {
		// Drop rules at this position that are wanted nowhere further on
		// (a removed exception): they must go anyway.
		for i < len(cur) && cur[i] != r && !slices.Contains(desired[i:], cur[i]) {
			ops = append(ops, chainOp{pos: i + 1, rule: cur[i]})
			cur = slices.Delete(cur, i, i+1)
		}
		if i < len(cur) && cur[i] == r {
			continue
		}
		ops = append(ops, chainOp{insert: true, pos: i + 1, rule: r})
		cur = slices.Insert(cur, i, r)
	}
	for n := len(cur); n > len(desired); n-- {
		ops = append(ops, chainOp{pos: n, rule: cur[n-1]})
	}
	return ops
}

// parseChainList strips "-N"/"-P" lines and the "-A CHAIN " prefix from
// iptables -S output. A rule with neither match nor target is the bare
// line "-A CHAIN": it counts, or the positions of the rules after it
// would be off by one. A quoted argument (a comment) may hold a newline,
// which iptables prints as is: the next line continues the rule, and is
// not a rule of its own whatever it reads.
func parseChainList(lines []string, chain string) []string {
	var out []string
	prefix := "-A " + chain
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		for open := endsInQuote(l, false); open && i+1 < len(lines); open = endsInQuote(lines[i], open) {
			i++
			l += "\n" + lines[i]
		}
		if l == prefix {
			out = append(out, "")
		} else if rule, ok := strings.CutPrefix(l, prefix+" "); ok {
			out = append(out, strings.TrimSpace(rule))
		}
	}
	return out
}

// endsInQuote reports whether s, read from inside a quoted argument or
// not, ends inside one (splitRule's quoting).
func endsInQuote(s string, inQuote bool) bool {
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && inQuote && i+1 < len(s):
			i++
		case s[i] == '"':
			inQuote = !inQuote
		}
	}
	return inQuote
}

// FirewallReport says what EnsureFirewall changed.
type FirewallReport struct {
	Changes []string `json:"changes,omitempty"`
}

func (h *Host) iptables(f family) (iptablesClient, error) {
	h.iptMu.Lock()
	defer h.iptMu.Unlock()
	if c, ok := h.ipt[f]; ok {
		return c, nil
	}
	proto := iptables.ProtocolIPv4
	if f == ipv6 {
		proto = iptables.ProtocolIPv6
	}
	var c *iptables.IPTables
	err := h.do(func() error {
		var err error
		c, err = iptables.New(iptables.IPFamily(proto), iptables.Timeout(5))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlinkx: %s iptables: %w", f, err)
	}
	if h.ipt == nil {
		h.ipt = map[family]iptablesClient{}
	}
	// Every call must run inside the namespace: wrap the client.
	h.ipt[f] = nsIPTables{h: h, c: c}
	return h.ipt[f], nil
}

// EnsureFirewall reconciles meshlet's chains for IPv4 and IPv6.
//
// Each check reads what it must by forking iptables, a few milliseconds of
// CPU each and, at every periodic check (Options.Recheck), most of what an
// idle agent's children cost (docs/performance.md#idle). So it forks as
// little as the state allows: a wanted chain is listed without asking
// first whether it exists (a listing of a missing chain says so), and a
// chain that is not wanted and that an earlier check of this process found
// absent is not read again — only meshlet creates its chains, and a jump
// to a missing chain cannot exist — until it is wanted again or Cleanup
// runs (which reads everything).
func (h *Host) EnsureFirewall(ctx context.Context, fw Firewall) (FirewallReport, error) {
	var rep FirewallReport
	var errs []error
	for _, f := range []family{ipv4, ipv6} {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		var specs []chainSpec
		for _, cs := range desiredChains(fw, f) {
			if len(cs.rules) > 0 || !h.knownAbsent(f, cs) {
				specs = append(specs, cs)
			}
		}
		if len(specs) == 0 {
			continue
		}
		c, err := h.iptables(f)
		if err != nil {
			// A host without ip6tables (IPv6 disabled) is fine as long as
			// nothing is wanted for that family.
			if slices.ContainsFunc(specs, func(cs chainSpec) bool { return len(cs.rules) > 0 }) {
				errs = append(errs, err)
			} else {
				h.log.Debug("iptables unavailable, nothing wanted for this family", "family", f.String(), "error", err)
			}
			continue
		}
		for _, cs := range specs {
			changes, err := reconcileChain(c, cs)
			for _, ch := range changes {
				rep.Changes = append(rep.Changes, f.String()+" "+ch)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("netlinkx: %s %s/%s: %w", f, cs.table, cs.chain, err))
			}
			h.setAbsent(f, cs, err == nil && len(cs.rules) == 0)
		}
	}
	return rep, errors.Join(errs...)
}

// knownAbsent: an earlier check of this process left cs's chain absent
// (with no jump to it).
func (h *Host) knownAbsent(f family, cs chainSpec) bool {
	h.iptMu.Lock()
	defer h.iptMu.Unlock()
	return h.absent[absentKey(f, cs)]
}

func (h *Host) setAbsent(f family, cs chainSpec, absent bool) {
	h.iptMu.Lock()
	defer h.iptMu.Unlock()
	if !absent {
		delete(h.absent, absentKey(f, cs))
		return
	}
	if h.absent == nil {
		h.absent = map[string]bool{}
	}
	h.absent[absentKey(f, cs)] = true
}

// forgetAbsent makes the next check read every chain.
func (h *Host) forgetAbsent() {
	h.iptMu.Lock()
	defer h.iptMu.Unlock()
	h.absent = nil
}

func absentKey(f family, cs chainSpec) string { return f.String() + " " + cs.table + "/" + cs.chain }

// missingChain: iptables -S of a chain the table lacks exits with status 1
// (go-iptables' own ChainExists reads it so).
func missingChain(err error) bool {
	var e interface{ ExitStatus() int }
	return errors.As(err, &e) && e.ExitStatus() == 1
}

func reconcileChain(c iptablesClient, cs chainSpec) ([]string, error) {
	var changes []string
	exists := false // of a chain not wanted
	// Chain content before jumps: a new jump never lands in a chain that is
	// still being filled.
	if len(cs.rules) > 0 {
		lines, err := c.List(cs.table, cs.chain)
		switch {
		case err == nil:
		case missingChain(err):
			if err := c.NewChain(cs.table, cs.chain); err != nil {
				return nil, err
			}
			changes = append(changes, "created chain "+cs.table+"/"+cs.chain)
		default:
			return nil, err
		}
		for _, op := range planChain(parseChainList(lines, cs.chain), cs.rules) {
			if op.insert {
				err = c.Insert(cs.table, cs.chain, op.pos, strings.Fields(op.rule)...)
				changes = append(changes, fmt.Sprintf("%s: insert %d %q", cs.chain, op.pos, op.rule))
			} else {
				err = c.DeleteById(cs.table, cs.chain, op.pos)
				changes = append(changes, fmt.Sprintf("%s: delete %d %q", cs.chain, op.pos, op.rule))
			}
			if err != nil {
				return changes, err
			}
		}
	} else {
		var err error
		if exists, err = c.ChainExists(cs.table, cs.chain); err != nil {
			return nil, err
		}
	}
	// Jumps in the parent chain: remove stale ones, append missing ones.
	lines, err := c.List(cs.table, cs.parent)
	if err != nil {
		return changes, err
	}
	var haveJumps []string
	for _, r := range parseChainList(lines, cs.parent) {
		if strings.HasSuffix(r, "-j "+cs.chain) {
			haveJumps = append(haveJumps, r)
		}
	}
	seen := map[string]bool{}
	for _, r := range haveJumps {
		if slices.Contains(cs.jumps, r) && !seen[r] {
			seen[r] = true
			continue
		}
		// As iptables printed it: a jump of someone else's may quote a
		// comment with spaces or newlines (splitRule reads it as iptables
		// does).
		args, err := splitRule(r)
		if err != nil {
			return changes, fmt.Errorf("rule %q: %w", r, err)
		}
		if err := c.Delete(cs.table, cs.parent, args...); err != nil {
			return changes, err
		}
		changes = append(changes, fmt.Sprintf("%s: delete %q", cs.parent, r))
	}
	for _, r := range cs.jumps {
		if seen[r] {
			continue
		}
		if cs.first {
			err = c.Insert(cs.table, cs.parent, 1, strings.Fields(r)...)
		} else {
			err = c.Append(cs.table, cs.parent, strings.Fields(r)...)
		}
		if err != nil {
			return changes, err
		}
		changes = append(changes, fmt.Sprintf("%s: add %q", cs.parent, r))
	}
	if len(cs.rules) == 0 && exists {
		if err := c.ClearAndDeleteChain(cs.table, cs.chain); err != nil {
			return changes, err
		}
		changes = append(changes, "deleted chain "+cs.table+"/"+cs.chain)
	}
	return changes, nil
}

// nsIPTables runs every go-iptables call inside the Host's namespace.
type nsIPTables struct {
	h *Host
	c *iptables.IPTables
}

func (n nsIPTables) List(table, chain string) (out []string, err error) {
	err = n.h.do(func() error { out, err = n.c.List(table, chain); return err })
	return out, err
}

func (n nsIPTables) ChainExists(table, chain string) (ok bool, err error) {
	err = n.h.do(func() error { ok, err = n.c.ChainExists(table, chain); return err })
	return ok, err
}

func (n nsIPTables) NewChain(table, chain string) error {
	return n.h.do(func() error { return n.c.NewChain(table, chain) })
}

func (n nsIPTables) ClearAndDeleteChain(table, chain string) error {
	return n.h.do(func() error { return n.c.ClearAndDeleteChain(table, chain) })
}

func (n nsIPTables) Insert(table, chain string, pos int, rule ...string) error {
	return n.h.do(func() error { return n.c.Insert(table, chain, pos, rule...) })
}

func (n nsIPTables) Append(table, chain string, rule ...string) error {
	return n.h.do(func() error { return n.c.Append(table, chain, rule...) })
}

func (n nsIPTables) Delete(table, chain string, rule ...string) error {
	return n.h.do(func() error { return n.c.Delete(table, chain, rule...) })
}

func (n nsIPTables) DeleteById(table, chain string, id int) error {
	return n.h.do(func() error { return n.c.DeleteById(table, chain, id) })
}
