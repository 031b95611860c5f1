package node

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// Release is a release's artefacts as make release writes them (dist/), or
// the previous release's as hack/release/previous.sh writes them.
type Release struct {
	Version      string // image tag, vX.Y.Z[-pre]
	ChartVersion string // X.Y.Z[-pre]
	ImageTar     string // OCI layout tarball
	ChartTgz     string
	Rev          string // the previous release's commit, and where it came from (tag, pinned)
	From         string
}

// readEnvFile reads KEY=VALUE lines.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), "="); ok {
			m[k] = v
		}
	}
	return m, s.Err()
}

// CurrentRelease is make release's dist/ directory.
func CurrentRelease(dist string) (Release, error) {
	images, _ := filepath.Glob(filepath.Join(dist, "meshlet-image-v*.oci.tar"))
	charts, _ := filepath.Glob(filepath.Join(dist, "meshlet-[0-9]*.tgz"))
	if len(images) != 1 || len(charts) != 1 {
		return Release{}, fmt.Errorf("%s: want one image tarball and one chart (make release), found %v %v", dist, images, charts)
	}
	v := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(images[0]), "meshlet-image-"), ".oci.tar")
	return Release{Version: v, ChartVersion: strings.TrimPrefix(v, "v"), ImageTar: images[0], ChartTgz: charts[0]}, nil
}

// PreviousRelease is hack/release/previous.sh's directory.
func PreviousRelease(dir string) (Release, error) {
	env, err := readEnvFile(filepath.Join(dir, "env"))
	if err != nil {
		return Release{}, err
	}
	return Release{Version: env["PREVIOUS_VERSION"], ChartVersion: env["PREVIOUS_CHART_VERSION"], Rev: env["PREVIOUS_REV"],
		From: env["PREVIOUS_FROM"], ImageTar: filepath.Join(dir, "image.oci.tar"), ChartTgz: filepath.Join(dir, "chart.tgz")}, nil
}

// nodeState is what an agent publishes on its Node that its peers and an
// agent of another version must read the same way.
type nodeState struct {
	key, wireguardIP, endpoint, internalIP string
	lastSeen                               time.Time
}

func readNodeStates(ctx context.Context, cs kubernetes.Interface, nodes []*Node) (map[string]nodeState, error) {
	m := map[string]nodeState{}
	for _, n := range nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		a := node.Annotations
		ls, err := strconv.ParseInt(a["kilo.squat.ai/last-seen"], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: last-seen %q: %w", n.Name, a["kilo.squat.ai/last-seen"], err)
		}
		m[n.Name] = nodeState{key: a["kilo.squat.ai/key"], wireguardIP: a["kilo.squat.ai/wireguard-ip"],
			endpoint: a["kilo.squat.ai/endpoint"], internalIP: a["kilo.squat.ai/internal-ip"], lastSeen: time.Unix(ls, 0)}
	}
	return m, nil
}

