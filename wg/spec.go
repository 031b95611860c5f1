package wg

import (
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// DeviceSpec is the desired state of the managed device: its listen port and
// its peers. The link, its MTU and addresses are netlinkx's job.
type DeviceSpec struct {
	ListenPort int // 0 = leave as is
	Peers      []PeerSpec
}

// PeerSpec is one desired peer.
type PeerSpec struct {
	// Name labels the peer in logs and reports.
	Name      string
	PublicKey wgtypes.Key
	// Endpoint is "host:port" (the host may be a DNS name), "" for none.
	Endpoint            string
	AllowedIPs          []netip.Prefix
	PersistentKeepalive time.Duration
	PresharedKey        *wgtypes.Key
	// Roaming: the endpoint the device learned is kept (never overwritten
	// by Endpoint, see writeEndpoint).
	Roaming bool
	// SessionProbe, when set, puts the peer's session under the half-dead
	// rule (session.go): the watch records it (SessionFacts), and
	// ActOnSessions probes this address when the plan says so.
	SessionProbe netip.Addr
}
