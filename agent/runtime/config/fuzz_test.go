package config

import (
	"testing"
)

// FuzzMeshSubnets: --subnet and --dual-stack-subnet, whatever their
// values, are accepted only as masked CIDRs of room for a few segments, of
// two different families when both are given; Validate never panics.
//
//	go test -run='^$' -fuzz='^FuzzMeshSubnets$' ./agent/runtime/config/
func FuzzMeshSubnets(f *testing.F) {
	for _, s := range [][2]string{{"10.4.0.0/16", ""}, {"10.4.0.0/16", "fd4b::/64"}, {"fd4b::1/64", ""}, {"fd4b::/64", "10.4.0.0/24"},
		{"10.4.0.0/31", "fd4b::/127"}, {"::ffff:10.4.0.0/112", "fe80::%eth0/64"}, {"10.4.0.0/16", "10.5.0.0/16"}, {"x", "/"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, subnet, dual string) {
		args := []string{"--subnet=" + subnet}
		if dual != "" {
			args = append(args, "--dual-stack-subnet="+dual)
		}
		c, err := parse(t, args...)
		if err != nil {
			return
		}
		s := c.Settings()
		if !s.Subnet.IsValid() || s.Subnet != s.Subnet.Masked() || s.Subnet.Bits() > s.Subnet.Addr().BitLen()-2 {
			t.Fatalf("--subnet=%q accepted as %v", subnet, s.Subnet)
		}
		if dual == "" {
			if s.DualStackSubnet.IsValid() {
				t.Fatalf("no --dual-stack-subnet, yet %v", s.DualStackSubnet)
			}
			return
		}
		d := s.DualStackSubnet
		if !d.IsValid() || d != d.Masked() || d.Bits() > d.Addr().BitLen()-2 || d.Addr().Is4() == s.Subnet.Addr().Is4() {
			t.Fatalf("--subnet=%q --dual-stack-subnet=%q accepted as %v, %v", subnet, dual, s.Subnet, d)
		}
	})
}
