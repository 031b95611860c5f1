package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

// operatorMesh is kilo-clustermesh-operator's ClusterMesh in the cluster it
// ran in (cluster-a), in its typed form under its CRD, with the finalizer
// it adds: the object docs/migration.md#operator keeps.
const operatorMesh = `apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata:
  name: mesh
  namespace: kilo-system
  finalizers: [kilo-clustermesh.io/cleanup]
spec:
  clusters:
    - name: cluster-a
      local: true
      podCIDRs: [10.1.0.0/16]
      wireguardCIDR: 100.66.0.0/24
      serviceCIDR: 10.96.0.0/16
    - name: cluster-b
      kubeconfigSecretRef: {name: cluster-b-kubeconfig, key: kubeconfig}
      podCIDRs: [10.2.0.0/16]
      wireguardCIDR: 100.66.1.0/24
      serviceCIDR: 10.97.0.0/16
`

// meshletMeshB is the same mesh for cluster-b, which the operator only
// read: meshlet's CRD there, 0.6's allowedNetworks form, cluster-b's own
// entry local (a drop-in has no --cluster-name).
const meshletMeshB = `apiVersion: kilo.squat.ai/v1alpha1
kind: ClusterMesh
metadata: {name: mesh, namespace: kilo-system}
spec:
  clusters:
    - name: cluster-a
      kubeconfigSecretRef: {name: cluster-a-kubeconfig, key: kubeconfig}
      allowedNetworks: [10.1.0.0/16, 100.66.0.0/24, 10.96.0.0/16]
    - name: cluster-b
      local: true
      allowedNetworks: [10.2.0.0/16, 100.66.1.0/24, 10.97.0.0/16]
`

// operatorRemoteRBAC is what the operator's installation has on each of
// its remote clusters: a ServiceAccount that reads Nodes and writes Peers.
const operatorRemoteRBAC = `apiVersion: v1
kind: ServiceAccount
metadata: {name: clustermesh-reader, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kilo-clustermesh-remote}
rules:
  - {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
  - {apiGroups: [kilo.squat.ai], resources: [peers], verbs: [get, list, watch, create, update, patch, delete]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: clustermesh-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kilo-clustermesh-remote}
subjects: [{kind: ServiceAccount, name: clustermesh-reader, namespace: kube-system}]
`

// secretGrant grants meshlet's agents one kubeconfig Secret by name
// (docs/migration.md#operator; manifests/components/remote-secrets).
func secretGrant(secret string) string {
	return `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: meshlet-kubeconfigs, namespace: kilo-system}
rules:
  - {apiGroups: [""], resources: [secrets], verbs: [list, watch], resourceNames: [` + secret + `]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: meshlet-kubeconfigs, namespace: kilo-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: meshlet-kubeconfigs}
subjects: [{kind: ServiceAccount, name: meshlet, namespace: kilo-system}]
`
}

