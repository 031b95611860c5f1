package topology

import (
	"net"
	"net/netip"
	"sort"
	"strconv"
)

// host returns the single-address prefix of a.
func host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// addrAdd returns a+n, or the zero Addr on overflow.
func addrAdd(a netip.Addr, n uint64) netip.Addr {
	for ; n > 0; n-- {
		a = a.Next()
		if !a.IsValid() {
			return a
		}
	}
	return a
}

// endpointAddr returns the IP of a "host:port" endpoint, or the zero Addr
// when the host is a DNS name or the value is malformed.
func endpointAddr(ep string) netip.Addr {
	h, _, err := net.SplitHostPort(ep)
	if err != nil {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(h)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}

// joinHostPort formats an IP and port as an endpoint.
func joinHostPort(a netip.Addr, port int) string {
	return net.JoinHostPort(a.String(), strconv.Itoa(port))
}

func prefixLess(a, b netip.Prefix) bool {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c < 0
	}
	return a.Bits() < b.Bits()
}

func sortPrefixes(ps []netip.Prefix) {
	sort.Slice(ps, func(i, j int) bool { return prefixLess(ps[i], ps[j]) })
}

// sortedUnique returns the masked prefixes sorted, without duplicates.
func sortedUnique(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Masked())
	}
	sortPrefixes(out)
	j := 0
	for i, p := range out {
		if i > 0 && p == out[j-1] {
			continue
		}
		out[j] = p
		j++
	}
	return out[:j]
}

// containedIn reports whether p lies entirely inside one of nets.
func containedIn(p netip.Prefix, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// overlapsAny returns the first of nets that overlaps p.
func overlapsAny(p netip.Prefix, nets []netip.Prefix) (netip.Prefix, bool) {
	for _, n := range nets {
		if n.Overlaps(p) {
			return n, true
		}
	}
	return netip.Prefix{}, false
}

func routeLess(a, b Route) bool {
	if a.Table != b.Table {
		return a.Table < b.Table
	}
	if a.Dst != b.Dst {
		return prefixLess(a.Dst, b.Dst)
	}
	if a.Dev != b.Dev {
		return a.Dev < b.Dev
	}
	return a.Gw.Less(b.Gw)
}

func ruleLess(a, b Rule) bool {
	if a.Table != b.Table {
		return a.Table < b.Table
	}
	if a.Dst != b.Dst {
		return prefixLess(a.Dst, b.Dst)
	}
	if a.Src != b.Src {
		return prefixLess(a.Src, b.Src)
	}
	return a.Iif < b.Iif
}

// dedupRoutes keeps the first route per (table, destination): the kernel
// holds one route per destination and table, so a later one would fight it.
func dedupRoutes(rs []Route) []Route {
	type key struct {
		table int
		dst   netip.Prefix
	}
	seen := map[key]bool{}
	out := rs[:0]
	for _, r := range rs {
		r.Dst = r.Dst.Masked()
		k := key{r.Table, r.Dst}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, r)
	}
	return out
}

func dedupRules(rs []Rule) []Rule {
	seen := map[Rule]bool{}
	out := rs[:0]
	for _, r := range rs {
		if seen[r] {
			continue
		}
		seen[r] = true
		out = append(out, r)
	}
	return out
}

// oneFamily makes every route installable: the kernel refuses a source or
// gateway of the other address family than the destination (Kilo plans
// them, e.g. an IPv6 Peer allowed IP with src = an IPv4 private IP, and its
// whole route update fails). A foreign source is left out (the kernel then
// picks one); a foreign gateway is left out on the WireGuard interface,
// which routes by allowed IPs and needs none; any other such route cannot
// work and is dropped.
func oneFamily(rs []Route, wgInterface string) []Route {
	out := rs[:0]
	for _, r := range rs {
		v4 := r.Dst.Addr().Is4()
		if r.Src.IsValid() && r.Src.Is4() != v4 {
			r.Src = netip.Addr{}
		}
		if r.Gw.IsValid() && r.Gw.Is4() != v4 {
			if r.Dev != wgInterface {
				continue
			}
			r.Gw, r.OnLink = netip.Addr{}, false
		}
		out = append(out, r)
	}
	return out
}

// oneFamilyRules drops rules whose source and destination are of different
// families: no kernel rule can hold both.
func oneFamilyRules(rs []Rule) []Rule {
	out := rs[:0]
	for _, r := range rs {
		if r.Src.IsValid() && r.Dst.IsValid() && r.Src.Addr().Is4() != r.Dst.Addr().Is4() {
			continue
		}
		out = append(out, r)
	}
	return out
}
