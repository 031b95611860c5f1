package config

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/meshlet/meshlet/agent/core/kilo"
)

func parse(t *testing.T, args ...string) (*Config, error) {
	t.Helper()
	var c Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterTopology(fs)
	c.RegisterAgent(fs)
	c.RegisterKg(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &c, c.Validate()
}

func TestDefaultsMatchKilo(t *testing.T) {
	c, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Settings()
	if s.Interface != "kilo0" || s.Port != 51820 || s.Subnet.String() != "10.4.0.0/16" || s.Granularity != "location" ||
		s.Encapsulate != "always" || !s.Local || c.Listen != ":1107" || s.MTU != 0 {
		t.Fatalf("defaults = %+v listen=%s", s, c.Listen)
	}
}

func TestLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want kilo.Limits
	}{
		{nil, kilo.DefaultLimits},
		{[]string{"--max-peers=0", "--max-peer-allowed-ips=0", "--max-allowed-location-ips=0", "--max-remote-nodes=0"}, kilo.Limits{}},
		{[]string{"--max-peers=7", "--max-peer-allowed-ips=8", "--max-allowed-location-ips=9", "--max-remote-nodes=10"},
			kilo.Limits{Peers: 7, PeerAllowedIPs: 8, AllowedLocationIPs: 9, RemoteNodes: 10}},
	} {
		c, err := parse(t, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := c.Limits(); got != tc.want {
			t.Errorf("%v: limits %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

func TestCozystackFlags(t *testing.T) {
	c, err := parse(t, "--compatibility=cilium", "--encapsulate=crosssubnet", "--local=false", "--mesh-granularity=location",
		"--subnet=100.66.0.0/16", "--mtu=auto", "--internal-cidr=192.168.1.10/32", "--service-cidr=10.96.0.0/12", "--private-ip=192.168.1.10/24")
	if err != nil {
		t.Fatal(err)
	}
	s := c.Settings()
	if s.Compatibility != "cilium" || s.Local || s.Subnet.String() != "100.66.0.0/16" || len(s.ServiceCIDRs) != 1 ||
		len(s.InternalCIDRs) != 1 || s.InternalCIDRs[0].String() != "192.168.1.10/32" || s.PrivateIP.String() != "192.168.1.10/24" {
		t.Fatalf("settings = %+v", s)
	}
}

func TestDualStackFlags(t *testing.T) {
	for _, tc := range []struct {
		args              []string
		subnet, dualStack string
	}{
		{[]string{"--subnet=10.4.0.0/16", "--dual-stack-subnet=fd4b::/64"}, "10.4.0.0/16", "fd4b::/64"},
		{[]string{"--subnet=fd4b::1/64"}, "fd4b::/64", "invalid Prefix"},
		{[]string{"--subnet=fd4b::/64", "--dual-stack-subnet=10.4.0.0/16"}, "fd4b::/64", "10.4.0.0/16"},
	} {
		c, err := parse(t, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if s := c.Settings(); s.Subnet.String() != tc.subnet || s.DualStackSubnet.String() != tc.dualStack {
			t.Errorf("%v: subnet %s, dual-stack %s", tc.args, s.Subnet, s.DualStackSubnet)
		}
	}
}

func TestInvalidFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--port=0"}, "--port"},
		{[]string{"--subnet=10.4.0.0"}, "--subnet"},
		{[]string{"--subnet=fd00::/127"}, "--subnet"},
		{[]string{"--subnet=10.4.0.0/31"}, "--subnet"},
		{[]string{"--dual-stack-subnet=10.5.0.0/16"}, "--dual-stack-subnet"},
		{[]string{"--subnet=fd00::/64", "--dual-stack-subnet=fd01::/64"}, "--dual-stack-subnet"},
		{[]string{"--dual-stack-subnet=fd00::1"}, "--dual-stack-subnet"},
		{[]string{"--mesh-granularity=region"}, "--mesh-granularity"},
		{[]string{"--compatibility=calico"}, "--compatibility"},
		{[]string{"--backend=etcd"}, "--backend"},
		{[]string{"--cni", "--cni-path="}, "--cni-path"},
		{[]string{"--clean-up-interface"}, "--clean-up-interface"},
		{[]string{"--log-level=verbose"}, "--log-level"},
		{[]string{"--encapsulate=sometimes"}, "--encapsulate"},
		{[]string{"--mtu=9"}, "--mtu"},
		{[]string{"--max-peers=-1"}, "--max-peers"},
		{[]string{"--max-peer-allowed-ips=-1"}, "--max-peer-allowed-ips"},
		{[]string{"--max-allowed-location-ips=-5"}, "--max-allowed-location-ips"},
		{[]string{"--max-remote-nodes=-1"}, "--max-remote-nodes"},
		{[]string{"--internal-cidr=nope"}, "--internal-cidr"},
		{[]string{"--private-ip=10.0.0.1"}, "--private-ip"},
		{[]string{"--service-cidr=10.96.0.0/33"}, "--service-cidr"},
		{[]string{"--wireguard=dkms"}, "--wireguard"},
		{[]string{"--metrics-compat=x"}, "--metrics-compat"},
		{[]string{"--cluster-name=Bad_Name"}, "--cluster-name"},
		{[]string{"--interface=a/b"}, "--interface"},
		{[]string{"--resync-period=1ms"}, "--resync-period"},
		{[]string{"--leader-lease-duration=1500ms"}, "--leader-lease-duration"},
		{[]string{"--leader-lease-renew=3s"}, "--leader-lease-renew"},
		{[]string{"--leader-restart-grace=2s"}, "--leader-restart-grace"},
		{[]string{"--leader-restart-grace=4500ms"}, "--leader-restart-grace"},
		{[]string{"--health-probe-interval=1ms"}, "--health-probe-interval"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parse(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %s", err, tc.want)
			}
			// Each rule stands alone: one bad value, one problem.
			if lines := strings.Split(err.Error(), "\n"); len(lines) != 1 {
				t.Errorf("%d problems for one bad value: %v", len(lines), err)
			}
		})
	}
}
