package netlinkx

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func TestSysctlServes(t *testing.T) {
	for _, tc := range []struct {
		want    Sysctl
		current string
		serves  bool
	}{
		{Sysctl{"net.ipv4.ip_forward", "1"}, "1", true},
		{Sysctl{"net.ipv4.ip_forward", "1"}, "0", false},
		// kilo0's loose mode is there to avoid strict mode; off avoids it too.
		{Sysctl{"net.ipv4.conf.kilo0.rp_filter", "2"}, "0", true},
		{Sysctl{"net.ipv4.conf.kilo0.rp_filter", "2"}, "1", false},
		// The tunnel must be off: loose mode drops its decapsulated traffic.
		{Sysctl{"net.ipv4.conf.tunl0.rp_filter", "0"}, "2", false},
		{Sysctl{"net.ipv4.conf.kilo0.promote_secondaries", "1"}, "0", false},
	} {
		if got := serves(tc.want, tc.current); got != tc.serves {
			t.Errorf("serves(%v, %q) = %v, want %v", tc.want, tc.current, got, tc.serves)
		}
	}
}

// TestEnsureSysctlsReadOnly: where /proc/sys is read-only, as in a
// container that is not privileged (the chart's privileged=false), a value
// that serves is left with one log line, and one that does not is an error
// naming the sysctl, its value and what to do. Root: a network and a mount
// namespace of one locked thread, /proc/sys remounted read-only there.
func TestEnsureSysctlsReadOnly(t *testing.T) {
	requireRoot(t)
	var logs bytes.Buffer
	type result struct {
		changed []string
		err     error
	}
	results := make(chan result, 4)
	go func() {
		// The thread stays locked and in its namespaces: it ends with the
		// goroutine and is never given back.
		runtime.LockOSThread()
		fail := func(err error) { results <- result{err: err}; close(results) }
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWNET); err != nil {
			fail(err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fail(err)
			return
		}
		// As the host left them: forwarding off, lo without filtering,
		// strict filtering for new links.
		for p, v := range map[string]string{"/proc/sys/net/ipv4/ip_forward": "0", "/proc/sys/net/ipv4/conf/lo/rp_filter": "0",
			"/proc/sys/net/ipv4/conf/default/rp_filter": "1"} {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				fail(err)
				return
			}
		}
		if err := unix.Mount("/proc/sys", "/proc/sys", "", unix.MS_BIND, ""); err != nil {
			fail(err)
			return
		}
		if err := unix.Mount("", "/proc/sys", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			fail(err)
			return
		}
		h := &Host{ns: netns.None(), log: slog.New(slog.NewTextHandler(&logs, nil))}
		for _, want := range [][]Sysctl{
			{{"net.ipv4.conf.lo.rp_filter", "2"}},
			{{"net.ipv4.conf.lo.rp_filter", "2"}}, // logged once
			{{"net.ipv4.ip_forward", "1"}},
			{{"net.ipv4.conf.default.rp_filter", "2"}},
		} {
			changed, err := h.EnsureSysctls(context.Background(), want)
			results <- result{changed, err}
		}
		close(results)
	}()
	var got []result
	for r := range results {
		got = append(got, r)
	}
	if len(got) != 4 {
		t.Fatalf("setting up the namespace: %v", got[len(got)-1].err)
	}
	for i, r := range got[:2] {
		if r.err != nil || len(r.changed) > 0 {
			t.Errorf("lo rp_filter 0 where 2 is wanted, pass %d: changed %v, error %v", i, r.changed, r.err)
		}
	}
	if n := strings.Count(logs.String(), "sysctl left as the host set it"); n != 1 {
		t.Errorf("%d log lines for the sysctl left as it is, want 1:\n%s", n, logs.String())
	}
	for _, tc := range []struct {
		r    result
		want []string
	}{
		{got[2], []string{"net.ipv4.ip_forward=1 (now 0)", "read-only", "set net.ipv4.ip_forward=1 on the host", "docs/security.md#capabilities"}},
		{got[3], []string{"net.ipv4.conf.default.rp_filter=2 (now 1)", "read-only"}},
	} {
		if tc.r.err == nil {
			t.Errorf("no error; want one with %q", tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(tc.r.err.Error(), w) {
				t.Errorf("error %q lacks %q", tc.r.err, w)
			}
		}
	}
}
