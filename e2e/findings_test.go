package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/harness"
)

// namedIDs are the findings of issue 22 (agent/core/diagnose/findings.go).
var namedIDs = []string{diagnose.IDLocationLabel, diagnose.IDTopologyLabel, diagnose.IDDuplicateKey, diagnose.IDNATNoKeepalive,
	diagnose.IDNoReply, diagnose.IDInboundBlocked, diagnose.IDIPForwardOff, diagnose.IDPeerDNS, diagnose.IDCiliumTunl, diagnose.IDPeerAdmission,
	diagnose.IDPrivateEndpoint, diagnose.IDLeaderPathDropped, diagnose.IDPathMTU, diagnose.IDHostRoute}

// findings runs `meshlet diagnose` on cluster c with every running node's
// `meshlet status -o json` (read on the node, passed with --status-file:
// there is no kubelet for pods/exec here) and returns its findings, its
// exit status and the statuses.
func findings(ctx context.Context, t *testing.T, env *harness.Env, c *harness.Cluster) ([]diagnose.Finding, int, map[string]status.Status) {
	t.Helper()
	meshlet := os.Getenv("MESHLET_BIN")
	args := []string{"diagnose", "--kubeconfig", c.AdminKubeconfig(), "--namespace", harness.Namespace,
		"--cluster-name", c.Name, "--subnet", c.WGSubnet.String(), "-o", "json"}
	sts := map[string]status.Status{}
	for _, n := range c.Nodes() {
		if !n.Running() {
			continue
		}
		out, err := n.Exec(ctx, meshlet, "status", "-o", "json")
		if err != nil {
			t.Logf("status of %s: %v", n.Name, err)
			continue
		}
		var st status.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status of %s: %v\n%s", n.Name, err, out)
		}
		sts[n.Name] = st
		file := filepath.Join(env.Dir(), "status-"+n.Name+".json")
		must(t, os.WriteFile(file, []byte(out), 0o600))
		args = append(args, "--status-file", n.Name+"="+file)
	}
	cmd := exec.CommandContext(ctx, meshlet, args...)
	out, err := cmd.Output()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("meshlet diagnose: %v", err)
	}
	var fs []diagnose.Finding
	if err := json.Unmarshal(out, &fs); err != nil {
		t.Fatalf("meshlet diagnose -o json: %v\n%s", err, out)
	}
	return fs, code, sts
}

// named is the named findings of fs as "ID subject".
func named(fs []diagnose.Finding) []string {
	var out []string
	for _, f := range fs {
		if slices.Contains(namedIDs, f.ID) {
			out = append(out, f.ID+" "+f.Subject)
		}
	}
	return out
}

