package harness

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// WGPeer is one peer of a node's WireGuard device, as the device reports it.
type WGPeer struct {
	PublicKey     string // base64, as in Kilo's annotations and `wg show`
	Endpoint      string // "" when none
	AllowedIPs    []string
	Keepalive     int // seconds, 0 = off
	LastHandshake time.Time
	RxBytes       int64
	TxBytes       int64
}

// WGDevice is a node's WireGuard device.
type WGDevice struct {
	PublicKey  string
	ListenPort int
	Peers      map[string]WGPeer // by public key
}

// readUAPI reads a userspace device through its UAPI socket. The socket is
// a file in the node's own /run/wireguard directory, so the harness reads
// it from the host without entering the node: read-only, no configuration.
func readUAPI(sockDir, iface string) (*WGDevice, error) {
	c, err := net.DialTimeout("unix", filepath.Join(sockDir, iface+".sock"), time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("get=1\n\n")); err != nil {
		return nil, err
	}
	d := &WGDevice{Peers: map[string]WGPeer{}}
	var cur *WGPeer
	var hsSec, hsNsec int64
	flush := func() {
		if cur != nil {
			if hsSec != 0 || hsNsec != 0 {
				cur.LastHandshake = time.Unix(hsSec, hsNsec)
			}
			sort.Strings(cur.AllowedIPs)
			d.Peers[cur.PublicKey] = *cur
		}
		cur, hsSec, hsNsec = nil, 0, 0
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			break
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch k {
		case "errno":
			if v != "0" {
				return nil, fmt.Errorf("uapi errno %s", v)
			}
		case "private_key":
			b, _ := hex.DecodeString(v)
			d.PublicKey = publicFromPrivate(b)
		case "listen_port":
			d.ListenPort, _ = strconv.Atoi(v)
		case "public_key":
			flush()
			b, _ := hex.DecodeString(v)
			cur = &WGPeer{PublicKey: base64.StdEncoding.EncodeToString(b)}
		case "endpoint":
			if cur != nil {
				cur.Endpoint = v
			}
		case "allowed_ip":
			if cur != nil {
				cur.AllowedIPs = append(cur.AllowedIPs, v)
			}
		case "persistent_keepalive_interval":
			if cur != nil {
				cur.Keepalive, _ = strconv.Atoi(v)
			}
		case "last_handshake_time_sec":
			hsSec, _ = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			hsNsec, _ = strconv.ParseInt(v, 10, 64)
		case "rx_bytes":
			if cur != nil {
				cur.RxBytes, _ = strconv.ParseInt(v, 10, 64)
			}
		case "tx_bytes":
			if cur != nil {
				cur.TxBytes, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return d, nil
}

// EndpointAddr parses a peer's endpoint ("" gives the zero value).
func (p WGPeer) EndpointAddr() netip.AddrPort {
	a, _ := netip.ParseAddrPort(p.Endpoint)
	return a
}

// setUAPI sends a UAPI "set" operation (the lines after set=1), exactly
// what `wg set` sends to a userspace device; so the harness needs no
// wireguard-tools.
func setUAPI(sockDir, iface string, lines ...string) error {
	c, err := net.DialTimeout("unix", filepath.Join(sockDir, iface+".sock"), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("set=1\n" + strings.Join(lines, "\n") + "\n\n")); err != nil {
		return err
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		if k == "errno" {
			if v != "0" {
				return fmt.Errorf("uapi set on %s: errno %s", iface, v)
			}
			return nil
		}
	}
	return fmt.Errorf("uapi set on %s: no answer: %v", iface, sc.Err())
}