// Scenario (issue 38): two clusters meshed the way kilo-clustermesh-operator
// meshes them, moved to meshlet by docs/migration.md#operator's steps under
// a 10/s ping between every node of one cluster and one of the other.
//
// The operator's world: kg on every node (one per location, so that every
// node has a WireGuard IP, as under the operator's cross granularity;
// harness.RunKgOperator: kg configures the operator's Peers as any other),
// the operator's CRD and its ClusterMesh (typed form, its finalizer, its
// status) in cluster-a where it ran, its Secret for cluster-b made with
// `kubectl create secret generic --from-file=kubeconfig=` from its own
// remote ServiceAccount (which may write Peers), and its Peers, labelled, in
// both clusters: one per node of the other cluster, written as the operator
// writes them (the service CIDR on the first node's). Every node sets
// kilo.squat.ai/clustermesh-endpoint, as the operator's per-node set-up has
// it (the nodes have no ExternalIP).
//
// The move: meshlet's ClusterMesh CRD, a Secret for cluster-a (from
// manifests/remote's read-only ServiceAccount) and a ClusterMesh in 0.6's
// form in cluster-b; the Secrets granted by name in both clusters; then node
// by node kg's pod gone without clean-up and meshlet in kg's place as the
// drop-in (kg's flags: no --cluster-name, the local: true entry decides;
// kg's key file). While the operator's Peers and meshlet both exist, each
// Peer has its ClusterMeshOperatorPeer Event and meshlet peers with the
// remote leaders itself (same keys); then the Peers are deleted in both
// clusters.
//
// Pass: 0 pings lost; on every leader the other cluster's peers are its
// leaders (kind remote, that cluster), no Peer; one Event per operator Peer;
// after the Peers are gone no rejection is left. Then, off the ping, the
// ClusterMesh status the operator wrote is handed to meshlet (removed, the
// agents restarted), as docs/migration.md says.
func TestOperatorClustersToMeshlet(t *testing.T) {
	start := time.Now()
	env, ctx := newEnv(t)
	kubectlBin, err := apiserver.Bin("kubectl")
	must(t, err)
	dir := t.TempDir()
	kubectl := func(c *harness.Cluster, args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, kubectlBin, append([]string{"--kubeconfig", c.AdminKubeconfig()}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("cluster %s: kubectl %s: %v\n%s", c.Name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	file := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		must(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	// kubeconfigFor builds, with kubectl only, a kubeconfig of c's
	// ServiceAccount ns/sa with inline credentials (docs/migration.md).
	kubeconfigFor := func(c *harness.Cluster, ns, sa string) string {
		t.Helper()
		token := strings.TrimSpace(kubectl(c, "-n", ns, "create", "token", sa, "--duration=8760h"))
		server := kubectl(c, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
		ca, err := base64.StdEncoding.DecodeString(kubectl(c, "config", "view", "--minify", "--raw", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}"))
		must(t, err)
		caFile := file(c.Name+"-ca.crt", string(ca))
		kc := filepath.Join(dir, c.Name+"-"+sa+".kubeconfig")
		for _, args := range [][]string{
			{"set-cluster", c.Name, "--server=" + server, "--certificate-authority=" + caFile, "--embed-certs"},
			{"set-credentials", sa, "--token=" + token},
			{"set-context", c.Name, "--cluster=" + c.Name, "--user=" + sa},
			{"use-context", c.Name},
		} {
			if out, err := exec.CommandContext(ctx, kubectlBin, append([]string{"config", "--kubeconfig=" + kc}, args...)...).CombinedOutput(); err != nil {
				t.Fatalf("kubectl config %s: %v\n%s", args[0], err, out)
			}
		}
		return kc
	}

	a, err := env.AddCluster(ctx, harness.ClusterSpec{Name: "cluster-a",
		PodNet: netip.MustParsePrefix("10.1.0.0/16"), WGSubnet: netip.MustParsePrefix("100.66.0.0/24")})
	must(t, err)
	b, err := env.AddCluster(ctx, harness.ClusterSpec{Name: "cluster-b",
		PodNet: netip.MustParsePrefix("10.2.0.0/16"), WGSubnet: netip.MustParsePrefix("100.66.1.0/24")})
	must(t, err)
	other := map[*harness.Cluster]*harness.Cluster{a: b, b: a}
	var nodes []*harness.Node
	for _, s := range []struct {
		c    *harness.Cluster
		spec harness.NodeSpec
	}{{a, harness.NodeSpec{Name: "a-x1", Location: "x"}}, {a, harness.NodeSpec{Name: "a-y1", Location: "y"}},
		{b, harness.NodeSpec{Name: "b-w1", Location: "w"}}, {b, harness.NodeSpec{Name: "b-z1", Location: "z"}}} {
		n, err := s.c.AddNode(ctx, s.spec)
		must(t, err)
		ep := netip.AddrPortFrom(n.IP.Addr(), 51820).String()
		must(t, s.c.PatchNodeAnnotations(ctx, n.Name, map[string]*string{topology.AnnotationClusterMeshEndpoint: &ep}))
		nodes = append(nodes, n)
	}
	ax1, ay1, bw1, bz1 := nodes[0], nodes[1], nodes[2], nodes[3]

	// The operator's world. meshlet's agents will read no Secret they are
	// not granted by name; the ClusterMesh CRD is the operator's in
	// cluster-a and none in cluster-b (below).
	for _, c := range []*harness.Cluster{a, b} {
		must(t, c.GrantSecretsByNameOnly(ctx))
	}
	must(t, a.RemoveClusterMeshCRD(ctx))
	kubectl(a, "apply", "--server-side", "-f", "../manifests/testdata/kilo-clustermesh-operator/kilo.squat.ai_clustermeshes.yaml")
	kubectl(a, "wait", "--for=condition=established", "--timeout=60s", "crd/clustermeshes.kilo.squat.ai")
	kubectl(b, "apply", "--server-side", "-f", file("operator-remote-rbac.yaml", operatorRemoteRBAC))
	kubectl(a, "-n", harness.Namespace, "create", "secret", "generic", "cluster-b-kubeconfig",
		"--from-file=kubeconfig="+kubeconfigFor(b, "kube-system", "clustermesh-reader"))
	kubectl(a, "apply", "--server-side", "-f", file("operator-mesh.yaml", operatorMesh))
	var kgs []*harness.Kg
	for _, n := range nodes {
		k, err := n.RunKgOperator(ctx, harness.KgOptions{})
		must(t, err)
		kgs = append(kgs, k)
	}
	// What the operator copies of each node: its key and WireGuard IP,
	// once kg has published them as Kilo's rules give them with every node
	// present (a kg that started alone took the first WireGuard IP).
	copied := map[string]string{}
	must(t, harness.Poll(ctx, 30*time.Second, 100*time.Millisecond, "kg's key and wireguard-ip on every node, as kgctl computes them", func() (bool, error) {
		for _, c := range []*harness.Cluster{a, b} {
			view, err := c.KgctlView(ctx, c.Nodes()...)
			if err != nil {
				return false, err
			}
			for _, n := range c.Nodes() {
				ann, err := c.Annotations(ctx, n.Name)
				if err != nil {
					return false, err
				}
				want := view[n.Name].Annotations[topology.AnnotationWireGuardIP]
				if ann[topology.AnnotationKey] == "" || want == "" || ann[topology.AnnotationWireGuardIP] != want {
					return false, fmt.Errorf("%s: key %q, wireguard-ip %q, Kilo's rules give %q", n.Name, ann[topology.AnnotationKey], ann[topology.AnnotationWireGuardIP], want)
				}
				copied[n.Name] = ann[topology.AnnotationKey] + " " + ann[topology.AnnotationWireGuardIP]
			}
		}
		return true, nil
	}))
	// (kgctl's view reads ClusterMeshes: cluster-b's CRD goes after it.)
	must(t, b.RemoveClusterMeshCRD(ctx))
	entry := map[*harness.Cluster]harness.OperatorEntry{
		a: {Name: a.Name, PodCIDRs: []netip.Prefix{a.PodNet}, WireguardPort: 51820,
			Networks: []netip.Prefix{a.PodNet, a.WGSubnet, netip.MustParsePrefix("10.96.0.0/16")}},
		b: {Name: b.Name, PodCIDRs: []netip.Prefix{b.PodNet}, WireguardPort: 51820,
			Networks: []netip.Prefix{b.PodNet, b.WGSubnet, netip.MustParsePrefix("10.97.0.0/16")}},
	}
	opPeers := map[*harness.Cluster][]string{}
	for _, c := range []*harness.Cluster{a, b} {
		opPeers[c], err = c.WriteOperatorPeers(ctx, "mesh", other[c], entry[other[c]])
		must(t, err)
		if len(opPeers[c]) != 2 {
			t.Fatalf("cluster %s: the operator wrote %d Peers, want 2 (one per node of %s): %v", c.Name, len(opPeers[c]), other[c].Name, opPeers[c])
		}
	}
	must(t, a.WriteOperatorStatus(ctx, "mesh", map[string]int{a.Name: 2, b.Name: 2}))
	t.Logf("OUTPUT cluster-a, the operator's Peers (kubectl get peers.kilo.squat.ai -L ...):\n%s",
		kubectl(a, "get", "peers.kilo.squat.ai", "-L", harness.OperatorLabelMesh+","+harness.OperatorLabelSourceCluster))

	// A 10/s ping from every node to one of the other cluster, through the
	// operator's Peers.
	pairs := []struct {
		from, to *harness.Node
		p        *harness.Pinger
		tl       harness.PingTimeline
	}{{from: ax1, to: bz1}, {from: ay1, to: bw1}, {from: bw1, to: ax1}, {from: bz1, to: ay1}}
	for _, p := range pairs {
		_, err := p.from.WaitReachable(ctx, p.to.PodIP, 30*time.Second)
		must(t, err)
	}
	t.Logf("the operator's mesh is up (kg everywhere, its Peers): every pair reachable after %v", time.Since(start).Round(time.Millisecond))
	for i := range pairs {
		pairs[i].p = startPinging(t, ctx, pairs[i].from, pairs[i].to)
	}
	// The sessions kg's devices hold, to count those the move re-creates
	// (kg's peers within a cluster carry no traffic here: no session).
	sessions := map[string]time.Time{}
	for _, n := range nodes {
		for k, at := range settledHandshakes(ctx, t, n) {
			if !at.IsZero() {
				sessions[n.Name+" "+k] = at
			}
		}
	}
	moveFrom := time.Now()

	// 1. cluster-b, which the operator only read: meshlet's ClusterMesh
	// CRD, the Secret for cluster-a from manifests/remote's read-only
	// ServiceAccount, the ClusterMesh with cluster-b's entry local.
	kubectl(b, "apply", "--server-side", "-f", "../manifests/crds/clustermeshes.kilo.squat.ai.yaml")
	kubectl(b, "wait", "--for=condition=established", "--timeout=60s", "crd/clustermeshes.kilo.squat.ai")
	kubectl(b, "-n", harness.Namespace, "create", "secret", "generic", "cluster-a-kubeconfig",
		"--from-file=kubeconfig="+kubeconfigFor(a, harness.Namespace, "meshlet-remote"))
	kubectl(b, "apply", "--server-side", "-f", file("meshlet-mesh-b.yaml", meshletMeshB))
	// 2. Each cluster's Secret granted to the agents by name.
	for c, secret := range map[*harness.Cluster]string{a: "cluster-b-kubeconfig", b: "cluster-a-kubeconfig"} {
		kubectl(c, "apply", "--server-side", "-f", file(c.Name+"-grant.yaml", secretGrant(secret)))
		tok, err := c.Server.ServiceAccountToken(ctx, harness.Namespace, "meshlet")
		must(t, err)
		must(t, apiserver.WaitAuthorized(ctx, c.Server.TokenConfig(tok),
			authorizationv1.ResourceAttributes{Verb: "watch", Resource: "secrets", Namespace: harness.Namespace, Name: secret}))
		// The check docs/migration.md gives.
		if out := kubectl(c, "-n", harness.Namespace, "auth", "can-i", "watch", "secrets/"+secret,
			"--as=system:serviceaccount:"+harness.Namespace+":meshlet"); strings.TrimSpace(out) != "yes" {
			t.Errorf("cluster %s: kubectl auth can-i watch secrets/%s: %s", c.Name, secret, out)
		}
	}

	// 3. Node by node, kg's pod gone without clean-up (as with
	// --clean-up=false, or SIGKILL) and meshlet in its place as the drop-in.
	keyOf := func(n *harness.Node) string { return strings.Fields(copied[n.Name])[0] }
	type step struct {
		node                 *harness.Node
		from, ready, settled time.Time
	}
	var steps []step
	for _, n := range []*harness.Node{ax1, ay1, bw1, bz1} {
		st := step{node: n, from: time.Now()}
		must(t, n.StopKg(false))
		n.DropIn = true
		// A drop-in runs with kg's flags: the harness' --cluster-name is
		// cleared, so the ClusterMesh's local: true entry names the cluster.
		n.ExtraArgs = append(n.ExtraArgs, "--cluster-name=")
		must(t, n.Start(ctx))
		st.ready = time.Now()
		o := other[n.Cluster]
		must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, n.Name+": "+o.Name+"'s leaders as remote peers", func() (bool, error) {
			s, err := nodeStatus(ctx, n)
			if err != nil {
				return false, err
			}
			err = remotePeersAreLeaders(s, o, keyOf)
			return err == nil, err
		}))
		st.settled = time.Now()
		steps = append(steps, st)
		ann, err := n.Cluster.Annotations(ctx, n.Name)
		must(t, err)
		if got := ann[topology.AnnotationKey] + " " + ann[topology.AnnotationWireGuardIP]; got != copied[n.Name] {
			t.Errorf("%s: key and wireguard-ip %q under meshlet, %q under kg: the operator's Peers of it no longer match", n.Name, got, copied[n.Name])
		}
	}

	// What a user sees while the operator's Peers and meshlet both exist:
	// one Event per Peer, the rejection in meshlet status, the Peers
	// ignored (no peer of kind "peer" on any leader).
	for _, c := range []*harness.Cluster{a, b} {
		must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, c.Name+": an Event for each of the operator's Peers", func() (bool, error) {
			for _, p := range opPeers[c] {
				evs, err := c.Events(ctx, kilo.KindPeer, p)
				if err != nil {
					return false, err
				}
				n := 0
				for _, e := range evs {
					if e.Reason == string(kilo.ReasonOperatorPeer) {
						n++
					}
				}
				if n != 1 {
					return false, fmt.Errorf("Peer %s: %d ClusterMeshOperatorPeer Events", p, n)
				}
			}
			return true, nil
		}))
	}
	t.Logf("OUTPUT cluster-a, kubectl get events -A --field-selector reason=ClusterMeshOperatorPeer:\n%s",
		kubectl(a, "get", "events", "-A", "--field-selector", "reason="+string(kilo.ReasonOperatorPeer)))
	text, err := ax1.Exec(ctx, os.Getenv("MESHLET_BIN"), "status")
	must(t, err)
	t.Logf("OUTPUT meshlet status on a-x1 (the operator's Peers still there):\n%s", text)
	for _, p := range opPeers[a] {
		if !strings.Contains(text, p) {
			t.Errorf("meshlet status on a-x1 does not name the operator's Peer %s", p)
		}
	}
	for _, n := range nodes {
		m, err := n.Metrics(ctx)
		must(t, err)
		if v, _ := m.Value("meshlet_peers", "kind", "peer"); v != 0 {
			t.Errorf("%s: meshlet_peers{kind=peer} = %v: an operator Peer configured", n.Name, v)
		}
		if v, _ := m.Value("meshlet_rejections_total", "reason", string(kilo.ReasonOperatorPeer)); v == 0 && n.Name == "a-x1" {
			t.Errorf("%s: meshlet_rejections_total{reason=%s} = 0", n.Name, kilo.ReasonOperatorPeer)
		}
	}
	for _, c := range []*harness.Cluster{a, b} {
		t.Logf("OUTPUT %s, kubectl get clustermesh -o wide:\n%s", c.Name, kubectl(c, "get", "clustermesh", "-n", harness.Namespace, "-o", "wide"))
	}

	// 4. The operator gone, its Peers deleted in every cluster.
	deleted := time.Now()
	for _, c := range []*harness.Cluster{a, b} {
		t.Logf("OUTPUT %s: kubectl delete peers.kilo.squat.ai -l %s\n%s", c.Name, harness.OperatorLabelMesh,
			kubectl(c, "delete", "peers.kilo.squat.ai", "-l", harness.OperatorLabelMesh))
	}
	// Every agent has planned since, without the Peers (and without
	// their rejections); the ping runs on until then.
	must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "every agent planned without the operator's Peers", func() (bool, error) {
		for _, n := range nodes {
			s, err := nodeStatus(ctx, n)
			if err != nil {
				return false, err
			}
			if !s.LastRun.At.After(deleted) {
				return false, fmt.Errorf("%s: last reconcile at %v", n.Name, s.LastRun.At)
			}
			for _, r := range s.Rejections {
				if r.Reason == kilo.ReasonOperatorPeer {
					return false, fmt.Errorf("%s still rejects %s", n.Name, r.Object.Name)
				}
			}
			if err := remotePeersAreLeaders(s, other[n.Cluster], keyOf); err != nil {
				return false, err
			}
		}
		return true, nil
	}))
	end := time.Now()
	// Every ping sent before the end counts: each pair is answered after it.
	for i := range pairs {
		p := &pairs[i]
		must(t, harness.Poll(ctx, 10*time.Second, 50*time.Millisecond, p.from.Name+"→"+p.to.Name+" answered after the move", func() (bool, error) {
			return p.p.Replied(end), nil
		}))
	}
	var sent, lost int
	var gap time.Duration
	var per []string
	for i := range pairs {
		p := &pairs[i]
		p.tl = p.p.Stop()
		w := p.tl.Window(moveFrom, end)
		sent, lost, gap = sent+w.Sent, lost+w.Lost, max(gap, w.Gap)
		per = append(per, fmt.Sprintf("%s→%s %d/%d (longest gap %v)", p.from.Name, p.to.Name, w.Lost, w.Sent, w.Gap.Round(time.Millisecond)))
		if w.Lost > 0 {
			t.Errorf("%s→%s: %d of %d pings lost during the move", p.from.Name, p.to.Name, w.Lost, w.Sent)
		}
	}
	var took []string
	for _, st := range steps {
		took = append(took, fmt.Sprintf("%s ready %v, meshed %v", st.node.Name, st.ready.Sub(st.from).Round(10*time.Millisecond),
			st.settled.Sub(st.from).Round(10*time.Millisecond)))
	}
	rewrites := 0
	for _, k := range kgs {
		for _, r := range k.History() {
			if r.At.After(moveFrom) {
				rewrites++
			}
		}
	}
	recreated := 0
	for _, n := range nodes {
		for k, at := range handshakes(t, n) {
			if before, ok := sessions[n.Name+" "+k]; ok && !before.IsZero() && !at.Equal(before) {
				recreated++
				t.Logf("%s: the session with %s was re-created (handshake %v, was %v)", n.Name, k, at.Format("15:04:05.000"), before.Format("15:04:05.000"))
			}
		}
	}
	t.Logf("pings lost/sent by pair: %s", strings.Join(per, "; "))
	report(t, "the operator's two clusters (4 nodes, 4 of its Peers) moved to meshlet under 10 pings/s on %d pairs: %d/%d pings lost, longest gap %v; kg→meshlet per node (%s); every leader peers with the other cluster's leaders, none with a Peer; %d ClusterMeshOperatorPeer Events (one per Peer) while both existed; Peers deleted, all agents replanned %v later; %d of %d sessions re-created, %d kg rewrites during the move; move %v, test %v",
		len(pairs), lost, sent, gap.Round(time.Millisecond), strings.Join(took, "; "), len(opPeers[a])+len(opPeers[b]),
		end.Sub(deleted).Round(10*time.Millisecond), recreated, len(sessions), rewrites, end.Sub(moveFrom).Round(100*time.Millisecond), time.Since(start).Round(time.Second))

	// 5. The status the operator wrote: meshlet leaves another manager's
	// fields alone, so it stays until removed; the agents write it after
	// their next start (docs/migration.md#operator).
	managers := func() string {
		return kubectl(a, "get", "clustermesh", "mesh", "-n", harness.Namespace, "-o", "jsonpath={range .metadata.managedFields[*]}{.manager}/{.subresource} {end}")
	}
	if m := managers(); !strings.Contains(m, "kilo-clustermesh-operator/status") || strings.Contains(m, "meshlet/status") {
		t.Errorf("cluster-a's ClusterMesh status: managers %q, want the operator's only", m)
	}
	kubectl(a, "-n", harness.Namespace, "patch", "clustermesh", "mesh", "--subresource=status", "--type=json", "-p", `[{"op":"remove","path":"/status"}]`)
	for _, n := range []*harness.Node{ax1, ay1} {
		must(t, n.Stop(syscall.SIGKILL))
		must(t, n.Start(ctx))
	}
	must(t, harness.Poll(ctx, 60*time.Second, 200*time.Millisecond, "cluster-a's ClusterMesh status written by meshlet", func() (bool, error) {
		st := kubectl(a, "get", "clustermesh", "mesh", "-n", harness.Namespace, "-o", "jsonpath={.status}")
		return strings.Contains(managers(), "meshlet/status") && strings.Contains(st, `"name":"cluster-b","registeredPeers":2`), errors.New(st)
	}))
	t.Logf("OUTPUT cluster-a after the status was handed over, kubectl get clustermesh -o wide:\n%s\nstatus.clusters: %s",
		kubectl(a, "get", "clustermesh", "-n", harness.Namespace, "-o", "wide"),
		kubectl(a, "get", "clustermesh", "mesh", "-n", harness.Namespace, "-o", "jsonpath={.status.clusters}"))
}

