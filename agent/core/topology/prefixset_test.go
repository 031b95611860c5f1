package topology

import "testing"

func TestPrefixSet(t *testing.T) {
	s := newPrefixSet(pfxs("10.0.0.0/16", "10.1.2.0/24", "192.168.1.1/32", "fd00::/64"))
	for _, tc := range []struct {
		x                    string
		covered, overlapping bool
	}{
		{"10.0.5.0/24", true, true},
		{"10.0.0.0/8", false, true}, // contains members
		{"10.1.0.0/16", false, true},
		{"10.1.2.128/25", true, true},
		{"10.1.3.0/24", false, false},
		{"192.168.1.1/32", true, true},
		{"192.168.1.0/31", false, true},
		{"192.168.1.2/32", false, false},
		{"fd00::1/128", true, true},
		{"fd01::/64", false, false},
		{"0.0.0.0/0", false, true},
	} {
		_, cov := s.covering(pfx(tc.x))
		_, ovl := s.overlapping(pfx(tc.x))
		if cov != tc.covered || ovl != tc.overlapping {
			t.Errorf("%s: covered=%v overlapping=%v, want %v %v", tc.x, cov, ovl, tc.covered, tc.overlapping)
		}
		// Cross-check against the obvious scan.
		_, scan := overlapsAny(pfx(tc.x), s.starts)
		if scan != ovl || containedIn(pfx(tc.x), s.starts) != cov {
			t.Errorf("%s: index and scan disagree", tc.x)
		}
	}
}
