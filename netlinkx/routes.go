package netlinkx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kernelRoute is a route in comparable form: the fields meshlet sets.
type kernelRoute struct {
	Table     int // 254 = main
	Dst       netip.Prefix
	Gw        netip.Addr
	LinkIndex int
	Src       netip.Addr
	OnLink    bool
}

type routeKey struct {
	table int
	dst   netip.Prefix
}

func (r kernelRoute) key() routeKey { return routeKey{r.Table, r.Dst} }

func (r kernelRoute) String() string {
	s := r.Dst.String()
	if r.Gw.IsValid() {
		s += " via " + r.Gw.String()
	}
	s += fmt.Sprintf(" dev#%d", r.LinkIndex)
	if r.Src.IsValid() {
		s += " src " + r.Src.String()
	}
	if r.OnLink {
		s += " onlink"
	}
	return s + fmt.Sprintf(" table %d", r.Table)
}

// diffRoutes returns the routes to replace (missing or different) and the
// meshlet routes to delete (no longer desired). current must hold only
// meshlet's routes: a kg route to a desired destination is not in it, so the
// desired route is "missing" and RouteReplace adopts the kg route.
func diffRoutes(desired, current []kernelRoute) (replace, del []kernelRoute) {
	cur := make(map[routeKey]kernelRoute, len(current))
	for _, c := range current {
		cur[c.key()] = c
	}
	want := make(map[routeKey]bool, len(desired))
	for _, d := range desired {
		want[d.key()] = true
		if c, ok := cur[d.key()]; !ok || c != d {
			replace = append(replace, d)
		}
	}
	for _, c := range current {
		if !want[c.key()] {
			del = append(del, c)
		}
	}
	return replace, del
}

// RouteReport says what ReconcileRoutes changed.
type RouteReport struct {
	Replaced []string `json:"replaced,omitempty"`
	Deleted  []string `json:"deleted,omitempty"`
}

// kernelRoutes resolves the desired routes' devices. Routes whose device
// does not exist come back apart, with their error (noDevice): for Apply a
// failure, for Drift a difference.
func (h *Host) kernelRoutes(desired []Route) (want []kernelRoute, noDevice []routeError, errs []error) {
	links := map[string]int{}
	want = make([]kernelRoute, 0, len(desired))
	for _, r := range desired {
		s, err := h.routeSpec(r, links)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
			noDevice = append(noDevice, routeError{r, err})
		case err != nil:
			errs = append(errs, err)
		default:
			want = append(want, s)
		}
	}
	return want, noDevice, errs
}

type routeError struct {
	Route
	err error
}

// ReconcileRoutes makes meshlet's routes (all tables, IPv4 and IPv6) equal to
// desired. Errors for single routes are collected; the others still apply.
func (h *Host) ReconcileRoutes(ctx context.Context, desired []Route) (RouteReport, error) {
	var rep RouteReport
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	want, noDevice, errs := h.kernelRoutes(desired)
	for _, r := range noDevice {
		errs = append(errs, r.err)
	}
	current, err := h.ownRoutes()
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	replace, del := diffRoutes(want, current)
	// Delete first: a stale route to a destination that is now desired in
	// another table never conflicts, and freeing space first is harmless.
	for _, r := range del {
		if err := h.nl.RouteDel(toNetlinkRoute(r)); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("netlinkx: delete route %s: %w", r, err))
			continue
		}
		rep.Deleted = append(rep.Deleted, r.String())
	}
	for _, r := range replace {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		if err := h.nl.RouteReplace(toNetlinkRoute(r)); err != nil {
			errs = append(errs, fmt.Errorf("netlinkx: replace route %s: %w", r, err))
			continue
		}
		rep.Replaced = append(rep.Replaced, r.String())
	}
	return rep, errors.Join(errs...)
}

func (h *Host) routeSpec(r Route, links map[string]int) (kernelRoute, error) {
	s := kernelRoute{Table: r.Table, Dst: r.Dst.Masked(), Gw: r.Gw.Unmap(), Src: r.Src.Unmap(), OnLink: r.OnLink}
	if s.Table == 0 {
		s.Table = unix.RT_TABLE_MAIN
	}
	if !s.Dst.IsValid() {
		return s, fmt.Errorf("netlinkx: route without destination: %+v", r)
	}
	if r.Dev != "" {
		idx, ok := links[r.Dev]
		if !ok {
			l, err := h.nl.LinkByName(r.Dev)
			if err != nil {
				return s, fmt.Errorf("netlinkx: route %s: device %s: %w", r.Dst, r.Dev, err)
			}
			idx = l.Attrs().Index
			links[r.Dev] = idx
		}
		s.LinkIndex = idx
	}
	if s.LinkIndex == 0 && !s.Gw.IsValid() {
		return s, fmt.Errorf("netlinkx: route %s has neither device nor gateway", r.Dst)
	}
	return s, nil
}

// ownRoutes lists meshlet's routes in every table.
func (h *Host) ownRoutes() ([]kernelRoute, error) {
	rs, err := h.nl.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Protocol: Protocol, Table: unix.RT_TABLE_UNSPEC},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("netlinkx: list meshlet routes: %w", err)
	}
	out := make([]kernelRoute, 0, len(rs))
	for _, r := range rs {
		out = append(out, fromNetlinkRoute(r))
	}
	return out, nil
}

