package kilo

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Parsers for Kilo's node annotations (docs/kilo-api.md). Each one accepts exactly
// what Kilo 0.7 accepts and returns an error for the rest, so the caller can
// turn it into a Rejection; where Kilo falls back to a default (keepalive 0,
// last-seen 0, dropped CIDRs) the parser returns that default alongside the
// error. An empty value means "unset" everywhere and is not an error: kg
// writes "" for internal-ip and wireguard-ip on purpose.

// maxQuoted bounds how much of a malformed value ends up in a message: values
// are user input and may be arbitrarily large.
const maxQuoted = 64

// quote formats a user value for an error message, truncated.
func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// Endpoint is a parsed "host:port" annotation value. Exactly one of DNS and
// IP is set.
type Endpoint struct {
	DNS  string     // RFC 1123 subdomain
	IP   netip.Addr // IPv4 or IPv6, never zoned or IPv4-mapped
	Port int        // 1–65535
}

// IsZero reports whether e is unset.
func (e Endpoint) IsZero() bool { return e == Endpoint{} }

// String formats e as Kilo does: "1.2.3.4:51820", "[2001:db8::1]:51820" or
// "host.example.com:51820"; the zero Endpoint is "".
func (e Endpoint) String() string { return FormatEndpoint(e) }

// FormatEndpoint formats an endpoint annotation value (see Endpoint.String).
func FormatEndpoint(e Endpoint) string {
	if e.IsZero() {
		return ""
	}
	host := e.DNS
	if e.IP.IsValid() {
		host = e.IP.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(e.Port))
}

// ParseEndpoint parses a host:port annotation value (endpoint,
// force-endpoint, clustermesh-endpoint) with Kilo's rules: the host is an IP
// address (IPv6 in brackets) or an RFC 1123 subdomain, the port 1–65535.
// "" is the zero Endpoint and no error.
func ParseEndpoint(s string) (Endpoint, error) {
	if s == "" {
		return Endpoint{}, nil
	}
	host, portRaw, err := net.SplitHostPort(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %s is not host:port: %w", quote(s), err)
	}
	port, err := parsePort(portRaw)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %s: %w", quote(s), err)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		// A zone names an interface of the writer's machine: meaningless here.
		if ip.Zone() != "" {
			return Endpoint{}, fmt.Errorf("endpoint %s: zoned IPv6 address not allowed", quote(s))
		}
		return Endpoint{IP: ip.Unmap(), Port: port}, nil
	}
	if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
		return Endpoint{}, fmt.Errorf("endpoint %s: host is neither an IP address nor a DNS name: %s", quote(s), strings.Join(errs, "; "))
	}
	return Endpoint{DNS: host, Port: port}, nil
}

// parsePort parses a decimal UDP port 1–65535.
func parsePort(s string) (int, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("invalid port %s: %w", quote(s), err)
	}
	if p == 0 {
		return 0, errors.New("port must be 1-65535, got 0")
	}
	return int(p), nil
}

// ParsePrefix parses a CIDR annotation value (internal-ip, wireguard-ip,
// force-internal-ip, cni-compatibility-ip). The address keeps its host bits
// (192.168.1.34/24), as Kilo's normalizeIP does. "" is the zero prefix.
func ParsePrefix(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %s: %w", quote(s), err)
	}
	// Kilo converts IPv4-mapped addresses to 4 bytes but keeps a 16-byte
	// mask, which yields nonsense; refuse instead of guessing.
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %s: IPv4-mapped IPv6 address", quote(s))
	}
	return p, nil
}

// ParseForceInternalIP parses kilo.squat.ai/force-internal-ip: "" or "-"
// mean "this node has no internal IP" (none = true), which also overrides the
// internal-ip annotation.
func ParseForceInternalIP(s string) (p netip.Prefix, none bool, err error) {
	if s == "" || s == "-" {
		return netip.Prefix{}, true, nil
	}
	p, err = ParsePrefix(s)
	return p, false, err
}

// FormatForceInternalIP formats force-internal-ip; none is written as "-",
// the explicit form.
func FormatForceInternalIP(p netip.Prefix, none bool) string {
	if none || !p.IsValid() {
		return "-"
	}
	return p.String()
}

// maxKeepalive is WireGuard's limit (a uint16 of seconds).
const maxKeepalive = 65535

// ParsePersistentKeepalive parses kilo.squat.ai/persistent-keepalive. Like
// Kilo, an unparsable value means 0 (off); the error is only for reporting.
// Negative values and values above WireGuard's 65535 are unparsable too.
func ParsePersistentKeepalive(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("persistent-keepalive %s is not an integer: %w", quote(s), err)
	}
	if n < 0 || n > maxKeepalive {
		return 0, fmt.Errorf("persistent-keepalive %d out of range 0-%d", n, maxKeepalive)
	}
	return int(n), nil
}

// FormatPersistentKeepalive formats kilo.squat.ai/persistent-keepalive.
func FormatPersistentKeepalive(seconds int) string { return strconv.Itoa(seconds) }

// ParseLastSeen parses kilo.squat.ai/last-seen (unix seconds). Unparsable
// means never seen (the zero time), as in Kilo. Times are UTC so that parsed
// values compare with ==.
func ParseLastSeen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("last-seen %s is not unix seconds: %w", quote(s), err)
	}
	return time.Unix(n, 0).UTC(), nil
}