// nodeStatus is the node's `meshlet status -o json`.
func nodeStatus(ctx context.Context, n *harness.Node) (status.Status, error) {
	var s status.Status
	out, err := n.Exec(ctx, os.Getenv("MESHLET_BIN"), "status", "-o", "json")
	if err != nil {
		return s, fmt.Errorf("%s: meshlet status: %w", n.Name, err)
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		return s, fmt.Errorf("%s: meshlet status: %w", n.Name, err)
	}
	return s, nil
}

// remotePeersAreLeaders checks that s, a leader's status, has o synced and
// ready and every node of o (each leads its location) as a peer of kind
// remote of cluster o, and no peer of kind peer.
func remotePeersAreLeaders(s status.Status, o *harness.Cluster, keyOf func(*harness.Node) string) error {
	if s.Role != "leader" {
		return fmt.Errorf("%s: role %q", s.Node, s.Role)
	}
	if len(s.Remotes) != 1 || s.Remotes[0].Cluster != o.Name || !s.Remotes[0].Synced || !s.Remotes[0].Ready {
		return fmt.Errorf("%s: remotes %+v, want %s synced and ready", s.Node, s.Remotes, o.Name)
	}
	byKey := map[string]status.Peer{}
	for _, p := range s.Peers {
		if p.Kind == string(topology.KindPeer) {
			return fmt.Errorf("%s: peer %s of kind peer", s.Node, p.Name)
		}
		byKey[p.PublicKey] = p
	}
	var missing []string
	for _, n := range o.Nodes() {
		p, ok := byKey[keyOf(n)]
		if !ok || p.Kind != string(topology.KindRemote) || p.Cluster != o.Name || p.State == "missing" {
			missing = append(missing, fmt.Sprintf("%s (%+v)", n.Name, p))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		return fmt.Errorf("%s: %s's leaders not remote peers on the device: %s", s.Node, o.Name, strings.Join(missing, ", "))
	}
	return nil
}
