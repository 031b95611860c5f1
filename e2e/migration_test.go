package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// kgLeftovers is what Kilo's kg leaves in iptables on a leader when it
// stops without cleaning up (--clean-up=false, or SIGKILL), with its
// default --cni=true (the FORWARD rules): docs/migration.md.
var kgLeftovers = [][]string{
	{"-t", "nat", "-N", "KILO-NAT"},
	{"-t", "nat", "-A", "KILO-NAT", "-d", "100.66.0.0/24", "-m", "comment", "--comment", "Kilo: do not NAT packets destined for WireGuared IPs", "-j", "RETURN"},
	{"-t", "nat", "-A", "KILO-NAT", "-m", "comment", "--comment", "Kilo: NAT remaining packets", "-j", "MASQUERADE"},
	{"-t", "nat", "-A", "POSTROUTING", "-s", "10.1.0.0/16", "-m", "comment", "--comment", "Kilo: jump to KILO-NAT chain", "-j", "KILO-NAT"},
	{"-t", "filter", "-N", "KILO-IPIP"},
	{"-t", "filter", "-N", "KILO-DROP"},
	{"-t", "filter", "-A", "KILO-DROP", "-m", "comment", "--comment", "Kilo: reject other IPIP traffic", "-j", "DROP"},
	{"-t", "filter", "-A", "KILO-IPIP", "-j", "KILO-DROP"},
	{"-t", "filter", "-A", "INPUT", "-p", "4", "-m", "comment", "--comment", "Kilo: jump to IPIP chain", "-j", "KILO-IPIP"},
	{"-t", "filter", "-A", "FORWARD", "-s", "10.1.0.0/16", "-m", "comment", "--comment", "Kilo: forward packets from the pod subnet", "-j", "ACCEPT"},
	{"-t", "filter", "-A", "FORWARD", "-d", "10.1.0.0/16", "-m", "comment", "--comment", "Kilo: forward packets to the pod subnet", "-j", "ACCEPT"},
}

