package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func planJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	var out bytes.Buffer
	if err := runCmd(append([]string{"plan"}, append(args, "-o", "json")...), &out); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return m
}

func TestPlanFromDumps(t *testing.T) {
	m := planJSON(t, "--node", "a-1", "--local", "testdata/cluster-a.yaml", "--remote", "cluster-b=testdata/cluster-b.yaml")
	if m["node"] != "a-1" || m["leader"] != true || m["segment"] != "location:fsn1" || m["wireguardIP"] != "10.4.0.1/16" {
		t.Fatalf("plan head = %v %v %v %v", m["node"], m["leader"], m["segment"], m["wireguardIP"])
	}
	wg := m["wireguard"].(map[string]any)
	if wg["listenPort"].(float64) != 51820 {
		t.Errorf("listenPort = %v", wg["listenPort"])
	}
	peers := map[string]map[string]any{}
	for _, p := range wg["peers"].([]any) {
		pm := p.(map[string]any)
		for _, k := range []string{"name", "kind", "cluster", "publicKey", "endpoint", "allowedIPs", "persistentKeepalive"} {
			if _, ok := pm[k]; !ok {
				t.Errorf("peer lacks %q: %v", k, pm)
			}
		}
		peers[pm["name"].(string)] = pm
	}
	if p := peers["laptop"]; p == nil || p["kind"] != "peer" || p["persistentKeepalive"].(float64) != 25 {
		t.Errorf("laptop = %v: the Peer's keepalive must be applied", p)
	}
	if p := peers["b-1"]; p == nil || p["kind"] != "remote" || p["cluster"] != "cluster-b" || p["persistentKeepalive"].(float64) != 25 {
		t.Errorf("b-1 = %v", p)
	}
	if _, ok := peers["b-2"]; ok {
		t.Error("b-2 has no WireGuard IP: not a remote leader")
	}
	for _, r := range m["routes"].([]any) {
		rm := r.(map[string]any)
		for _, k := range []string{"dst", "gw", "dev", "src", "table", "onlink"} {
			if _, ok := rm[k]; !ok {
				t.Errorf("route lacks %q: %v", k, rm)
			}
		}
	}
	reasons := map[string]bool{}
	for _, r := range m["rejections"].([]any) {
		rm := r.(map[string]any)
		reasons[rm["object"].(string)+" "+rm["reason"].(string)] = true
	}
	for _, want := range []string{"Peer/broken InvalidKey", "cluster-b:Node/b-2 DefaultRoute", "cluster-b:Node/b-2 OverlapsLocalCluster", "Node/a-3 InvalidEndpoint"} {
		if !reasons[want] {
			t.Errorf("missing rejection %q in %v", want, reasons)
		}
	}
	if ann := m["annotations"].(map[string]any); ann["kilo.squat.ai/wireguard-ip"] != "10.4.0.1/16" {
		t.Errorf("annotations = %v", ann)
	}
}

func TestPlanNonLeaderCiliumFlags(t *testing.T) {
	m := planJSON(t, "--node", "a-2", "--local", "testdata/cluster-a.yaml", "--local=false", "--compatibility=cilium",
		"--encapsulate=crosssubnet", "--subnet=100.66.0.0/16", "--tunnel-device=cilium_tunl")
	if m["leader"] != false {
		t.Fatal("a-2 is not the leader")
	}
	for _, r := range m["routes"].([]any) {
		rm := r.(map[string]any)
		if rm["dst"] == "10.244.2.0/24" {
			// The leader a-1 publishes no cni-compatibility-ip: Kilo's
			// fallback, its pod CIDR's network address, through cilium_tunl.
			if rm["gw"] != "10.244.0.0" || rm["dev"] != "cilium_tunl" || rm["onlink"] != true {
				t.Errorf("route = %v", rm)
			}
			return
		}
	}
	t.Fatal("no route to location nbg1's pods")
}

