package topology

import (
	"net/netip"
	"sort"
)

// prefixSet answers "does x overlap / lie inside any member" in
// O(distinct prefix lengths + log n) instead of scanning every member: the
// planner asks it for every prefix of every remote node (10,000s per plan).
type prefixSet struct {
	byBits map[int]map[netip.Prefix]struct{} // members by length, masked
	bits   []int                             // distinct lengths, ascending
	starts []netip.Prefix                    // members sorted by start address
}

func newPrefixSet(ps []netip.Prefix) *prefixSet {
	s := &prefixSet{byBits: map[int]map[netip.Prefix]struct{}{}}
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		p = p.Masked()
		m := s.byBits[p.Bits()]
		if m == nil {
			m = map[netip.Prefix]struct{}{}
			s.byBits[p.Bits()] = m
			s.bits = append(s.bits, p.Bits())
		}
		m[p] = struct{}{}
		s.starts = append(s.starts, p)
	}
	sort.Ints(s.bits)
	sortPrefixes(s.starts)
	return s
}

// covering returns a member that contains x entirely.
func (s *prefixSet) covering(x netip.Prefix) (netip.Prefix, bool) {
	x = x.Masked()
	for _, b := range s.bits {
		if b > x.Bits() {
			break
		}
		p, err := x.Addr().Prefix(b)
		if err != nil {
			continue // other address family
		}
		if _, ok := s.byBits[b][p]; ok {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// overlapping returns a member that overlaps x: one containing x, or one
// that starts inside x.
func (s *prefixSet) overlapping(x netip.Prefix) (netip.Prefix, bool) {
	if p, ok := s.covering(x); ok {
		return p, true
	}
	x = x.Masked()
	i := sort.Search(len(s.starts), func(i int) bool { return !s.starts[i].Addr().Less(x.Addr()) })
	if i < len(s.starts) && x.Contains(s.starts[i].Addr()) {
		return s.starts[i], true
	}
	return netip.Prefix{}, false
}