// ParseKeyAnnotation parses kilo.squat.ai/key; "" is the zero key (the agent
// has not published yet).
func ParseKeyAnnotation(s string) (topology.Key, error) {
	if s == "" {
		return topology.Key{}, nil
	}
	k, err := topology.ParseKey(s)
	if err != nil {
		return topology.Key{}, fmt.Errorf("public key %s: %w", quote(s), err)
	}
	return k, nil
}

// FormatKey formats kilo.squat.ai/key; the zero key is "".
func FormatKey(k topology.Key) string {
	if k.IsZero() {
		return ""
	}
	return k.String()
}

// ParseAllowedLocationIPs parses kilo.squat.ai/allowed-location-ips, a
// comma-separated list of CIDRs. As in Kilo, an entry that is not a CIDR —
// also one with spaces around it, which Kilo does not trim — is dropped and
// empty entries are skipped; entries are masked to their network
// (10.1.2.3/16 becomes 10.1.0.0/16, where Kilo keeps the host bits the
// kernel refuses). The valid ones are always returned, and err names the
// dropped ones so they can be reported.
func ParseAllowedLocationIPs(s string) ([]netip.Prefix, error) {
	if s == "" {
		return nil, nil
	}
	var out []netip.Prefix
	var errs []error
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		if strings.TrimSpace(f) != f {
			errs = append(errs, fmt.Errorf("entry %s has spaces around it (Kilo ignores such an entry)", quote(f)))
			continue
		}
		p, err := ParsePrefix(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, p.Masked())
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("allowed-location-ips: dropped %d entries: %w", len(errs), joinSome(errs))
	}
	return out, nil
}

// joinSome joins the first maxListed errors and counts the rest: a 256 KiB
// annotation of bad entries must not become a megabyte of Event message.
func joinSome(errs []error) error {
	if len(errs) <= maxListed {
		return errors.Join(errs...)
	}
	return errors.Join(append(errs[:maxListed:maxListed], fmt.Errorf("and %d more", len(errs)-maxListed))...)
}

// ParseGranularity parses kilo.squat.ai/granularity: location, full or cross
// (Cozystack's patch). Anything else is "" plus an error, as Kilo ignores it.
func ParseGranularity(s string) (topology.Granularity, error) {
	switch g := topology.Granularity(s); g {
	case "", topology.GranularityLocation, topology.GranularityFull, topology.GranularityCross:
		return g, nil
	}
	return "", fmt.Errorf("unknown granularity %s", quote(s))
}

// ParseDiscoveredEndpoints parses kilo.squat.ai/discovered-endpoints, the JSON
// object {"<pubkey>": {"IP": "1.2.3.4", "Port": 51820, "Zone": ""}} Kilo
// marshals from map[string]*net.UDPAddr. Unusable entries (bad key, bad IP,
// port 0, loopback, link-local, multicast or unspecified addresses, which a
// remote writer could use to redirect traffic to this host) are dropped and
// named in err; the usable ones are always returned. Malformed JSON drops
// everything.
func ParseDiscoveredEndpoints(s string) (map[topology.Key]netip.AddrPort, error) {
	if s == "" {
		return nil, nil
	}
	var raw map[string]*topology.DiscoveredEndpoint
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("discovered-endpoints is not a JSON object of endpoints: %w", err)
	}
	out := make(map[topology.Key]netip.AddrPort, len(raw))
	var errs []error
	for ks, de := range raw {
		k, err := topology.ParseKey(ks)
		if err != nil {
			errs = append(errs, fmt.Errorf("key %s: %w", quote(ks), err))
			continue
		}
		if de == nil {
			continue // Kilo writes null for a peer without endpoint.
		}
		ap, err := discoveredEndpoint(*de)
		if err != nil {
			errs = append(errs, fmt.Errorf("key %s: %w", quote(ks), err))
			continue
		}
		out[k] = ap
	}
	var err error
	if len(errs) > 0 {
		err = fmt.Errorf("discovered-endpoints: dropped %d entries: %w", len(errs), joinSome(errs))
	}
	if len(out) == 0 {
		out = nil
	}
	return out, err
}

func discoveredEndpoint(de topology.DiscoveredEndpoint) (netip.AddrPort, error) {
	ip, err := netip.ParseAddr(de.IP)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("invalid IP %s: %w", quote(de.IP), err)
	}
	ip = ip.Unmap()
	if ip.Is6() && de.Zone != "" {
		ip = ip.WithZone(de.Zone)
	}
	if de.Port < 1 || de.Port > 65535 {
		return netip.AddrPort{}, fmt.Errorf("port %d out of range 1-65535", de.Port)
	}
	switch {
	case ip.IsLoopback(), ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast(), ip.IsInterfaceLocalMulticast(),
		ip.IsMulticast(), ip.IsUnspecified():
		return netip.AddrPort{}, fmt.Errorf("address %s is not a usable endpoint (loopback, link-local, multicast or unspecified)", ip)
	}
	return netip.AddrPortFrom(ip, uint16(de.Port)), nil
}
