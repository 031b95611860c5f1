package netlinkx

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Sysctl is one /proc/sys setting.
type Sysctl struct {
	Key   string // dotted, e.g. net.ipv4.ip_forward
	Value string
}

// Rp_filter 2 is "loose": a packet is accepted when its source is reachable
// through any interface. Strict mode drops traffic that arrives on kilo0 or
// the tunnel but whose return route points elsewhere (asymmetric paths are
// normal in a mesh). The kernel uses max(all, iface), so setting the
// interface to 2 is enough even when conf.all is 1.
const rpFilterLoose = "2"

// DesiredSysctls lists the sysctls meshlet needs for the given interfaces
// (kilo0 and the tunnel). Pure.
func DesiredSysctls(ifaces ...string) []Sysctl {
	out := []Sysctl{{Key: "net.ipv4.ip_forward", Value: "1"}}
	for _, i := range ifaces {
		if i != "" {
			out = append(out, Sysctl{Key: "net.ipv4.conf." + i + ".rp_filter", Value: rpFilterLoose})
		}
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
			if strings.TrimSpace(string(b)) == s.Value {
				continue
			}
			if err := os.WriteFile(p, []byte(s.Value), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("netlinkx: set sysctl %s=%s: %w", s.Key, s.Value, err))
				continue
			}
			changed = append(changed, s.Key)
		}
		return errors.Join(errs...)
	})
	return changed, err
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