// checkAcrossVersions waits until every node's annotations were written
// again after since (last-seen advanced: the new version's agent runs and
// reads what the old one wrote) with the same key, WireGuard IP, endpoint
// and internal IP as before, and until every location Lease is held and
// renewed after since (checkLeases).
func checkAcrossVersions(ctx context.Context, cs kubernetes.Interface, nodes []*Node, before map[string]nodeState, since time.Time) error {
	err := poll(ctx, 2*time.Minute, "annotations rewritten by the new version", func() (bool, error) {
		now, err := readNodeStates(ctx, cs, nodes)
		if err != nil {
			return false, err
		}
		for name, b := range before {
			a := now[name]
			if a.key != b.key || a.wireguardIP != b.wireguardIP || a.endpoint != b.endpoint || a.internalIP != b.internalIP {
				return false, fmt.Errorf("%s: annotations changed across versions: %+v -> %+v", name, b, a)
			}
			if !a.lastSeen.After(since.Truncate(time.Second)) {
				return false, fmt.Errorf("%s: last-seen %s not after %s", name, a.lastSeen, since)
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	return checkLeases(ctx, cs, nodes, since)
}

// checkLeases: every location Lease (meshlet-leader-<location>) is held by
// a node of the lane and renewed after since, and no holder is gone. A
// location of one node is not governed by a Lease (topology.Governance:
// nothing to fail over to), so in this lane, one node per location, there
// are none unless a version writes one where it should not; the leader
// role itself is checked from each agent's meshlet_leader metric.
func checkLeases(ctx context.Context, cs kubernetes.Interface, nodes []*Node, since time.Time) error {
	names := map[string]bool{}
	for _, n := range nodes {
		names[n.Name] = true
	}
	return poll(ctx, 2*time.Minute, "location Leases held and renewed", func() (bool, error) {
		l, err := cs.CoordinationV1().Leases(kiloNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, lease := range l.Items {
			if !strings.HasPrefix(lease.Name, "meshlet-leader-") {
				continue
			}
			holder := ""
			if lease.Spec.HolderIdentity != nil {
				holder = *lease.Spec.HolderIdentity
			}
			if !names[holder] || lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(since) {
				return false, fmt.Errorf("location Lease %s: holder %q, renewed %v (want a node of the lane, after %s)", lease.Name, holder, lease.Spec.RenewTime, since)
			}
		}
		return true, nil
	})
}

// leaseCount is the number of location Leases.
func leaseCount(ctx context.Context, cs kubernetes.Interface) int {
	l, err := cs.CoordinationV1().Leases(kiloNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return -1
	}
	n := 0
	for _, lease := range l.Items {
		if strings.HasPrefix(lease.Name, "meshlet-leader-") {
			n++
		}
	}
	return n
}

// chartKinds are the kinds meshlet's chart renders (and helm test's hooks).
var chartKinds = []struct {
	kind       string
	gvr        schema.GroupVersionResource
	namespaced bool
}{
	{"DaemonSet", schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}, true},
	{"Service", schema.GroupVersionResource{Version: "v1", Resource: "services"}, true},
	{"ServiceAccount", schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true},
	{"ConfigMap", schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, true},
	{"Role", schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, true},
	{"RoleBinding", schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, true},
	{"ClusterRole", schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, false},
	{"ClusterRoleBinding", schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, false},
	{"ClusterMesh", schema.GroupVersionResource{Group: "kilo.squat.ai", Version: "v1alpha1", Resource: "clustermeshes"}, true},
}

// orphans lists meshlet's objects (labelled app.kubernetes.io/part-of=meshlet,
// of the kinds the chart renders) that the release's manifest does not
// hold: what an upgrade or a rollback left behind, or a helm test hook not
// deleted. The DaemonSet's pods and ControllerRevisions and the agents'
// Leases are the DaemonSet's and the agents' own (pods: one per node of the
// release's image, checked by the caller); helm test's pod stays, as Helm
// keeps it for its logs; any other pod of meshlet's is left behind.
func orphans(ctx context.Context, dyn dynamic.Interface, manifest string) ([]string, error) {
	want := map[string]bool{}
	for _, doc := range strings.Split(manifest, "\n---") {
		var o struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil || o.Kind == "" {
			continue
		}
		want[o.Kind+"/"+o.Metadata.Name] = true
	}
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=meshlet"}
	var extra []string
	for _, k := range chartKinds {
		var ri dynamic.ResourceInterface = dyn.Resource(k.gvr)
		if k.namespaced {
			ri = dyn.Resource(k.gvr).Namespace(kiloNS)
		}
		l, err := ri.List(ctx, sel)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", k.kind, err)
		}
		for _, o := range l.Items {
			if !want[k.kind+"/"+o.GetName()] {
				extra = append(extra, k.kind+"/"+o.GetName())
			}
		}
	}
	pods, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Namespace(kiloNS).List(ctx,
		metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=meshlet,app.kubernetes.io/name!=meshlet"})
	if err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		// A pod being deleted is not left behind; helm test's pod is kept
		// by Helm for `helm test --logs` until the next test.
		if p.GetDeletionTimestamp() == nil && p.GetAnnotations()["helm.sh/hook"] != "test" {
			extra = append(extra, "Pod/"+p.GetName())
		}
	}
	sort.Strings(extra)
	return extra, nil
}