func TestPlanTextAndErrors(t *testing.T) {
	var out bytes.Buffer
	if err := runCmd(append([]string{"plan"}, []string{"--node", "a-1", "--local", "testdata/cluster-a.yaml"}...), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"leader (kilo0 up with 10.4.0.1/16)", "25s (peer-spec)", "REJECTED", "location:nbg1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
	for _, args := range [][]string{
		{"--local", "testdata/cluster-a.yaml"},
		{"--node", "a-1"},
		{"--node", "nope", "--local", "testdata/cluster-a.yaml"},
		{"--node", "a-1", "--local", "testdata/cluster-a.yaml", "--mesh-granularity", "x"},
		{"--node", "a-1", "--local", "testdata/cluster-a.yaml", "-o", "xml"},
		{"--node", "a-1", "--local", "testdata/missing.yaml"},
	} {
		if err := runCmd(append([]string{"plan"}, args...), &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/golden from `meshlet plan` (review the diff)")

// TestPlanGolden compares the whole output of `meshlet plan` on the testdata
// dumps with testdata/golden: a change anywhere in what the planner decides
// shows up here. Update with -update-golden and review the diff.
func TestPlanGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"a-1-leader-with-remote", []string{"--node", "a-1", "--local", "testdata/cluster-a.yaml", "--remote", "cluster-b=testdata/cluster-b.yaml"}},
		{"a-2-nonleader", []string{"--node", "a-2", "--local", "testdata/cluster-a.yaml", "--remote", "cluster-b=testdata/cluster-b.yaml"}},
		{"a-2-nonleader-cozystack-cilium", []string{"--node", "a-2", "--local", "testdata/cluster-a.yaml", "--remote", "cluster-b=testdata/cluster-b.yaml",
			"--local=false", "--compatibility=cilium", "--encapsulate=crosssubnet", "--subnet=100.66.0.0/16", "--tunnel-device=cilium_tunl"}},
		{"a-3-other-location", []string{"--node", "a-3", "--local", "testdata/cluster-a.yaml", "--remote", "cluster-b=testdata/cluster-b.yaml"}},
		{"b-1-remote-side", []string{"--node", "b-1", "--local", "testdata/cluster-b.yaml", "--remote", "cluster-a=testdata/cluster-a.yaml", "--cluster-name", "cluster-b"}},
		// docs/dual-stack.md: the same dual-stack cluster as kg plans it
		// (one family), then with both; an IPv6-only cluster.
		{"dual-d-1-single-stack", []string{"--node", "d-1", "--local", "testdata/cluster-dual.yaml"}},
		{"dual-d-1-leader", []string{"--node", "d-1", "--local", "testdata/cluster-dual.yaml", "--dual-stack-subnet=fd4b::/64"}},
		{"dual-d-2-nonleader-cozystack-cilium", []string{"--node", "d-2", "--local", "testdata/cluster-dual.yaml", "--dual-stack-subnet=fd4b::/64",
			"--local=false", "--compatibility=cilium", "--encapsulate=crosssubnet", "--subnet=100.66.0.0/16", "--tunnel-device=cilium_tunl"}},
		{"v6-s-1-leader", []string{"--node", "s-1", "--local", "testdata/cluster-v6.yaml", "--subnet=fd4b::/64"}},
		{"v6-s-2-nonleader-cilium", []string{"--node", "s-2", "--local", "testdata/cluster-v6.yaml", "--subnet=fd4b::/64",
			"--local=false", "--compatibility=cilium", "--encapsulate=crosssubnet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := runCmd(append([]string{"plan"}, append(tc.args, "-o", "json")...), &out); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "golden", tc.name+".json")
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (create it with -update-golden)", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("meshlet plan %s differs from %s (run with -update-golden and review the diff):\n%s",
					strings.Join(tc.args, " "), path, lineDiff(string(want), out.String()))
			}
		})
	}
}

// lineDiff lists the lines that differ, with their numbers.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "%d:\n  want %s\n  got  %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}
