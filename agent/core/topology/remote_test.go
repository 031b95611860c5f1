package topology

import (
	"net/netip"
	"testing"
)

func TestRemoteEndpointChain(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Node)
		want string
		src  string
	}{
		{"clustermesh-endpoint first", func(n *Node) { n.ClusterMeshEndpoint = "cm.example.com:4000"; n.ForceEndpoint = "1.1.1.1:1" }, "cm.example.com:4000", "clustermesh-endpoint"},
		{"force-endpoint second", func(n *Node) { n.ForceEndpoint = "1.1.1.1:1" }, "1.1.1.1:1", "force-endpoint"},
		{"external IPv4 third", func(n *Node) {
			n.ExternalIPs = []netip.Addr{netip.MustParseAddr("2001:db8::5"), netip.MustParseAddr("192.0.2.5")}
		}, "192.0.2.5:51821", "external-ip:51821"},
		{"external IPv6", func(n *Node) { n.ExternalIPs = []netip.Addr{netip.MustParseAddr("2001:db8::5")} }, "[2001:db8::5]:51821", "external-ip:51821"},
		{"endpoint annotation", func(n *Node) {}, "172.16.9.9:51820", "annotation"},
		{"none: roams", func(n *Node) { n.Endpoint = "" }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := Node{Endpoint: "172.16.9.9:51820"}
			tc.mod(&n)
			got, src := remoteEndpoint(&n, 51821)
			if got != tc.want || src != tc.src {
				t.Errorf("endpoint = %q (%s), want %q (%s)", got, src, tc.want, tc.src)
			}
		})
	}
}
