package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func planJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	var out bytes.Buffer
	if err := runPlan(context.Background(), append(args, "-o", "json"), &out); err != nil {
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
	if err := runPlan(context.Background(), []string{"--node", "a-1", "--local", "testdata/cluster-a.yaml"}, &out); err != nil {
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
		if err := runPlan(context.Background(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