func fromNetlinkRoute(r netlink.Route) kernelRoute {
	s := kernelRoute{Table: r.Table, Gw: addrOf(r.Gw), LinkIndex: r.LinkIndex, Src: addrOf(r.Src), OnLink: r.Flags&unix.RTNH_F_ONLINK != 0}
	if p, ok := prefixOf(r.Dst); ok {
		s.Dst = p.Masked()
	} else if r.Family == unix.AF_INET6 {
		s.Dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	} else {
		s.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	return s
}

func toNetlinkRoute(s kernelRoute) *netlink.Route {
	r := &netlink.Route{
		Dst:       ipNet(s.Dst),
		Gw:        ipOf(s.Gw),
		Src:       ipOf(s.Src),
		LinkIndex: s.LinkIndex,
		Table:     s.Table,
		Protocol:  Protocol,
		Scope:     netlink.SCOPE_UNIVERSE,
	}
	if !s.Gw.IsValid() {
		r.Scope = netlink.SCOPE_LINK
	}
	if s.OnLink {
		r.Flags |= int(netlink.FLAG_ONLINK)
	}
	if s.Dst.Addr().Is6() {
		r.Family = unix.AF_INET6
	} else {
		r.Family = unix.AF_INET
	}
	return r
}

// kernelRule is a policy rule in comparable form.
type kernelRule struct {
	Family int // unix.AF_INET or AF_INET6
	Iif    string
	Src    netip.Prefix
	Dst    netip.Prefix
	Table  int
}

func (r kernelRule) String() string {
	s := "from " + "all"
	if r.Src.IsValid() {
		s = "from " + r.Src.String()
	}
	if r.Dst.IsValid() {
		s += " to " + r.Dst.String()
	}
	if r.Iif != "" {
		s += " iif " + r.Iif
	}
	return s + fmt.Sprintf(" lookup %d", r.Table)
}

// kernelRuleOf converts a plan rule. A rule with neither source nor
// destination is IPv4 (Kilo's rules are).
func kernelRuleOf(r Rule) kernelRule {
	s := kernelRule{Family: unix.AF_INET, Iif: r.Iif, Table: r.Table}
	if r.Src.IsValid() {
		s.Src = r.Src.Masked()
	}
	if r.Dst.IsValid() {
		s.Dst = r.Dst.Masked()
	}
	if s.Src.Addr().Is6() || s.Dst.Addr().Is6() {
		s.Family = unix.AF_INET6
	}
	if s.Table == 0 {
		s.Table = unix.RT_TABLE_MAIN
	}
	return s
}

// diffRules returns the rules to add and the meshlet rules to delete.
// Duplicates of a desired rule in current are deleted too, so the set ends
// up exact.
func diffRules(desired, current []kernelRule) (add, del []kernelRule) {
	have := map[kernelRule]int{}
	for _, c := range current {
		have[c]++
	}
	want := map[kernelRule]bool{}
	for _, d := range desired {
		if want[d] {
			continue
		}
		want[d] = true
		if have[d] == 0 {
			add = append(add, d)
		}
	}
	for _, c := range current {
		switch {
		case !want[c]:
			del = append(del, c)
		case have[c] > 1:
			have[c]--
			del = append(del, c)
		}
	}
	slices.SortStableFunc(del, func(a, b kernelRule) int { return cmp.Compare(a.String(), b.String()) })
	return add, del
}

// RuleReport says what ReconcileRules changed.
type RuleReport struct {
	Added   []string `json:"added,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
}

// ReconcileRules makes meshlet's policy rules equal to desired.
func (h *Host) ReconcileRules(ctx context.Context, desired []Rule) (RuleReport, error) {
	var rep RuleReport
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	want := make([]kernelRule, 0, len(desired))
	for _, r := range desired {
		want = append(want, kernelRuleOf(r))
	}
	current, err := h.ownRules()
	if err != nil {
		return rep, err
	}
	add, del := diffRules(want, current)
	var errs []error
	for _, r := range del {
		if err := h.nl.RuleDel(toNetlinkRule(r)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("netlinkx: delete rule %s: %w", r, err))
			continue
		}
		rep.Deleted = append(rep.Deleted, r.String())
	}
	for _, r := range add {
		if err := h.nl.RuleAdd(toNetlinkRule(r)); err != nil {
			errs = append(errs, fmt.Errorf("netlinkx: add rule %s: %w", r, err))
			continue
		}
		rep.Added = append(rep.Added, r.String())
	}
	return rep, errors.Join(errs...)
}

func (h *Host) ownRules() ([]kernelRule, error) {
	rules, err := h.nl.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("netlinkx: list rules: %w", err)
	}
	var out []kernelRule
	for _, r := range rules {
		if r.Protocol != uint8(Protocol) {
			continue
		}
		s := kernelRule{Family: r.Family, Iif: r.IifName, Table: r.Table}
		if p, ok := prefixOf(r.Src); ok {
			s.Src = p.Masked()
		}
		if p, ok := prefixOf(r.Dst); ok {
			s.Dst = p.Masked()
		}
		out = append(out, s)
	}
	return out, nil
}

func toNetlinkRule(s kernelRule) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = s.Family
	r.Table = s.Table
	r.IifName = s.Iif
	r.Protocol = uint8(Protocol)
	if s.Src.IsValid() {
		r.Src = ipNet(s.Src)
	}
	if s.Dst.IsValid() {
		r.Dst = ipNet(s.Dst)
	}
	return r
}