// Scenario: a node that ran kg becomes a meshlet node (docs/migration.md).
// a-x1's data plane is turned into what kg leaves when it is SIGKILLed or
// redeployed with --clean-up=false: kilo0 left up with its peers and
// sessions, its key only in kg's key file (/var/lib/kilo/key), its routes
// and rules without meshlet's routing protocol (as kg writes them), kg's
// KILO-* chains and --cni=true FORWARD rules; its Node keeps the
// annotations. meshlet then starts with --key-file pointing at kg's key
// while a 10/s ping runs to a remote pod: same public key, no session
// re-created, no ping lost, kg's KILO-* chains removed, the routes taken
// over. Then the way back: meshlet stops (SIGTERM) and leaves kilo0, the
// routes and kg's key file as they were, which is what kg needs to take the
// node again with the same key.
func TestMigrationFromKg(t *testing.T) {
	env, ctx := newEnv(t)
	must(t, env.Build(ctx, harness.Small(1, "z", "w")))
	a1, z1 := env.Node("a-x1"), env.Node("b-z1")
	_, err := a1.WaitReachable(ctx, z1.PodIP, 30*time.Second)
	must(t, err)
	pub, err := a1.PublicKey(ctx)
	must(t, err)
	hs := settledHandshakes(ctx, t, a1)
	ann, err := a1.Cluster.Annotations(ctx, a1.Name)
	must(t, err)

	// kg's node: the agent gone (SIGKILL), the device left in place.
	must(t, a1.Stop(syscall.SIGKILL))
	kgKey := filepath.Join(a1.Dir, "var-lib-kilo", "key")
	key, err := os.ReadFile(filepath.Join(a1.Dir, "key"))
	must(t, err)
	must(t, os.MkdirAll(filepath.Dir(kgKey), 0o700))
	must(t, os.WriteFile(kgKey, key, 0o600))
	// meshlet's own key file is gone: a meshlet that ignored kg's key
	// would make a new one, and every peer would have to learn it.
	must(t, os.Remove(filepath.Join(a1.Dir, "key")))
	routes, err := a1.Routes(ctx)
	must(t, err)
	for _, r := range routes {
		// The same route as kg writes it: routing protocol static (Kilo's
		// routes all carry it), not meshlet's.
		kg := strings.Replace(r, " proto "+harness.RouteProtocol, " proto static", 1)
		_, err := a1.Exec(ctx, "sh", "-c", "ip route del "+r+" && ip route add "+kg)
		must(t, err)
	}
	kgRules, err := a1.Exec(ctx, "ip", "rule", "show", "proto", harness.RouteProtocol)
	must(t, err)
	for _, line := range strings.Split(strings.TrimSpace(kgRules), "\n") {
		if line == "" {
			continue
		}
		_, rule, _ := strings.Cut(line, ":")
		rule = strings.TrimSpace(rule)
		_, err := a1.Exec(ctx, "sh", "-c", "ip rule del "+rule+" && ip rule add "+strings.Replace(rule, " proto "+harness.RouteProtocol, "", 1))
		must(t, err)
	}
	for _, r := range kgLeftovers {
		_, err := a1.Exec(ctx, append([]string{"iptables", "-w"}, r...)...)
		must(t, err)
	}
	if left, _ := a1.Routes(ctx); len(left) != 0 {
		t.Fatalf("meshlet's routes still there after turning them into kg's: %v", left)
	}

	// meshlet takes over the node with kg's key, during a 10/s ping.
	a1.ExtraArgs = append(a1.ExtraArgs, "--key-file="+kgKey)
	var ping harness.PingResult
	var pingErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ping, pingErr = a1.Ping(ctx, z1.PodIP, 80, 100*time.Millisecond, time.Second)
	}()
	start := time.Now()
	must(t, a1.Start(ctx))
	took := time.Since(start)
	must(t, harness.Poll(ctx, 15*time.Second, 100*time.Millisecond, "kg's KILO-* chains and jumps removed", func() (bool, error) {
		out, err := a1.Exec(ctx, "iptables-save")
		return err == nil && !strings.Contains(out, "KILO-"), err
	}))
	// kg's --cni=true FORWARD accepts stay (netlinkx.CleanupKilo says why).
	if out, _ := a1.Exec(ctx, "iptables-save", "-t", "filter"); strings.Count(out, `"Kilo: forward packets`) != 2 {
		t.Errorf("kg's FORWARD rules for the pod subnet: want both kept:\n%s", out)
	}
	wg.Wait()
	must(t, pingErr)
	pub2, err := a1.PublicKey(ctx)
	must(t, err)
	if pub2 != pub {
		t.Errorf("public key changed: %s -> %s (kg's key file not used)", pub, pub2)
	}
	ann2, err := a1.Cluster.Annotations(ctx, a1.Name)
	must(t, err)
	if ann2[topology.AnnotationKey] != ann[topology.AnnotationKey] {
		t.Errorf("kilo.squat.ai/key %q -> %q", ann[topology.AnnotationKey], ann2[topology.AnnotationKey])
	}
	after := handshakes(t, a1)
	recreated := 0
	for k, before := range hs {
		if !after[k].Equal(before) {
			recreated++
			t.Errorf("peer %s: last handshake %v -> %v: session re-created", k, before, after[k])
		}
	}
	if _, err := os.Stat(filepath.Join(a1.Dir, "key")); err == nil {
		t.Error("meshlet wrote a key file of its own next to kg's")
	}
	mine, err := a1.Routes(ctx)
	must(t, err)
	// kg's copies were replaced, not left next to meshlet's.
	for _, r := range routes {
		dst := strings.Fields(r)[0]
		out, err := a1.Exec(ctx, "ip", "route", "show", "table", "all", "exact", dst)
		must(t, err)
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l != "" && !strings.Contains(l, "proto "+harness.RouteProtocol) {
				t.Errorf("kg's route left next to meshlet's: %s", l)
			}
		}
	}
	report(t, "kg -> meshlet on a-x1 (meshlet ready in %v) during a 10/s ping: %d/%d pings lost, %d of %d sessions re-created, public key unchanged: %v, kg's KILO-* chains and jumps removed (its FORWARD accepts kept), %d routes now meshlet's",
		took.Round(time.Millisecond), ping.Lost(), ping.Sent, recreated, len(hs), pub2 == pub, len(mine))
	if ping.Lost() > 1 {
		t.Errorf("%d pings lost moving from kg to meshlet, want ≤ 1", ping.Lost())
	}

	// The way back: meshlet stops and leaves the node to kg.
	must(t, a1.Stop(syscall.SIGTERM))
	key2, err := os.ReadFile(kgKey)
	must(t, err)
	if !bytes.Equal(key, key2) {
		t.Error("kg's key file changed")
	}
	back, err := a1.Ping(ctx, z1.PodIP, 10, 100*time.Millisecond, time.Second)
	must(t, err)
	report(t, "meshlet stopped (SIGTERM) for the way back to kg: kilo0 and routes left, kg's key file unchanged; %d/%d pings answered with no agent", back.Received, back.Sent)
	if back.Received == 0 {
		t.Error("no traffic after meshlet stopped: the data plane was not left for kg")
	}
}
