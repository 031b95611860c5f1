package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Sysctl is one /proc/sys setting.
type Sysctl struct {
	Key   string // dotted, e.g. net.ipv4.ip_forward
	Value string
}

// Reverse-path filtering on meshlet's devices. kilo0 gets 2 ("loose"): a
// packet is accepted when its source is reachable through any interface;
// strict mode would drop traffic whose return route points elsewhere
// (asymmetric paths are normal in a mesh). The tunnel gets 0: it carries no
// IPv4 address, and for such a device the kernel rejects even in loose mode
// every packet whose source is not routed back through that same device
// (fib_validate_source: -EXDEV). A non-leader's pod traffic decapsulated on
// the leader has a pod source that the CNI routes over the underlay, so
// loose mode dropped it — found by the kernel lane (e2e/kernel). The kernel
// uses max(conf.all, conf.<dev>): a host with conf.all.rp_filter ≥ 1 still
// filters, which meshlet reports rather than overrides.
const (
	rpFilterLoose = "2"
	rpFilterOff   = "0"
)

// DesiredSysctls lists the sysctls meshlet needs for its WireGuard
// interface and the tunnel device ("" = none), and IPv6 forwarding where
// the mesh carries IPv6 (a host that takes its IPv6 address from router
// advertisements needs accept_ra=2 then: docs/dual-stack.md#forwarding).
// Pure.
func DesiredSysctls(iface, tunnel string, ipv6 bool) []Sysctl {
	out := []Sysctl{{Key: "net.ipv4.ip_forward", Value: "1"}}
	if ipv6 {
		out = append(out, Sysctl{Key: "net.ipv6.conf.all.forwarding", Value: "1"})
	}
	if iface != "" {
		out = append(out, Sysctl{Key: "net.ipv4.conf." + iface + ".rp_filter", Value: rpFilterLoose})
	}
	if tunnel != "" {
		out = append(out, Sysctl{Key: "net.ipv4.conf." + tunnel + ".rp_filter", Value: rpFilterOff})
	}
	return out
}

func sysctlPath(key string) string {
	// Interface names may contain dots; only the fixed prefix parts are
	// separators. "net.ipv4.conf.<iface>.rp_filter" is the only such key.
	if rest, ok := strings.CutPrefix(key, "net.ipv4.conf."); ok {
		i := strings.LastIndexByte(rest, '.')
		if i > 0 {
			return filepath.Join("/proc/sys/net/ipv4/conf", rest[:i], rest[i+1:])
		}
	}
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// EnsureSysctls writes each sysctl whose current value differs and returns
// the keys it changed. A missing interface is skipped (it is reported by the
// link or tunnel step).
func (h *Host) EnsureSysctls(ctx context.Context, want []Sysctl) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var changed []string
	err := h.do(func() error {
		var errs []error
		for _, s := range want {
			p := sysctlPath(s.Key)
			b, err := os.ReadFile(p)
			if errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(s.Key, "net.ipv4.conf.") {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("netlinkx: read sysctl %s: %w", s.Key, err))
				continue
			}
			cur := strings.TrimSpace(string(b))
			if cur == s.Value {
				continue
			}
			if err := os.WriteFile(p, []byte(s.Value), 0o644); err != nil {
				if readOnly(err) && serves(s, cur) {
					h.noteSysctl(s.Key, cur)
					continue
				}
				if readOnly(err) {
					err = fmt.Errorf("%w (/proc/sys is read-only in a container that is not privileged: set %s=%s on the host, docs/security.md#capabilities)", err, s.Key, s.Value)
				}
				errs = append(errs, fmt.Errorf("netlinkx: set sysctl %s=%s (now %s): %w", s.Key, s.Value, cur, err))
				continue
			}
			changed = append(changed, s.Key)
		}
		return errors.Join(errs...)
	})
	return changed, err
}

// serves reports whether a sysctl's current value does what want is for,
// when want cannot be written: loose reverse-path filtering (kilo0's 2) is
// wanted to avoid strict mode, and off (0) avoids it too. Every other value
// must be the one wanted. Pure.
func serves(want Sysctl, current string) bool {
	if current == want.Value {
		return true
	}
	return strings.HasSuffix(want.Key, ".rp_filter") && want.Value == rpFilterLoose && current == rpFilterOff
}

// readOnly: the write was refused because /proc/sys is mounted read-only
// (a container that is not privileged) or the process may not write it.
func readOnly(err error) bool {
	return errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrPermission)
}

// noteSysctl logs once per key and value that a sysctl meshlet would set is
// left as the host has it.
func (h *Host) noteSysctl(key, value string) {
	h.sysctlMu.Lock()
	defer h.sysctlMu.Unlock()
	if h.sysctlNoted == nil {
		h.sysctlNoted = map[string]string{}
	}
	if v, ok := h.sysctlNoted[key]; ok && v == value {
		return
	}
	h.sysctlNoted[key] = value
	h.log.Info("sysctl left as the host set it: /proc/sys is read-only here, and its value serves", "sysctl", key, "value", value)
}

// ReadSysctl returns a sysctl's value in the Host's namespace.
func (h *Host) ReadSysctl(key string) (string, error) {
	var v string
	err := h.do(func() error {
		b, err := os.ReadFile(sysctlPath(key))
		v = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("netlinkx: read sysctl %s: %w", key, err)
	}
	return v, nil
}