// TestFindings causes each fault of issue 22 for real on one cluster and
// waits until `meshlet diagnose` (exit status 1) and, for a fault on one
// node, that node's `meshlet status` name it; the healthy mesh before, and
// after each fault is undone, names none. Locations x (a-x1 leads a-x2)
// and y (a-y1); each fault adds or changes its own nodes.
func TestFindings(t *testing.T) {
	env, ctx := newEnv(t)
	l := harness.OneCluster(2)
	l.Clusters[0].Nodes = append(l.Clusters[0].Nodes, harness.NodeSpec{Name: "a-y1", Location: "y"})
	must(t, env.Build(ctx, l))
	a := env.Cluster("cluster-a")
	ax1, ax2, ay1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("a-y1")
	_, err := ax1.WaitReachable(ctx, ay1.PodIP, 30*time.Second)
	must(t, err)
	_, err = ax2.WaitReachable(ctx, ay1.PodIP, 30*time.Second)
	must(t, err)
	client, err := kubernetes.NewForConfig(a.RestConfig())
	must(t, err)

	healthy := func(t *testing.T, when string) {
		t.Helper()
		fs, code, _ := findings(ctx, t, env, a)
		if got := named(fs); len(got) > 0 {
			t.Errorf("%s: the healthy mesh has findings %q", when, got)
		}
		report(t, "%s: healthy mesh, %d findings, none named, diagnose exit status %d", when, len(fs), code)
	}
	// await polls diagnose until it reports id about subject and, when
	// onNode is set, that node's status does too; it returns how long
	// that took from since and the finding.
	await := func(t *testing.T, since time.Time, id, subject string, onNode *harness.Node) (time.Duration, diagnose.Finding) {
		t.Helper()
		var got diagnose.Finding
		var last []string
		err := harness.Poll(ctx, 90*time.Second, 500*time.Millisecond, id+" on "+subject, func() (bool, error) {
			fs, code, sts := findings(ctx, t, env, a)
			last = named(fs)
			i := slices.IndexFunc(fs, func(f diagnose.Finding) bool { return f.ID == id && f.Subject == subject })
			if i < 0 || code != 1 {
				return false, nil
			}
			got = fs[i]
			if onNode != nil && !slices.ContainsFunc(sts[onNode.Name].Findings, func(f diagnose.Finding) bool { return f.ID == id }) {
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%v; diagnose's named findings: %q", err, last)
		}
		took := time.Since(since)
		t.Logf("OUTPUT %s: %s\n  evidence: %s\n  fix: %s (%s)", got.ID, got.Message, strings.Join(got.Evidence, "; "), got.Fix, got.Runbook)
		if onNode != nil {
			text, err := onNode.Exec(ctx, os.Getenv("MESHLET_BIN"), "status")
			must(t, err)
			if !strings.Contains(text, "["+id+"]") {
				t.Errorf("meshlet status on %s lacks [%s]:\n%s", onNode.Name, id, text)
			}
		}
		return took, got
	}
	patchNode := func(t *testing.T, name, patch string) {
		t.Helper()
		_, err := client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		must(t, err)
	}
	// gone waits until no finding names subject any more.
	gone := func(t *testing.T, subject string) {
		t.Helper()
		must(t, harness.Poll(ctx, 60*time.Second, 500*time.Millisecond, "findings on "+subject+" cleared", func() (bool, error) {
			fs, _, _ := findings(ctx, t, env, a)
			return !slices.ContainsFunc(fs, func(f diagnose.Finding) bool { return f.ID != "" && strings.Contains(f.Subject, subject) }), nil
		}))
	}

	// remove takes a fault's node out of the mesh and waits until no
	// finding names it.
	remove := func(t *testing.T, n *harness.Node) {
		t.Helper()
		n.PowerOff()
		must(t, a.DeleteNode(ctx, n.Name))
		gone(t, n.Name)
	}

	healthy(t, "before the faults")

	t.Run("location label, not annotation", func(t *testing.T) {
		start := time.Now()
		patchNode(t, "a-x2", fmt.Sprintf(`{"metadata":{"labels":{%q:"x"},"annotations":{%q:null}}}`, topology.AnnotationLocation, topology.AnnotationLocation))
		took, _ := await(t, start, diagnose.IDLocationLabel, "node a-x2", ax2)
		report(t, "%s on a-x2 detected in %s (diagnose and a-x2's status)", diagnose.IDLocationLabel, took.Round(10*time.Millisecond))
		patchNode(t, "a-x2", fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:"x"}}}`, topology.AnnotationLocation, topology.AnnotationLocation))
		gone(t, "a-x2")
	})

	t.Run("topology label not the one --topology-label names", func(t *testing.T) {
		start := time.Now()
		patchNode(t, "a-x2", fmt.Sprintf(`{"metadata":{"labels":{"topology.kubernetes.io/zone":"x"},"annotations":{%q:null}}}`, topology.AnnotationLocation))
		took, _ := await(t, start, diagnose.IDTopologyLabel, "node a-x2", ax2)
		report(t, "%s on a-x2 (zone label, --topology-label region) detected in %s", diagnose.IDTopologyLabel, took.Round(10*time.Millisecond))
		patchNode(t, "a-x2", fmt.Sprintf(`{"metadata":{"labels":{"topology.kubernetes.io/zone":null},"annotations":{%q:"x"}}}`, topology.AnnotationLocation))
		gone(t, "a-x2")
	})

	t.Run("two nodes with one key", func(t *testing.T) {
		// A node cloned from a-y1's image: same key file.
		n, err := a.AddNode(ctx, harness.NodeSpec{Name: "a-y2", Location: "y"})
		must(t, err)
		key, err := os.ReadFile(filepath.Join(ay1.Dir, "key"))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(n.Dir, "key"), key, 0o600))
		start := time.Now()
		must(t, n.Start(ctx))
		took, f := await(t, start, diagnose.IDDuplicateKey, "nodes a-y1, a-y2", n)
		report(t, "%s (a-y1, a-y2) detected in %s from a-y2's start: %s", diagnose.IDDuplicateKey, took.Round(10*time.Millisecond), strings.Join(f.Evidence, "; "))
		remove(t, n)
	})

	t.Run("behind NAT without keepalive", func(t *testing.T) {
		// A location n behind a NAT router, advertising its LAN address
		// (all it has) and no persistent-keepalive. Its handshakes (its
		// health probes as n's leader) reach a-x1 from the router's WAN
		// address, which a-x1's device learns.
		r, err := env.AddRouter(ctx, "r1")
		must(t, err)
		n, err := a.AddNode(ctx, harness.NodeSpec{Name: "a-n1", Location: "n", Behind: r})
		must(t, err)
		start := time.Now()
		must(t, n.Start(ctx))
		took, f := await(t, start, diagnose.IDNATNoKeepalive, "node a-n1", nil)
		report(t, "%s on a-n1 detected in %s from its start: %s", diagnose.IDNATNoKeepalive, took.Round(10*time.Millisecond), strings.Join(f.Evidence, "; "))
		remove(t, n)
	})

	t.Run("inbound UDP 51820 dropped", func(t *testing.T) {
		// A new location z whose node's firewall drops inbound WireGuard
		// from the start; the leaders' health probes send the handshakes.
		n, err := a.AddNode(ctx, harness.NodeSpec{Name: "a-z1", Location: "z"})
		must(t, err)
		nft := exec.CommandContext(ctx, "ip", "netns", "exec", n.NS, "nft", "-f", "-")
		nft.Stdin = strings.NewReader("table inet e2e_in {\n\tchain input {\n\t\ttype filter hook input priority 0; udp dport 51820 drop;\n\t}\n}\n")
		if out, err := nft.CombinedOutput(); err != nil {
			t.Fatalf("nft: %v\n%s", err, out)
		}
		start := time.Now()
		must(t, n.Start(ctx))
		took, _ := await(t, start, diagnose.IDNoReply, "node a-z1", n)
		report(t, "%s on a-z1 (its own status) detected in %s from its start", diagnose.IDNoReply, took.Round(10*time.Millisecond))
		took, f := await(t, start, diagnose.IDInboundBlocked, "node a-z1", nil)
		report(t, "%s on a-z1 (a-z1's and the leaders' counters) detected in %s from its start: %s", diagnose.IDInboundBlocked,
			took.Round(10*time.Millisecond), strings.Join(f.Evidence, "; "))
		remove(t, n)
	})

	t.Run("private endpoints across locations, no route between", func(t *testing.T) {
		// Two locations, each behind its own router on its own private
		// LAN, each node advertising its LAN address (a cloud tenant's
		// internal IP): each reaches location x through its NAT, and
		// neither the other's LAN. Their handshakes to each other leave
		// by the default route and go nowhere.
		r2, err := env.AddRouter(ctx, "r2")
		must(t, err)
		r3, err := env.AddRouter(ctx, "r3")
		must(t, err)
		p1, err := a.AddNode(ctx, harness.NodeSpec{Name: "a-p1", Location: "p", Behind: r2})
		must(t, err)
		q1, err := a.AddNode(ctx, harness.NodeSpec{Name: "a-q1", Location: "q", Behind: r3})
		must(t, err)
		start := time.Now()
		must(t, p1.Start(ctx))
		must(t, q1.Start(ctx))
		took, f := await(t, start, diagnose.IDPrivateEndpoint, "node a-p1", p1)
		report(t, "%s on a-p1 (its own status) detected in %s from the start: %s", diagnose.IDPrivateEndpoint, took.Round(10*time.Millisecond), strings.Join(f.Evidence, "; "))
		remove(t, p1)
		remove(t, q1)
	})

	// leaderOfX is location x's leader now (the label faults above move
	// a-x2 out of x and back, and the Lease may change hands).
	leaderOfX := func(t *testing.T) (leader, other *harness.Node) {
		t.Helper()
		must(t, harness.Poll(ctx, 30*time.Second, 500*time.Millisecond, "location x's leader", func() (bool, error) {
			_, _, sts := findings(ctx, t, env, a)
			switch {
			case sts["a-x1"].Role == "leader" && sts["a-x2"].Role == "non-leader":
				leader, other = ax1, ax2
			case sts["a-x2"].Role == "leader" && sts["a-x1"].Role == "non-leader":
				leader, other = ax2, ax1
			default:
				return false, nil
			}
			return true, nil
		}))
		return leader, other
	}

	t.Run("leader with ip_forward off", func(t *testing.T) {
		// meshlet sets ip_forward=1 at every reconcile: the fault lasts
		// while something keeps turning it off (here a loop in the
		// leader's namespace, as a host tool re-applying sysctls would).
		leader, other := leaderOfX(t)
		fctx, stop := context.WithCancel(ctx)
		off := exec.CommandContext(fctx, "ip", "netns", "exec", leader.NS, "sh", "-c", "while :; do echo 0 > /proc/sys/net/ipv4/ip_forward; sleep 0.05; done")
		must(t, off.Start())
		start := time.Now()
		took, _ := await(t, start, diagnose.IDIPForwardOff, "node "+leader.Name, leader)
		lost := 0
		if r, err := ay1.Ping(ctx, other.PodIP, 5, 200*time.Millisecond, time.Second); err == nil {
			lost = r.Lost()
		}
		report(t, "%s on %s detected in %s; a-y1 → %s's pod through it: %d of 5 pings lost", diagnose.IDIPForwardOff, leader.Name, took.Round(10*time.Millisecond), other.Name, lost)
		stop()
		_ = off.Wait()
		gone(t, leader.Name)
	})

	t.Run("cloud dropping what the leader forwards", func(t *testing.T) {
		// The leader's underlay port drops packets not addressed to or
		// from its own address (cloud anti-spoofing); unencapsulated,
		// everything the leader forwards for its non-leader is such a
		// packet. The non-leader's echo to the leader's WireGuard IP
		// goes unanswered, the leader's own address answers.
		leader, other := leaderOfX(t)
		lift, err := leader.DropForeignAddresses(ctx)
		must(t, err)
		start := time.Now()
		took, f := await(t, start, diagnose.IDLeaderPathDropped, "node "+other.Name, other)
		lost := 0
		if r, err := ay1.Ping(ctx, other.PodIP, 5, 200*time.Millisecond, time.Second); err == nil {
			lost = r.Lost()
		}
		report(t, "%s on %s (leader %s's underlay dropping foreign addresses) detected in %s; a-y1 → %s's pod meanwhile: %d of 5 pings lost; %s",
			diagnose.IDLeaderPathDropped, other.Name, leader.Name, took.Round(10*time.Millisecond), other.Name, lost, strings.Join(f.Evidence, "; "))
		must(t, lift())
		gone(t, other.Name)
	})

	t.Run("path MTU smaller than the WireGuard MTU assumes", func(t *testing.T) {
		// a-y1's link takes frames of 1400 B: what x's leader sends it
		// at kilo0's full 1420 B crosses the underlay as 1500 B and is
		// dropped on the way in, silently (no ICMP comes back).
		leader, _ := leaderOfX(t)
		setMTU := func(mtu string) {
			t.Helper()
			if out, err := exec.CommandContext(ctx, "ip", "-n", ay1.NS, "link", "set", "eth0", "mtu", mtu).CombinedOutput(); err != nil {
				t.Fatalf("ip link set eth0 mtu %s: %v\n%s", mtu, err, out)
			}
		}
		setMTU("1400")
		start := time.Now()
		took, f := await(t, start, diagnose.IDPathMTU, "node "+leader.Name, leader)
		pingOK := func(size string) bool {
			_, err := leader.Exec(ctx, "ping", "-n", "-q", "-c", "2", "-W", "1", "-M", "do", "-s", size, "-I", leader.PodIP.String(), ay1.PodIP.String())
			return err == nil
		}
		report(t, "%s on %s (a-y1's link MTU 1400) detected in %s; %s's pod → a-y1's pod: 56 B answered %v, 1392 B (1420 with headers, DF) answered %v; %s",
			diagnose.IDPathMTU, leader.Name, took.Round(10*time.Millisecond), leader.Name, pingOK("56"), pingOK("1392"), strings.Join(f.Evidence, "; "))
		setMTU("1500")
		gone(t, leader.Name)
	})

	t.Run("peer endpoint DNS name does not resolve", func(t *testing.T) {
		_, key := harness.NewKeyPair()
		start := time.Now()
		must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"gone"},
"spec":{"allowedIPs":["10.9.0.1/32"],"publicKey":%q,"endpoint":{"dnsOrIP":{"dns":"gone.meshlet.invalid"},"port":51820}}}`, key)))
		leader, _ := leaderOfX(t)
		took, f := await(t, start, diagnose.IDPeerDNS, "node "+leader.Name, leader)
		report(t, "%s (Peer gone) on %s detected in %s: %s", diagnose.IDPeerDNS, leader.Name, took.Round(10*time.Millisecond), strings.Join(f.Evidence, "; "))
		must(t, a.DeletePeer(ctx, "gone"))
		gone(t, leader.Name)
		gone(t, "a-y1")
	})

	t.Run("cilium_tunl absent with --compatibility=cilium", func(t *testing.T) {
		// Location c on Cilium's flags; this kernel has no ipip, so
		// neither cilium_tunl nor tunl0 can exist: their reconciles fail.
		var ns []*harness.Node
		for _, name := range []string{"a-c1", "a-c2"} {
			n, err := a.AddNode(ctx, harness.NodeSpec{Name: name, Location: "c", ExtraArgs: []string{"--compatibility=cilium", "--encapsulate=always"}})
			must(t, err)
			ns = append(ns, n)
		}
		start := time.Now()
		for _, n := range ns {
			must(t, n.Launch())
		}
		took, f := await(t, start, diagnose.IDCiliumTunl, "node a-c1", ns[0])
		fs, _, _ := findings(ctx, t, env, a)
		var today []string
		for _, x := range fs {
			if x.Check == "agents" && x.Subject == "node a-c1" {
				today = append(today, x.Message)
			}
		}
		report(t, "%s on a-c1 detected in %s from its start: %s; the agent's own reports besides: %q", diagnose.IDCiliumTunl,
			took.Round(10*time.Millisecond), strings.Join(f.Evidence, "; "), today)
		for _, n := range ns {
			n.PowerOff()
			must(t, a.DeleteNode(ctx, n.Name))
		}
		gone(t, "a-c")
	})

	t.Run("a webhook refusing Peers", func(t *testing.T) {
		// Kilo's Peer validation webhook as it is when its Deployment is
		// gone: registered, failing closed, nothing serving it.
		fail, none := admissionv1.Fail, admissionv1.SideEffectClassNone
		url := "https://127.0.0.1:1/validate"
		hook := &admissionv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "kilo-peer-validation"},
			Webhooks: []admissionv1.ValidatingWebhook{{Name: "peers.kilo.squat.ai",
				ClientConfig: admissionv1.WebhookClientConfig{URL: &url},
				Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule: admissionv1.Rule{APIGroups: []string{"kilo.squat.ai"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"peers"}}}},
				FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}}},
		}
		start := time.Now()
		_, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, hook, metav1.CreateOptions{})
		must(t, err)
		drop := func() {
			_ = client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, hook.Name, metav1.DeleteOptions{})
		}
		t.Cleanup(drop)
		took, f := await(t, start, diagnose.IDPeerAdmission, "cluster "+a.Name, nil)
		// The fault is real: a Peer cannot be created.
		if _, err := a.ApplyPeer(ctx, "refused", "10.9.0.2/32", ""); err == nil {
			t.Error("a Peer was created while the webhook refuses them")
		}
		report(t, "%s (an unserved validating webhook, failing closed) detected in %s: %s", diagnose.IDPeerAdmission,
			took.Round(10*time.Millisecond), strings.Join(f.Evidence, "; "))
		drop()
		gone(t, "cluster "+a.Name)
	})

	healthy(t, "after the faults")
}
