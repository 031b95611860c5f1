package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// What Kilo's kg leaves in iptables when it stops without cleaning up
// (--clean-up=false, or SIGKILL): chains named KILO-* (KILO-NAT in nat;
// KILO-IPIP and KILO-DROP in filter) and the jumps to them from the
// built-in chains (POSTROUTING, INPUT), one per pod subnet with kg's
// default --cni=true. meshlet's MESHLET-NAT replaces KILO-NAT; kg's copy
// would otherwise keep masquerading by a topology nobody maintains.
// kg's --cni=true FORWARD rules that accept the node's pod subnet
// ("Kilo: forward packets from/to the pod subnet") are not jumps and are
// left: they are what a CNI set up by kg needs on a host whose FORWARD
// policy is DROP, and meshlet is never the CNI (docs/migration.md).
const kiloChainPrefix = "KILO-"

// kiloTunnels are the tunnel devices kg routes through besides its
// WireGuard interface: its IPIP device, Cilium's, flannel's VXLAN device.
var kiloTunnels = []string{"tunl0", "cilium_tunl", "flannel.1"}

// kiloReturnTable is Kilo's table for return traffic through the tunnel.
const kiloReturnTable = 1107

// kgLinks are the indexes of the links kg routes through (see
// kiloTunnels), those that exist.
func (h *Host) kgLinks(wgLink string) map[int]bool {
	out := map[int]bool{}
	for _, name := range append([]string{wgLink}, kiloTunnels...) {
		if name == "" {
			continue
		}
		if l, err := h.nl.LinkByName(name); err == nil {
			out[l.Attrs().Index] = true
		}
	}
	return out
}

// kgRoute tells a route as kg writes it (Kilo's pkg/mesh routes, all with
// protocol static): through its WireGuard interface or a tunnel device, in
// its return table, or on-link through the private interface to a
// leader. meshlet takes such a route over at the switch (RouteReplace to
// the same destination); any other route is the host's and is left alone.
func kgRoute(r netlink.Route, kgLinks map[int]bool) bool {
	if r.Protocol != unix.RTPROT_STATIC {
		return false
	}
	return r.Table == kiloReturnTable || kgLinks[r.LinkIndex] || r.Flags&unix.RTNH_F_ONLINK != 0
}

// kiloTables are the tables kg writes to.
var kiloTables = []string{"nat", "filter", "mangle"}

// kiloLister is what CleanupKilo needs beyond iptablesClient.
type kiloLister interface {
	iptablesClient
	ListChains(table string) ([]string, error)
	ClearChain(table, chain string) error
	DeleteChain(table, chain string) error
}

// KiloReport says what CleanupKilo removed.
type KiloReport struct {
	Removed []string `json:"removed,omitempty"`
}

// CleanupKilo removes what kg left in iptables (see kiloChainPrefix) for
// IPv4 and IPv6, and nothing else: rules in other chains are deleted only
// when they jump to a KILO-* chain. Call it
// once meshlet's own chains are in place, so that nothing goes
// un-masqueraded in between.
func (h *Host) CleanupKilo(ctx context.Context) (KiloReport, error) {
	var rep KiloReport
	var errs []error
	for _, f := range []family{ipv4, ipv6} {
		c, err := h.iptables(f)
		if err != nil {
			continue // no ip6tables: nothing kg could have left there either
		}
		kc, ok := c.(kiloLister)
		if !ok {
			return rep, errors.New("netlinkx: iptables client cannot list chains")
		}
		for _, table := range kiloTables {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			removed, err := cleanupKiloTable(kc, table)
			for _, r := range removed {
				rep.Removed = append(rep.Removed, f.String()+" "+table+" "+r)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("netlinkx: %s %s: %w", f, table, err))
			}
		}
	}
	return rep, errors.Join(errs...)
}

func cleanupKiloTable(c kiloLister, table string) ([]string, error) {
	chains, err := c.ListChains(table)
	if err != nil {
		// A table the kernel does not have (no module): nothing in it.
		return nil, nil
	}
	var removed []string
	var kilo []string
	for _, ch := range chains {
		if strings.HasPrefix(ch, kiloChainPrefix) {
			kilo = append(kilo, ch)
		}
	}
	// Jumps first, in every other chain.
	for _, ch := range chains {
		if strings.HasPrefix(ch, kiloChainPrefix) {
			continue
		}
		lines, err := c.List(table, ch)
		if err != nil {
			return removed, err
		}
		for _, r := range parseChainList(lines, ch) {
			args, err := splitRule(r)
			if err != nil {
				return removed, fmt.Errorf("rule %q: %w", r, err)
			}
			if !isKiloRule(args) {
				continue
			}
			if err := c.Delete(table, ch, args...); err != nil {
				return removed, fmt.Errorf("deleting %q from %s: %w", r, ch, err)
			}
			removed = append(removed, fmt.Sprintf("%s: %s", ch, r))
		}
	}
	// Then the chains: all flushed before any is deleted, as they may
	// jump to each other (KILO-IPIP to KILO-DROP).
	for _, ch := range kilo {
		if err := c.ClearChain(table, ch); err != nil {
			return removed, err
		}
	}
	for _, ch := range kilo {
		if err := c.DeleteChain(table, ch); err != nil {
			return removed, err
		}
		removed = append(removed, "chain "+ch)
	}
	return removed, nil
}

// isKiloRule: a jump or goto to a KILO-* chain.
func isKiloRule(args []string) bool {
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-j", "-g", "--jump", "--goto":
			if strings.HasPrefix(args[i+1], kiloChainPrefix) {
				return true
			}
		}
	}
	return false
}

// splitRule splits a rule of iptables -S output into arguments, undoing
// its quoting: "..." around arguments with spaces, \" and \\ inside.
func splitRule(s string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\\' && inQuote && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case ch == '"':
			inQuote = !inQuote
			have = true
		case ch == ' ' && !inQuote:
			if have || cur.Len() > 0 {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(ch)
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quote")
	}
	if have || cur.Len() > 0 {
		args = append(args, cur.String())
	}
	return slices.Clip(args), nil
}

func (n nsIPTables) ListChains(table string) (out []string, err error) {
	err = n.h.do(func() error { out, err = n.c.ListChains(table); return err })
	return out, err
}

func (n nsIPTables) ClearChain(table, chain string) error {
	return n.h.do(func() error { return n.c.ClearChain(table, chain) })
}

func (n nsIPTables) DeleteChain(table, chain string) error {
	return n.h.do(func() error { return n.c.DeleteChain(table, chain) })
}
