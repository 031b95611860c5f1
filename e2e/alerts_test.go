package e2e

import (
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

// repoFile is a path in the repository, from this source file.
func repoFile(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", rel)
}

// Scenario 11: the shipped alerts (manifests/monitoring/rules.yaml) on a
// real Prometheus scraping every meshlet of a real mesh, and the shipped
// dashboard's queries against it.
//
// Two clusters, one node per location, every node a leader. Keepalives
// (docs/wireguard.md, docs/architecture.md#keepalive): a-x1's
// annotation gives its peers 250 s, b-z1's gives its peers 2 s, a-y1 and
// b-w1 have none. So:
//   - b-z1 → a-x1 (keepalive 2, allowed 197 s) is cut off (UDP dropped at
//     b-z1): MeshletPeerDown must fire on b-z1; the delay is reported
//     against the allowed age.
//   - a-x1 → a-y1 (keepalive 250, allowed 445 s) carries only keepalives:
//     its handshake age climbs past 210 s (where the old fixed rule's
//     expression was true) until the keepalive at 250 s renews it; it must
//     stay up and never alert, not even pending.
//   - a-y1 ↔ b-w1 have no keepalive and no traffic: no meshlet_peer_up
//     series, no alert.
//
// Then a kg-run node and a Peer change (for a session repair), and every
// dashboard panel's queries must return data; the kilo_* and exporter
// series Kilo's dashboard reads are there; an agent stopped and a remote
// API server stopped make their alerts pending. WireGuard's timers bound
// the wall time: the cut peer cannot be judged down before 197 s.
//
// The same agents are scraped at the same time by a second Prometheus as
// the drop-in's are on Cozystack: job kilo (the drop-in's VMPodScrape), the
// namespace, pod and container labels of Kilo's DaemonSet in cozy-kilo,
// and the cluster label VMAgent's externalLabels add to every series (so
// meshlet's own cluster label is exported_cluster there), evaluating the
// drop-in VMRule's groups. The peer-health alert fires there too, the
// agent and remote-cluster alerts name the right target and cluster, and
// every dashboard query returns data with the cluster variable set to one
// cluster, that cluster's nodes only.
func TestAlertsOnPrometheus(t *testing.T) {
	start := time.Now()
	env, ctx := newEnv(t)
	if _, err := exec.LookPath("prometheus"); err != nil {
		apiserver.SkipOrFail(t, "prometheus not installed (hack/install-deps.sh): %v", err)
	}
	ka := func(s int) map[string]string {
		return map[string]string{topology.AnnotationPersistentKeepalive: fmt.Sprint(s)}
	}
	// Health probes are traffic on every tunnel between leaders
	// (docs/failover.md#health): they renew handshakes every 2 min and give
	// idle peers traffic. This scenario is about WireGuard's timers under
	// keepalives alone, so its agents do not probe.
	compat := []string{"--metrics-compat=kilo,wireguard-exporter", "--health-probe-interval=0"}
	l := harness.Layout{Clusters: []harness.ClusterLayout{
		{ClusterSpec: harness.ClusterSpec{Name: "cluster-a", PodNet: netip.MustParsePrefix("10.1.0.0/16"), WGSubnet: netip.MustParsePrefix("100.66.0.0/24"), ExtraArgs: compat},
			Nodes: []harness.NodeSpec{{Name: "a-x1", Location: "x", Annotations: ka(250)}, {Name: "a-y1", Location: "y"}}},
		{ClusterSpec: harness.ClusterSpec{Name: "cluster-b", PodNet: netip.MustParsePrefix("10.2.0.0/16"), WGSubnet: netip.MustParsePrefix("100.66.1.0/24"), ExtraArgs: compat},
			Nodes: []harness.NodeSpec{{Name: "b-z1", Location: "z", Annotations: ka(2)}, {Name: "b-w1", Location: "w"}}},
	}}
	must(t, env.Build(ctx, l))
	ax, ay, bz, bw := env.Node("a-x1"), env.Node("a-y1"), env.Node("b-z1"), env.Node("b-w1")
	prom, err := env.StartPrometheus(ctx, harness.PrometheusOptions{Rules: []string{repoFile("manifests/monitoring/rules.yaml")}},
		ax, ay, bz, bw)
	must(t, err)
	dropin, err := env.StartPrometheus(ctx, harness.PrometheusOptions{Job: "kilo",
		Rules: []string{specGroups(t, repoFile("manifests/monitoring/dropin/victoriametrics/vmrule.yaml"))},
		Labels: func(n *harness.Node) map[string]string {
			return map[string]string{"namespace": "cozy-kilo", "pod": "kilo-" + n.Name, "container": harness.KgContainer,
				"endpoint": "metrics", "cluster": n.Cluster.Name}
		}}, ax, ay, bz, bw)
	must(t, err)
	promStart := time.Now()
	value := func(expr string) (float64, bool) {
		v, ok, err := prom.Value(ctx, expr)
		if err != nil {
			t.Fatal(err)
		}
		return v, ok
	}
	peer := func(node, peer string) string { return fmt.Sprintf(`{node=%q,peer=%q}`, node, peer) }
	cut, long := peer("b-z1", "a-x1"), peer("a-x1", "a-y1")
	ageOf := func(sel string) string { return "time() - meshlet_peer_last_handshake_timestamp_seconds" + sel }

	must(t, harness.Poll(ctx, 60*time.Second, 500*time.Millisecond, "4 targets up, b-z1→a-x1 and a-x1→a-y1 handshaked and up", func() (bool, error) {
		if n, _, err := dropin.Value(ctx, `count(meshlet_build_info{job="kilo"})`); err != nil || n != 4 {
			return false, fmt.Errorf("drop-in's job kilo: %v agents answering (%v)", n, err)
		}
		n, _ := value(`count(up{job="meshlet"} == 1)`)
		c, _ := value("meshlet_peer_up" + cut)
		lg, _ := value("meshlet_peer_up" + long)
		_, hs := value("meshlet_peer_last_handshake_timestamp_seconds" + long)
		return n == 4 && c == 1 && lg == 1 && hs, fmt.Errorf("targets up %v, cut peer up %v, long peer up %v (handshake %v)", n, c, lg, hs)
	}))

	// Cut b-z1 off from a-x1 and, meanwhile, reject a bad Peer.
	cutAt := time.Now()
	must(t, bz.CutUDP(ctx, ax.IP.Addr()))
	// Left in place to the end: b-z1 rightly names the fault there.
	expectFindings(t, "b-z1 NoHandshakeReply")
	a := env.Cluster("cluster-a")
	must(t, a.Apply(ctx, `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"bad-key"},
"spec":{"allowedIPs":["10.1.251.1/32"],"publicKey":"not-a-key"}}`))
	must(t, harness.Poll(ctx, 30*time.Second, 500*time.Millisecond, "MeshletRejectionsActive pending for the bad Peer", func() (bool, error) {
		al, err := prom.Alert(ctx, "MeshletRejectionsActive", "reason", string(topology.ReasonInvalidKey), "kind", "Peer")
		return al != nil, err
	}))
	// The cut peer's last handshake: none can complete after the cut; two
	// scrapes later Prometheus has the final value.
	var lastHS float64
	must(t, harness.Poll(ctx, 10*time.Second, 500*time.Millisecond, "the cut peer's last handshake scraped", func() (bool, error) {
		v, ok := value(`timestamp(meshlet_peer_last_handshake_timestamp_seconds` + cut + `)`)
		lastHS, _ = value("meshlet_peer_last_handshake_timestamp_seconds" + cut)
		return ok && v > float64(cutAt.Unix())+2, nil
	}))
	allowedCut, _ := value("meshlet_peer_handshake_allowed_age_seconds" + cut)

	// Until the cut peer's alert fires and the long-keepalive peer has gone
	// through one whole keepalive period (age past 210 s, then renewed).
	var fired, firedDropin *time.Time
	var firedAlert, firedDropinAlert string
	var pendingAt time.Time
	maxAge, renewedAt := 0.0, 0.0
	err = harness.Poll(ctx, 8*time.Minute, time.Second, "MeshletPeerDown firing for b-z1→a-x1 and a-x1→a-y1's handshake renewed after passing 210 s", func() (bool, error) {
		if fired == nil {
			al, err := prom.Alert(ctx, "MeshletPeerDown", "node", "b-z1", "peer", "a-x1")
			if err != nil {
				return false, err
			}
			if al != nil && pendingAt.IsZero() {
				pendingAt = al.ActiveAt
			}
			if al != nil && al.State == "firing" {
				now := time.Now()
				fired, firedAlert = &now, string(al.Annotations["description"])
			}
		}
		if firedDropin == nil {
			al, err := dropin.Alert(ctx, "MeshletPeerDown", "node", "b-z1", "peer", "a-x1", "job", "kilo", "cluster", "cluster-b")
			if err != nil {
				return false, err
			}
			if al != nil && al.State == "firing" {
				now := time.Now()
				firedDropin, firedDropinAlert = &now, string(al.Annotations["description"])
			}
		}
		if age, ok := value(ageOf(long)); ok {
			if maxAge > 210 && renewedAt == 0 && age < maxAge-30 {
				renewedAt = maxAge
			}
			maxAge = math.Max(maxAge, age)
		}
		return fired != nil && firedDropin != nil && renewedAt > 0, fmt.Errorf("fired %v (drop-in's job kilo: %v), long peer's age peaked at %.0f s, renewed %v",
			fired != nil, firedDropin != nil, maxAge, renewedAt > 0)
	})
	must(t, err)
	secs := int(time.Since(promStart).Seconds()) + 1
	window, every := fmt.Sprintf("[%ds]", secs), fmt.Sprintf("[%ds:1s]", secs)

	// The cut peer: fired, saying how old and how much was allowed.
	fromCut, fromHS := fired.Sub(cutAt), fired.Sub(time.Unix(int64(lastHS), 0))
	if !strings.Contains(firedAlert, "allowed 3m 17s") || !strings.Contains(firedAlert, " ago") {
		t.Errorf("MeshletPeerDown description %q: want the handshake age and the allowed 3m 17s (keepalive 2)", firedAlert)
	}
	// Under the drop-in's scrape the peer's cluster is meshlet's label,
	// exported_cluster there: the description names cluster-a, not the
	// scrape's cluster-b.
	for _, want := range []string{"(remote, cluster cluster-a,", "allowed 3m 17s"} {
		if !strings.Contains(firedDropinAlert, want) {
			t.Errorf("drop-in's MeshletPeerDown description %q: want %q", firedDropinAlert, want)
		}
	}
	// The long-keepalive peer: up at every scrape, allowed 445 s, never an
	// alert, pending included, over the whole run.
	if v, ok := value("min_over_time(meshlet_peer_up" + long + window + ")"); !ok || v != 1 {
		t.Errorf("a-x1→a-y1 (keepalive 250): min meshlet_peer_up over the run = %v (%v), want 1", v, ok)
	}
	allowedLong, _ := value("max_over_time(meshlet_peer_handshake_allowed_age_seconds" + long + window + ")")
	if allowedLong != 445 {
		t.Errorf("a-x1→a-y1 allowed age %v, want 445 (180 + 250 + 15)", allowedLong)
	}
	if v, ok := value(`count_over_time(ALERTS{alertname="MeshletPeerDown",node="a-x1",peer="a-y1"}` + window + ")"); ok {
		t.Errorf("a-x1→a-y1 (keepalive 250, healthy) had MeshletPeerDown in %v evaluations", v)
	}
	oldTrue, _ := value("count_over_time((" + ageOf(long) + " > 210)" + every + ")")
	// Idle peers: never alerted, never down, and not judged once idle. A
	// device starts a handshake with every peer it is given
	// (docs/wireguard.md): that is traffic this side sent, so an idle peer is
	// judged — and up — for at most 180 s after it (docs/metrics.md); the
	// greeting came before Prometheus started.
	idleSecs := secs - 200
	if idleSecs < 30 {
		t.Fatalf("the run lasted %d s: too short to see idle peers after their greeting", secs)
	}
	idleWindow := fmt.Sprintf("[%ds]", idleSecs)
	for _, p := range [][2]string{{"a-y1", "b-w1"}, {"b-w1", "a-y1"}} {
		if v, ok := value("min_over_time(meshlet_peer_up" + peer(p[0], p[1]) + window + ")"); ok && v != 1 {
			t.Errorf("idle peer %s→%s had meshlet_peer_up %v", p[0], p[1], v)
		}
		if v, ok := value("count_over_time(meshlet_peer_up" + peer(p[0], p[1]) + idleWindow + ")"); ok {
			t.Errorf("idle peer %s→%s has meshlet_peer_up in %v scrapes of the last %d s, want none", p[0], p[1], v, idleSecs)
		}
		if _, ok := value(fmt.Sprintf(`count_over_time(ALERTS{alertname="MeshletPeerDown",node=%q,peer=%q}%s)`, p[0], p[1], window)); ok {
			t.Errorf("idle peer %s→%s alerted", p[0], p[1])
		}
	}
	_, idleHS := value("meshlet_peer_last_handshake_timestamp_seconds" + peer("a-y1", "b-w1"))
	// No other peer of this healthy mesh alerted.
	vec, err := prom.Query(ctx, `count_over_time(ALERTS{alertname="MeshletPeerDown"}`+window+`) unless on (node, peer) ALERTS`+cut)
	must(t, err)
	for _, s := range vec {
		t.Errorf("unexpected MeshletPeerDown: %v", s.Metric)
	}
	report(t, "cut b-z1→a-x1 (keepalive 2: allowed %.0f s, `for` 1m): MeshletPeerDown pending %v and firing %v after the cut (handshake %.0f s old at the cut), %v after the last handshake = allowed + %v; under the drop-in's job kilo (the VMRule's groups) firing %v after the cut",
		allowedCut, pendingAt.Sub(cutAt).Round(time.Second), fromCut.Round(time.Second), float64(cutAt.Unix())-lastHS,
		fromHS.Round(time.Second), (fromHS - time.Duration(allowedCut)*time.Second).Round(time.Second), firedDropin.Sub(cutAt).Round(time.Second))
	report(t, "a-x1→a-y1 (keepalive 250, only keepalives): handshake age peaked at %.0f s and renewed, allowed %.0f s, meshlet_peer_up 1 at every scrape, no MeshletPeerDown (not even pending); the old fixed rule's expression (age > 210 s) was true %.0f s of the run (its `for: 2m` needs 330 s, which a 250 s keepalive never reaches: a keepalive over ~330 s would have fired it)",
		maxAge, allowedLong, oldTrue)
	report(t, "idle a-y1↔b-w1 (no keepalive, no traffic but the greeting handshake): never down, no alert over %s, no meshlet_peer_up series over the last %s (handshake ever: %v)", strings.Trim(window, "[]"), strings.Trim(idleWindow, "[]"), idleHS)

	// A kg-run node in a location sorted after x and y (Kilo hands out
	// WireGuard IPs by segment order, so the leaders keep theirs) and a Peer
	// change while a-x1 sends to it: kg rewrites its device and forgets the
	// session, a-x1 repairs it (docs/kilo-compatibility.md#half-dead).
	kg, err := a.AddKgNode(ctx, "a-zkg1", "zkg")
	must(t, err)
	_, err = ax.WaitReachable(ctx, kg.PodIP, 30*time.Second)
	must(t, err)
	axKey, err := ax.PublicKey(ctx)
	must(t, err)
	rxFromAX := func() int64 {
		d, err := kg.Device()
		if err != nil {
			return 0
		}
		return d.Peers[axKey].RxBytes
	}
	before, rx0 := kg.Rewrites(), rxFromAX()
	pinged := make(chan error, 1)
	go func() {
		_, err := ax.Ping(ctx, kg.PodIP, 50, 200*time.Millisecond, time.Second)
		pinged <- err
	}()
	_, laptop := harness.NewKeyPair()
	// The change must come while the pings flow: a few have arrived.
	must(t, harness.Poll(ctx, 5*time.Second, 50*time.Millisecond, "a-x1's pings reaching a-zkg1", func() (bool, error) {
		return rxFromAX() > rx0+300, nil
	}))
	must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},
"spec":{"allowedIPs":["10.1.250.1/32"],"publicKey":"%s"}}`, laptop)))
	must(t, harness.Poll(ctx, 10*time.Second, 100*time.Millisecond, "kg rewrote its device", func() (bool, error) {
		return kg.Rewrites() > before, kg.Err()
	}))
	must(t, <-pinged)
	must(t, harness.Poll(ctx, 30*time.Second, 500*time.Millisecond, "meshlet_session_repairs_total on a-x1", func() (bool, error) {
		v, ok := value(`sum(meshlet_session_repairs_total{node="a-x1",peer="a-zkg1"})`)
		return ok && v > 0, nil
	}))

	// Every query of the shipped dashboard returns data here, with the
	// cluster variable at All (no cluster label) and, under the drop-in's
	// scrape, set to cluster-a: then cluster-a's nodes only, remote peers
	// included, and the remote cluster named as meshlet names it.
	qs, err := harness.DashboardQueries(repoFile("manifests/monitoring/dashboard.json"),
		map[string]string{"cluster": ".*", "node": ".*", "__rate_interval": "1m"})
	must(t, err)
	qsA, err := harness.DashboardQueries(repoFile("manifests/monitoring/dashboard.json"),
		map[string]string{"cluster": "cluster-a", "node": ".*", "__rate_interval": "1m"})
	must(t, err)
	var empty []string
	must(t, harness.Poll(ctx, 30*time.Second, time.Second, "every dashboard query returns data", func() (bool, error) {
		empty = empty[:0]
		for _, pq := range []struct {
			p  *harness.Prometheus
			qs []harness.DashboardQuery
		}{{prom, qs}, {dropin, qsA}} {
			for _, q := range pq.qs {
				vec, err := pq.p.Query(ctx, q.Expr)
				if err != nil {
					return false, err
				}
				if !hasNumber(vec) {
					empty = append(empty, fmt.Sprintf("%s/%s: %s", q.Panel, q.RefID, q.Expr))
				}
				for _, smp := range vec {
					if n := string(smp.Metric["node"]); pq.p == dropin && n != "" && !strings.HasPrefix(n, "a-") {
						return false, fmt.Errorf("%s/%s with cluster cluster-a: a series of node %s: %v", q.Panel, q.RefID, n, smp.Metric)
					}
				}
			}
		}
		return len(empty) == 0, fmt.Errorf("no data (or only NaN) for %d queries:\n%s", len(empty), strings.Join(empty, "\n"))
	}))
	for _, q := range qsA {
		vec, err := dropin.Query(ctx, q.Expr)
		must(t, err)
		switch q.Panel {
		case "Peer up":
			remote := 0
			for _, smp := range vec {
				if smp.Metric["exported_cluster"] == "cluster-b" {
					remote++
				}
			}
			if remote == 0 {
				t.Errorf("Peer up with cluster cluster-a: none of a-x1's peers in cluster-b: %v", vec)
			}
		case "Remote cluster nodes":
			if len(vec) != 1 || vec[0].Metric["remote_cluster"] != "cluster-b" {
				t.Errorf("Remote cluster nodes with cluster cluster-a: %v, want cluster-b's", vec)
			}
		}
	}

	// What Kilo's own dashboard reads (docs/metrics.md#kilo): kg's series
	// with the values kg would give, and the exporter's.
	kiloWant := map[string]float64{
		`sum(kilo_leader)`:              4,
		`max(kilo_nodes{node=~"a-.*"})`: 3, // a-x1, a-y1 and the kg node
		`max(kilo_nodes{node=~"b-.*"})`: 2,
		`kilo_peers{node="a-x1"}`:       1, // the laptop; bad-key is rejected
		`kilo_peers{node="a-y1"}`:       1,
	}
	// The laptop's allowed IPs are masqueraded on cluster-a's leaders (kg's
	// KILO-NAT for Peers): each created meshlet's NAT chain once (a new
	// namespace each) and appended the jump to POSTROUTING.
	kiloWant[`count(kilo_iptables_operations_total{operation="NewChain",table="nat",chain="MESHLET-NAT",protocol="IPv4"} == 1)`] = 2
	kiloWant[`count(kilo_iptables_operations_total{operation="AppendUnique",table="nat",chain="POSTROUTING",protocol="IPv4",node=~"a-.*"})`] = 2
	must(t, harness.Poll(ctx, 20*time.Second, time.Second, "kilo_* series as kg would export them", func() (bool, error) {
		for q, want := range kiloWant {
			if v, ok := value(q); !ok || v != want {
				return false, fmt.Errorf("%s = %v (%v), want %v", q, v, ok, want)
			}
		}
		for _, q := range []string{`rate(kilo_reconciles_total[1m]) > 0`, `kilo_errors_total{event="apply"}`,
			`wireguard_latest_handshake_seconds > 0`, `rate(wireguard_sent_bytes_total[1m])`, `rate(wireguard_received_bytes_total[1m])`} {
			if vec, err := prom.Query(ctx, q); err != nil || len(vec) == 0 {
				return false, fmt.Errorf("%s: no data (%v)", q, err)
			}
		}
		return true, nil
	}))
	report(t, "all %d queries of manifests/monitoring/dashboard.json returned data (kg node and a Peer change for the session-repair panel), and under the drop-in's scrape with cluster=cluster-a (its nodes only); kilo_* (%d checks) and wireguard_* series present",
		len(qs), len(kiloWant))

	// An agent that stops answering, and a remote API server that stops:
	// their alerts' expressions match the real series (pending: their `for`
	// is promtool's to test).
	stopped := time.Now()
	must(t, bw.Stop(syscall.SIGTERM))
	must(t, harness.Poll(ctx, 30*time.Second, 500*time.Millisecond, "MeshletAgentDown pending for b-w1", func() (bool, error) {
		al, err := prom.Alert(ctx, "MeshletAgentDown", "node", "b-w1")
		if al == nil || err != nil {
			return false, err
		}
		al, err = dropin.Alert(ctx, "MeshletAgentDown", "node", "b-w1", "job", "kilo", "pod", "kilo-b-w1")
		return al != nil, err
	}))
	agentDown := time.Since(stopped)
	stopped = time.Now()
	env.Cluster("cluster-b").Server.Stop()
	must(t, harness.Poll(ctx, 60*time.Second, 500*time.Millisecond, "MeshletRemoteClusterNotReady pending on a-x1 for cluster-b", func() (bool, error) {
		al, err := prom.Alert(ctx, "MeshletRemoteClusterNotReady", "node", "a-x1", "cluster", "cluster-b")
		if al == nil || err != nil {
			return false, err
		}
		// The drop-in's scrape: cluster is a-x1's own, the remote one
		// exported_cluster, and the summary names that one.
		al, err = dropin.Alert(ctx, "MeshletRemoteClusterNotReady", "node", "a-x1", "cluster", "cluster-a", "exported_cluster", "cluster-b")
		if al != nil && !strings.HasSuffix(string(al.Annotations["summary"]), "remote cluster cluster-b.") {
			return false, fmt.Errorf("drop-in's MeshletRemoteClusterNotReady summary %q", al.Annotations["summary"])
		}
		return al != nil, err
	}))
	report(t, "b-w1's agent stopped: MeshletAgentDown pending after %v; cluster-b's API server stopped: MeshletRemoteClusterNotReady pending on a-x1 after %v; bad Peer: MeshletRejectionsActive pending; test wall time %v",
		agentDown.Round(100*time.Millisecond), time.Since(stopped).Round(100*time.Millisecond), time.Since(start).Round(time.Second))
}

// specGroups writes the spec of the rule object at path (a PrometheusRule
// or a VMRule: the same groups) as a plain rules file and returns its path.
func specGroups(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &obj); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out, err := yaml.Marshal(obj.Spec)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// hasNumber reports whether a vector holds a sample that is a number (a
// histogram quantile over no observations is NaN: no data to look at).
func hasNumber(v model.Vector) bool {
	for _, s := range v {
		if !math.IsNaN(float64(s.Value)) {
			return true
		}
	}
	return false
}
