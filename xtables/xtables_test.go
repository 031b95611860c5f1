package xtables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSaves answers "<multi> <cmd> [args]" from a table; missing = no output.
func fakeSaves(outputs map[string]string) Runner {
	return func(_ context.Context, name string, args ...string) ([]byte, error) {
		key := name + " " + strings.Join(args, " ")
		if out, ok := outputs[key]; ok {
			return []byte(out), nil
		}
		return nil, fmt.Errorf("%s: not found", key)
	}
}

const hint = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"

func rules(n int) string {
	var b strings.Builder
	b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n")
	for i := range n {
		fmt.Fprintf(&b, "-A INPUT -s 10.0.0.%d/32 -j ACCEPT\n", i)
	}
	return b.String() + "COMMIT\n"
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outputs map[string]string
		want    Backend
	}{
		{"kubelet hint in nft", map[string]string{"xtables-nft-multi iptables-save -t mangle": hint,
			"xtables-legacy-multi iptables-save": rules(50)}, NFT},
		{"kubelet hint in nft, IPv6 only", map[string]string{"xtables-nft-multi ip6tables-save -t mangle": hint}, NFT},
		{"kubelet hint in legacy", map[string]string{"xtables-legacy-multi iptables-save": hint + rules(1),
			"xtables-nft-multi iptables-save": rules(5)}, Legacy},
		{"canary in legacy IPv6", map[string]string{"xtables-legacy-multi ip6tables-save": "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"}, Legacy},
		{"no hint, more legacy rules", map[string]string{"xtables-legacy-multi iptables-save": rules(12),
			"xtables-nft-multi iptables-save": rules(3)}, Legacy},
		{"no hint, more nft rules", map[string]string{"xtables-legacy-multi iptables-save": rules(2),
			"xtables-nft-multi ip6tables-save": rules(9)}, NFT},
		{"no hint, a tie goes to legacy", map[string]string{"xtables-legacy-multi iptables-save": rules(4),
			"xtables-nft-multi iptables-save": rules(4)}, Legacy},
		{"nothing anywhere", nil, NFT},
		// A chain named like the hint but not a chain line is no hint.
		{"hint name in a comment", map[string]string{"xtables-legacy-multi iptables-save": "# :KUBE-IPTABLES-HINT\n"}, NFT},
		// An output cut short (a timeout) before its last newline: the
		// next output's first line is a line of its own (FuzzIPTablesSave).
		{"hint after an output cut short", map[string]string{"xtables-legacy-multi iptables-save": "*filter\n-A INPUT -j ACCEPT",
			"xtables-legacy-multi ip6tables-save": ":KUBE-IPTABLES-HINT - [0:0]\n", "xtables-nft-multi iptables-save": rules(5)}, Legacy},
		{"rule after an output cut short", map[string]string{"xtables-legacy-multi iptables-save": "*filter\n-A INPUT -j ACCEPT\nCOMMIT",
			"xtables-legacy-multi ip6tables-save": "-A INPUT -j DROP\n", "xtables-nft-multi iptables-save": rules(2)}, Legacy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := Detect(context.Background(), fakeSaves(tc.outputs))
			if got != tc.want {
				t.Fatalf("Detect = %s (%s), want %s", got, why, tc.want)
			}
		})
	}
}

// backendDirs makes the image's per-backend directories under a temp dir,
// pointing at this machine's multi-call binaries.
func backendDirs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []Backend{NFT, Legacy} {
		multi, err := exec.LookPath("xtables-" + string(b) + "-multi")
		if err != nil {
			t.Skipf("xtables-%s-multi not installed (apt-get install iptables): %v", b, err)
		}
		d := filepath.Join(dir, string(b))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"iptables", "ip6tables", "iptables-save", "ip6tables-save"} {
			if err := os.Symlink(multi, filepath.Join(d, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func TestSelectPutsBackendFirstInPath(t *testing.T) {
	dir := backendDirs(t)
	for _, mode := range []string{"legacy", "nft"} {
		t.Run(mode, func(t *testing.T) {
			t.Setenv("PATH", os.Getenv("PATH"))
			got, err := Select(context.Background(), mode, dir, Exec, nil)
			if err != nil || got != mode {
				t.Fatalf("Select(%s) = %q, %v", mode, got, err)
			}
			p, err := exec.LookPath("iptables")
			if err != nil || filepath.Dir(p) != filepath.Join(dir, mode) {
				t.Fatalf("iptables in PATH is %q (%v), want the %s directory", p, err, mode)
			}
			out, err := exec.Command("iptables", "--version").Output()
			want := map[string]string{"legacy": "(legacy)", "nft": "(nf_tables)"}[mode]
			if err != nil || !strings.Contains(string(out), want) {
				t.Fatalf("iptables --version: %q %v, want %s", out, err, want)
			}
		})
	}
	t.Run("system leaves PATH alone", func(t *testing.T) {
		t.Setenv("PATH", "/usr/sbin:/usr/bin")
		if got, err := Select(context.Background(), "system", dir, Exec, nil); err != nil || got != "system" || os.Getenv("PATH") != "/usr/sbin:/usr/bin" {
			t.Fatalf("Select(system) = %q, %v; PATH %q", got, err, os.Getenv("PATH"))
		}
	})
	t.Run("auto without the directories is system", func(t *testing.T) {
		t.Setenv("PATH", "/usr/sbin:/usr/bin")
		if got, err := Select(context.Background(), "auto", filepath.Join(dir, "missing"), Exec, nil); err != nil || got != "system" {
			t.Fatalf("Select(auto, no dirs) = %q, %v", got, err)
		}
	})
	if _, err := Select(context.Background(), "ebtables", dir, Exec, nil); err == nil {
		t.Fatal("Select accepted an unknown mode")
	}
}

// TestDetectRealBackends writes kubelet's hint chain, or plain rules, with
// the real iptables-legacy / iptables-nft into a fresh network namespace and
// detects from there (root).
func TestDetectRealBackends(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and iptables chains (CI runs as root)")
	}
	backendDirs(t) // skips without both multi-call binaries
	for i, tc := range []struct {
		name  string
		setup [][]string
		want  Backend
	}{
		{"kubelet on legacy", [][]string{{"iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"}}, Legacy},
		{"kubelet on nft, older rules in legacy", [][]string{
			{"iptables-nft", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"},
			{"iptables-legacy", "-A", "INPUT", "-s", "10.9.9.9", "-j", "ACCEPT"},
		}, NFT},
		{"no kubelet, rules in legacy", [][]string{
			{"iptables-legacy", "-A", "INPUT", "-s", "10.9.9.9", "-j", "ACCEPT"},
			{"iptables-legacy", "-A", "INPUT", "-s", "10.9.9.8", "-j", "ACCEPT"},
		}, Legacy},
		{"empty namespace", nil, NFT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := fmt.Sprintf("mlxt%d%d", os.Getpid()%100000, i)
			if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
				t.Fatalf("ip netns add: %v %s", err, out)
			}
			t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
			for _, c := range tc.setup {
				if out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, c...)...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v %s", c, err, out)
				}
			}
			inNS := func(ctx context.Context, name string, args ...string) ([]byte, error) {
				return Exec(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
			}
			if got, why := Detect(context.Background(), inNS); got != tc.want {
				t.Fatalf("Detect = %s (%s), want %s", got, why, tc.want)
			}
		})
	}
}
