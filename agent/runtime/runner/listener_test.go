package runner_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/runner"
)

// TestListenerAsKgs: the network listener answers kg's paths as kg's does
// where meshlet keeps them — /health 200 with no body, /metrics with
// meshlet_build_info and, with --metrics-compat=kilo, kg's kilo_peers
// counted from the snapshot (the cluster's accepted Peers) — and not
// /graph, /status or Go's profiles (docs/dropin.md#listener).
func TestListenerAsKgs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	srv, _ := grantsCluster(t, "cluster-b-kubeconfig")
	for i, name := range []string{"laptop", "phone"} {
		applyBytes(t, srv, `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"`+name+`"},
"spec":{"allowedIPs":["10.5.0.`+string(rune('1'+i))+`/32"],"publicKey":"`+key(byte(10+i)).String()+`"}}`)
	}
	applyBytes(t, srv, `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"bad-key"},
"spec":{"allowedIPs":["10.5.0.9/32"],"publicKey":"not-a-key"}}`)

	var c config.Config
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	c.RegisterTopology(fs)
	c.RegisterAgent(fs)
	c.Namespace, c.Local, c.TopologyLabel, c.MetricsCompat = "kilo-system", true, "topology.kubernetes.io/region", "kilo"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := runner.New(runner.Options{Config: c, Node: "a-1", RestConfig: srv.AdminConfig(), WireGuard: newFakeWG(), Host: fakeHost{},
		Self: fakeSelf{topology.Self{PublicKey: key(1), DefaultInterface: "eth0", Version: "v1",
			Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: netip.MustParsePrefix("192.168.1.1/24")}}}},
		Version: "v9.8.7", Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	defer func() { cancel(); <-done }()
	addr, err := a.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- a.Run(ctx) }()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var metrics string
	for deadline := time.Now().Add(30 * time.Second); ; waitTick() {
		_, metrics = get("/metrics")
		if a.Loop.Ready() && strings.Contains(metrics, "\nkilo_peers 2\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no kilo_peers 2 (2 valid Peers, 1 rejected) once ready (%v):\n%s", a.Loop.Ready(), metrics)
		}
	}
	if !strings.Contains(metrics, `meshlet_build_info{goversion="go`) || !strings.Contains(metrics, `version="v9.8.7"} 1`) {
		t.Errorf("/metrics has no meshlet_build_info of version v9.8.7")
	}
	if code, body := get("/health"); code != http.StatusOK || body != "" {
		t.Errorf("/health: %d %q, want 200 and no body (kg's)", code, body)
	}
	for _, p := range []string{"/graph", "/graph?format=dot", "/status", "/debug/pprof/"} {
		if code, _ := get(p); code != http.StatusNotFound {
			t.Errorf("%s on the network listener: %d, want 404", p, code)
		}
	}
}
