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

// RouteReport says what ReconcileRoutes changed, and which desired routes
// it left out because the host routes their destination (Conflicts: the
// host's route, as `ip route` would show it).
type RouteReport struct {
	Replaced  []string `json:"replaced,omitempty"`
	Deleted   []string `json:"deleted,omitempty"`
	Conflicts []string `json:"conflicts,omitempty"`
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
// desired. It replaces only its own routes and kg's (kgRoute: taken over at
// the switch); a desired destination another route of the host holds in
// the same table (the default route, a connected network, a CNI's or
// DHCP's route) is left to the host and reported in Conflicts — the plan
// leaves those out already (topology.WithoutHostRoutes): this is the guard
// for a route that appeared since. wgLink is the WireGuard interface kg
// routed through. Errors for single routes are collected; the others
// still apply.
func (h *Host) ReconcileRoutes(ctx context.Context, desired []Route, wgLink string) (RouteReport, error) {
	var rep RouteReport
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	want, noDevice, errs := h.kernelRoutes(desired)
	for _, r := range noDevice {
		errs = append(errs, r.err)
	}
	current, others, err := h.listRoutes()
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	replace, del := diffRoutes(want, current)
	if taken := h.hostsRoutes(replace, others, wgLink); len(taken) > 0 {
		kept := replace[:0]
		for _, r := range replace {
			if hr, ok := taken[r.key()]; ok {
				rep.Conflicts = append(rep.Conflicts, fmt.Sprintf("%s: %s", r.Dst, hr))
				continue
			}
			kept = append(kept, r)
		}
		replace = kept
	}
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
	own, _, err := h.listRoutes()
	return own, err
}

// listRoutes lists every table's routes, IPv4 and IPv6, in one dump:
// meshlet's, and the others by destination (the local table's are the
// kernel's own addresses and never a destination of meshlet's).
func (h *Host) listRoutes() (own []kernelRoute, others map[routeKey][]netlink.Route, err error) {
	rs, err := h.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, nil, fmt.Errorf("netlinkx: list routes: %w", err)
	}
	others = map[routeKey][]netlink.Route{}
	for _, r := range rs {
		if r.Protocol == Protocol {
			own = append(own, fromNetlinkRoute(r))
			continue
		}
		if r.Table == unix.RT_TABLE_LOCAL {
			continue
		}
		k := fromNetlinkRoute(r).key()
		others[k] = append(others[k], r)
	}
	return own, others, nil
}

// hostsRoutes finds, among the routes to replace, those whose destination
// a route of the host holds (not meshlet's, not kg's, not on the WireGuard
// link, which is meshlet's: as HostRoutes): the host's route, described,
// by key.
func (h *Host) hostsRoutes(replace []kernelRoute, others map[routeKey][]netlink.Route, wgLink string) map[routeKey]string {
	var taken map[routeKey]string
	var kg map[int]bool
	wg := -1
	for _, r := range replace {
		for _, o := range others[r.key()] {
			if kg == nil {
				kg = h.kgLinks(wgLink)
				if l, err := h.nl.LinkByName(wgLink); err == nil {
					wg = l.Attrs().Index
				}
			}
			if kgRoute(o, kg) || o.LinkIndex == wg {
				continue
			}
			if taken == nil {
				taken = map[routeKey]string{}
			}
			taken[r.key()] = h.describeRoute(o)
			break
		}
	}
	return taken
}

// HostRoute is a route of the host that meshlet does not own and kg did
// not write (the default route, connected networks, a CNI's or DHCP's):
// meshlet never replaces one (docs/architecture.md#host).
type HostRoute struct {
	Table int // 254 = main
	Dst   netip.Prefix
	// Desc is the route as `ip route` shows it.
	Desc string
}

// HostRoutes lists the host's routes in the given tables (all but the
// local table when none is given) that are neither meshlet's nor kg's, nor
// on the WireGuard interface wgLink (meshlet's own link: what the kernel
// routes there follows meshlet's addresses), sorted by table and
// destination.
func (h *Host) HostRoutes(wgLink string, tables ...int) ([]HostRoute, error) {
	_, others, err := h.listRoutes()
	if err != nil {
		return nil, err
	}
	kg := h.kgLinks(wgLink)
	wg := -1
	if l, err := h.nl.LinkByName(wgLink); err == nil {
		wg = l.Attrs().Index
	}
	var out []HostRoute
	for k, rs := range others {
		if len(tables) > 0 && !slices.Contains(tables, k.table) || k.dst.Addr().IsLinkLocalUnicast() || k.dst.Addr().IsMulticast() {
			continue // not a destination meshlet routes
		}
		for _, r := range rs {
			if kgRoute(r, kg) || r.LinkIndex == wg && wg > 0 {
				continue
			}
			out = append(out, HostRoute{Table: k.table, Dst: k.dst, Desc: h.describeRoute(r)})
			break
		}
	}
	slices.SortFunc(out, func(a, b HostRoute) int {
		if a.Table != b.Table {
			return cmp.Compare(a.Table, b.Table)
		}
		if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Dst.Bits(), b.Dst.Bits())
	})
	return out, nil
}

// describeRoute shows a route as `ip route` would: destination, gateway,
// device, protocol, metric, table.
func (h *Host) describeRoute(r netlink.Route) string {
	k := fromNetlinkRoute(r)
	s := k.Dst.String()
	if k.Dst.Bits() == 0 {
		s = "default"
	}
	if r.Type != unix.RTN_UNICAST && r.Type != 0 {
		s = routeTypeName(r.Type) + " " + s
	}
	if k.Gw.IsValid() {
		s += " via " + k.Gw.String()
	}
	if r.LinkIndex > 0 {
		if l, err := h.nl.LinkByIndex(r.LinkIndex); err == nil {
			s += " dev " + l.Attrs().Name
		}
	}
	s += " proto " + r.Protocol.String()
	if r.Priority > 0 {
		s += fmt.Sprintf(" metric %d", r.Priority)
	}
	if r.Table != unix.RT_TABLE_MAIN {
		s += fmt.Sprintf(" table %d", r.Table)
	}
	return s
}

func routeTypeName(t int) string {
	switch t {
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	case unix.RTN_LOCAL:
		return "local"
	case unix.RTN_BROADCAST:
		return "broadcast"
	case unix.RTN_THROW:
		return "throw"
	}
	return fmt.Sprintf("type%d", t)
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
