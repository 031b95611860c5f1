package manifests_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/chart")

// golden compares got with testdata/chart/name (or writes it with -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", "chart", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (go test ./manifests -run %s -update writes it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the chart renders now (go test ./manifests -run %s -update, then review the diff):\n%s",
			p, t.Name(), cmp.Diff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n")))
	}
}

// chartMeta is what Chart.yaml says of the version.
func chartMeta(t *testing.T) (version, appVersion string) {
	t.Helper()
	b, err := os.ReadFile("chart/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ Version, AppVersion string }
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c.Version, c.AppVersion
}

var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// TestVersionsAgree: the chart's version is a semver, its appVersion (the
// default image tag) is that version with a "v", every image tag of
// manifests/ is the same, and no default anywhere is "latest".
func TestVersionsAgree(t *testing.T) {
	version, appVersion := chartMeta(t)
	if !semver.MatchString(version) || appVersion != "v"+version {
		t.Errorf("Chart.yaml version %q, appVersion %q: want X.Y.Z[-pre] and vX.Y.Z[-pre]", version, appVersion)
	}
	files, _ := filepath.Glob("*/kustomization.yaml")
	more, _ := filepath.Glob("components/*/kustomization.yaml")
	files = append(files, more...)
	tags := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Images []struct{ Name, NewName, NewTag, Digest string }
		}
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, im := range k.Images {
			tags++
			if im.NewTag != appVersion {
				t.Errorf("%s: image %s newTag %q, want the chart's appVersion %q", f, im.Name, im.NewTag, appVersion)
			}
		}
	}
	if tags < 2 {
		t.Errorf("found %d image tags in %v (base and the userspace component set one each)", tags, files)
	}
	latest := regexp.MustCompile(`(?m)(:latest\b|(newTag|tag|appVersion):\s*"?latest"?)`)
	for _, dir := range []string{"base", "components", "chart", "talos", "monitoring", "namespace", "crds", "remote"} {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !(strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".tpl") || strings.HasSuffix(p, ".txt")) {
				return err
			}
			b, _ := os.ReadFile(p)
			if m := latest.Find(b); m != nil {
				t.Errorf("%s: %q: a default must name a release, not latest", p, m)
			}
			return nil
		})
	}
	// The install commands users copy name the release this tree is (one
	// version everywhere: the chart's, which CHANGELOG.md has a section for
	// and make release builds).
	changelog, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(changelog, []byte("\n## ["+version+"] - ")) {
		t.Errorf("CHANGELOG.md has no section ## [%s] - DATE for the chart's version", version)
	}
	named := regexp.MustCompile(`/meshlet:(v\d+\.\d+\.\d+[-.0-9A-Za-z]*)|--version (\d+\.\d+\.\d+[-.0-9A-Za-z]*)|ref=(v\d+\.\d+\.\d+[-.0-9A-Za-z]*)|"tag": ?"(v[^"]+)"`)
	docs, _ := filepath.Glob("../docs/*.md")
	found := 0
	for _, f := range append(docs, "../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllSubmatch(b, -1) {
			found++
			if v := string(bytes.Join(m[1:], nil)); v != appVersion && v != version {
				t.Errorf("%s: %q names %s, not this tree's release %s (manifests/chart/Chart.yaml)", f, m[0], v, appVersion)
			}
		}
	}
	if found < 5 {
		t.Errorf("found %d versions in README.md and docs/ (the install and drop-in commands name it)", found)
	}
}

// helmFails runs helm and wants it to fail with msg in its output.
func helmFails(t *testing.T, msg string, args ...string) {
	t.Helper()
	out, err := exec.Command(helmBin(t), args...).CombinedOutput()
	if err == nil {
		t.Errorf("helm %s passed, want a failure saying %q:\n%s", strings.Join(args, " "), msg, out)
		return
	}
	if !strings.Contains(string(out), msg) {
		t.Errorf("helm %s: output lacks %q:\n%s", strings.Join(args, " "), msg, out)
	}
}

// TestChartSchema: values.schema.json rejects what the chart would
// otherwise drop without a word: Cozystack's nested kilo: values, typos at
// any depth, values of another type; lint, template and install all say so.
func TestChartSchema(t *testing.T) {
	for file, msg := range map[string]string{
		"cozystack-kilo.yaml": "additional properties 'kilo' not allowed",
		"typo.yaml":           "additional properties 'transitCidr' not allowed",
		"wrong-type.yaml":     "at '/wireguard/sidecar': got string, want boolean",
		"nested-typo.yaml":    "at '/monitoring/podMonitor': additional properties 'intervall' not allowed",
	} {
		f := filepath.Join("testdata", "values", file)
		helmFails(t, msg, "lint", "--strict", "chart", "-f", f)
		helmFails(t, msg, "template", "meshlet", "chart", "-f", f)
	}
	for _, set := range []string{"port=51820x", "mtu=12", "meshGranularity=region", "image.digest=latest", "updateStrategy.type=Recreate"} {
		helmFails(t, "values don't meet the specifications of the schema", "template", "meshlet", "chart", "--set", set)
	}
	// Every value set at once is valid, and lint is clean with it.
	helm(t, "template", "meshlet", "chart", "-f", "testdata/values/everything.yaml")
	out := helm(t, "lint", "--strict", "chart", "-f", "testdata/values/everything.yaml")
	if bytes.Contains(out, []byte("[WARNING]")) || bytes.Contains(out, []byte("[ERROR]")) {
		t.Errorf("helm lint --strict with every value:\n%s", out)
	}
}

// TestChartGolden: the whole of `helm template` with the defaults, as a
// user sees it (labels, strategy, priority class, image from appVersion).
func TestChartGolden(t *testing.T) {
	golden(t, "default.yaml", helm(t, "template", "meshlet", "chart", "--namespace", ns))
}

// TestChartCapabilities: privileged=false (docs/security.md#capabilities)
// as a user sees it (golden, with the child device and with the sidecar),
// and where /dev/net/tun goes: into the container that runs the userspace
// device, nowhere with kernel WireGuard or when privileged.
func TestChartCapabilities(t *testing.T) {
	render := func(set ...string) []byte {
		args := []string{"template", "meshlet", "chart", "--namespace", ns, "--show-only", "templates/daemonset.yaml"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		return helm(t, args...)
	}
	golden(t, "capabilities.yaml", render("privileged=false"))
	golden(t, "capabilities-sidecar.yaml", render("privileged=false", "wireguard.sidecar=true"))
	for _, tc := range []struct {
		set []string
		// container -> its capabilities added ("privileged" when it is),
		// and whether it mounts /dev/net/tun
		want map[string]string
		tun  string // the container mounting /dev/net/tun, "" none
	}{
		{nil, map[string]string{"meshlet": "privileged"}, ""},
		{[]string{"wireguard.sidecar=true"}, map[string]string{"meshlet": "privileged", "wireguard": "privileged"}, ""},
		{[]string{"privileged=false"}, map[string]string{"meshlet": "NET_ADMIN,NET_RAW"}, "meshlet"},
		{[]string{"privileged=false", "wireguard.mode=userspace"}, map[string]string{"meshlet": "NET_ADMIN,NET_RAW"}, "meshlet"},
		{[]string{"privileged=false", "wireguard.sidecar=true"}, map[string]string{"meshlet": "NET_ADMIN,NET_RAW", "wireguard": "NET_ADMIN"}, "wireguard"},
		{[]string{"privileged=false", "wireguard.mode=kernel"}, map[string]string{"meshlet": "NET_ADMIN,NET_RAW"}, ""},
	} {
		ds := find(decode(t, render(tc.set...)), "DaemonSet", "meshlet")
		var spec corev1.PodSpec
		m, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
		b, _ := yaml.Marshal(m)
		if err := yaml.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		got, tun := map[string]string{}, ""
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			sc := c.SecurityContext
			switch {
			case sc == nil || sc.Privileged == nil:
				got[c.Name] = "no privileged field"
			case *sc.Privileged:
				got[c.Name] = "privileged"
			default:
				var add []string
				for _, a := range sc.Capabilities.Add {
					add = append(add, string(a))
				}
				got[c.Name] = strings.Join(add, ",")
				if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
					sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%v: %s: securityContext %+v", tc.set, c.Name, sc)
				}
			}
			for _, vm := range c.VolumeMounts {
				if vm.MountPath == "/dev/net/tun" {
					tun += c.Name
				}
			}
			if c.Name == "meshlet" && !mounts(c, "status", "/run/meshlet") {
				t.Errorf("%v: the agent does not mount the status volume at /run/meshlet", tc.set)
			}
		}
		if !reflect.DeepEqual(got, tc.want) || tun != tc.tun {
			t.Errorf("%v: containers %v, /dev/net/tun in %q; want %v, %q", tc.set, got, tun, tc.want, tc.tun)
		}
	}
}

func mounts(c corev1.Container, volume, path string) bool {
	for _, vm := range c.VolumeMounts {
		if vm.Name == volume && vm.MountPath == path {
			return true
		}
	}
	return false
}

// TestChartLabels: every object carries Helm's and Kubernetes' recommended
// labels; the DaemonSet's selector stays app.kubernetes.io/name alone (it
// cannot change on upgrade).
func TestChartLabels(t *testing.T) {
	version, appVersion := chartMeta(t)
	objs := decode(t, helm(t, "template", "mesh-a", "chart", "--namespace", ns, "-f", "testdata/values/everything.yaml",
		"--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"))
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		l := o.GetLabels()
		want := map[string]string{
			"app.kubernetes.io/name": "meshlet", "app.kubernetes.io/instance": "mesh-a", "app.kubernetes.io/version": appVersion,
			"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/part-of": "meshlet", "helm.sh/chart": "meshlet-" + version,
		}
		component := map[string]string{"PodMonitor": "monitoring", "PrometheusRule": "monitoring", "ConfigMap": "monitoring"}[o.GetKind()]
		if strings.HasPrefix(o.GetName(), "meshlet-test") {
			component = "test"
			if o.GetKind() == "Pod" {
				want["app.kubernetes.io/name"] = "meshlet-test"
			}
		}
		if component == "" {
			component = "agent"
		}
		want["app.kubernetes.io/component"] = component
		for k, v := range want {
			if l[k] != v {
				t.Errorf("%s %s: label %s=%q, want %q", o.GetKind(), o.GetName(), k, l[k], v)
			}
		}
	}
	for _, k := range []string{"DaemonSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"PodMonitor", "PrometheusRule", "ConfigMap", "ClusterMesh", "Pod"} {
		if !kinds[k] {
			t.Errorf("no %s rendered with every value on", k)
		}
	}
	ds := find(objs, "DaemonSet", "meshlet")
	sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "selector", "matchLabels")
	if len(sel) != 1 || sel["app.kubernetes.io/name"] != "meshlet" {
		t.Errorf("DaemonSet selector %v: want app.kubernetes.io/name=meshlet alone (immutable)", sel)
	}
	svc := find(objs, "Service", "meshlet")
	if s, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector"); len(s) != 1 || s["app.kubernetes.io/name"] != "meshlet" {
		t.Errorf("Service selector %v", s)
	}
}

// TestChartValues: the values beyond kustomize's defaults reach the
// objects (everything.yaml sets each).
func TestChartValues(t *testing.T) {
	objs := decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "-f", "testdata/values/everything.yaml",
		"--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"))
	ds := find(objs, "DaemonSet", "meshlet")
	var spec struct {
		Spec struct {
			UpdateStrategy map[string]any `json:"updateStrategy"`
			Template       struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
				Spec     corev1.PodSpec    `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	b, _ := yaml.Marshal(ds.Object)
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	pod := spec.Spec.Template
	check := func(what string, ok bool, got any) {
		t.Helper()
		if !ok {
			t.Errorf("%s: got %v", what, got)
		}
	}
	ru, _ := spec.Spec.UpdateStrategy["rollingUpdate"].(map[string]any)
	check("updateStrategy", ru["maxUnavailable"] == "25%", spec.Spec.UpdateStrategy)
	check("priorityClassName", pod.Spec.PriorityClassName == "mesh-critical", pod.Spec.PriorityClassName)
	check("affinity", pod.Spec.Affinity != nil && pod.Spec.Affinity.NodeAffinity != nil, pod.Spec.Affinity)
	check("tolerations", len(pod.Spec.Tolerations) == 1 && pod.Spec.Tolerations[0].Key == "node-role.kubernetes.io/control-plane", pod.Spec.Tolerations)
	check("nodeSelector", len(pod.Spec.NodeSelector) == 2 && pod.Spec.NodeSelector["example.com/mesh"] == "true", pod.Spec.NodeSelector)
	check("podAnnotations", pod.Metadata.Annotations["example.com/owner"] == "network-team", pod.Metadata.Annotations)
	check("podLabels", pod.Metadata.Labels["example.com/tier"] == "network", pod.Metadata.Labels)
	check("imagePullSecrets", len(pod.Spec.ImagePullSecrets) == 1 && pod.Spec.ImagePullSecrets[0].Name == "regcred", pod.Spec.ImagePullSecrets)
	c := pod.Spec.Containers[0]
	check("image digest", c.Image == "registry.example/mirror/meshlet@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", c.Image)
	check("pull policy", c.ImagePullPolicy == corev1.PullIfNotPresent, c.ImagePullPolicy)
	check("extraArgs", c.Args[len(c.Args)-1] == "--log-level=debug", c.Args)
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	check("extraEnv", env["GODEBUG"] == "madvdontneed=1" && env["KUBERNETES_SERVICE_PORT"] == "7445", env)
	check("resources", c.Resources.Requests.Cpu().String() == "20m", c.Resources)
	check("mtu", strings.Contains(strings.Join(c.Args, " "), "--mtu=1380"), c.Args)
	check("privileged=false", c.SecurityContext != nil && c.SecurityContext.Privileged != nil && !*c.SecurityContext.Privileged, c.SecurityContext)
	pm := find(objs, "PodMonitor", "meshlet")
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	ep := eps[0].(map[string]any)
	check("podMonitor interval", ep["interval"] == "15s" && ep["scrapeTimeout"] == "5s", ep)
	check("podMonitor labels", pm.GetLabels()["release"] == "kube-prometheus-stack", pm.GetLabels())
	check("prometheusRule labels", find(objs, "PrometheusRule", "meshlet").GetLabels()["release"] == "kube-prometheus-stack", nil)
	check("dashboard label", find(objs, "ConfigMap", "meshlet-dashboard").GetLabels()["grafana_dashboard"] == "1", nil)
	check("admissionPolicy", find(objs, "ValidatingAdmissionPolicy", "meshlet") == nil, "rendered")
	secrets := fmt.Sprint(find(objs, "Role", "meshlet").Object["rules"])
	check("remoteSecrets and clusterMesh's Secrets", strings.Contains(secrets, "resourceNames:[cluster-c-kubeconfig b-kubeconfig] resources:[secrets]"), secrets)
}

// TestChartMonitoringNeedsTheAPI: the Prometheus Operator's objects are
// rendered only where the cluster serves their API, whatever the values.
func TestChartMonitoringNeedsTheAPI(t *testing.T) {
	on := []string{"template", "meshlet", "chart", "--namespace", ns, "--skip-tests", "--set",
		"monitoring.podMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.grafanaDashboard.enabled=true"}
	without := decode(t, helm(t, on...))
	if find(without, "PodMonitor", "meshlet") != nil || find(without, "PrometheusRule", "meshlet") != nil {
		t.Error("PodMonitor or PrometheusRule rendered for a cluster without monitoring.coreos.com/v1")
	}
	if find(without, "ConfigMap", "meshlet-dashboard") == nil {
		t.Error("the dashboard ConfigMap needs no operator, yet was left out")
	}
	with := decode(t, helm(t, append(on, "--api-versions", "monitoring.coreos.com/v1/PodMonitor")...))
	if find(with, "PodMonitor", "meshlet") == nil || find(with, "PrometheusRule", "meshlet") != nil {
		t.Error("with PodMonitor's API only: want the PodMonitor and no PrometheusRule")
	}
}

// TestChartTestHook: helm test's pod runs `meshlet diagnose` on the
// release's namespace as the agent reaches the API server, is not taken
// for an agent, and is the only test hook (helm test --logs reads every
// test hook's logs as a pod's).
func TestChartTestHook(t *testing.T) {
	objs := decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "--set", "apiServer.host=127.0.0.1,apiServer.port=7445",
		"--show-only", "templates/tests/diagnose.yaml"))
	if len(objs) != 6 {
		t.Fatalf("%d objects, want ServiceAccount, ClusterRole(Binding), Role(Binding), Pod", len(objs))
	}
	for _, o := range objs {
		if isHook := o.GetAnnotations()["helm.sh/hook"] == "test"; isHook != (o.GetKind() == "Pod") {
			t.Errorf("%s %s: test hook %v, want the pod alone", o.GetKind(), o.GetName(), isHook)
		}
	}
	pod := find(objs, "Pod", "meshlet-test-diagnose")
	if pod == nil {
		t.Fatal("no test pod")
	}
	var p corev1.Pod
	if err := runtimeFromMap(pod.Object, &p); err != nil {
		t.Fatal(err)
	}
	c := p.Spec.Containers[0]
	if strings.Join(c.Args, " ") != "diagnose --namespace="+ns+" --agents=false" || !p.Spec.HostNetwork || p.Labels["app.kubernetes.io/name"] == "meshlet" {
		t.Errorf("test pod: args %v, hostNetwork %v, labels %v", c.Args, p.Spec.HostNetwork, p.Labels)
	}
	if len(c.Env) != 2 || c.Env[0].Value != "127.0.0.1" || c.Env[1].Value != "7445" {
		t.Errorf("test pod env %v: want the agent's API server", c.Env)
	}
	// Least privilege: no exec into the privileged agents, Secrets only by
	// the names the agents may read (none here).
	role := find(objs, "Role", "meshlet-test")
	if role == nil {
		t.Fatal("no test Role")
	}
	rules := fmt.Sprint(role.Object["rules"])
	if strings.Contains(rules, "pods/exec") || strings.Contains(rules, "pods/proxy") || strings.Contains(rules, "secrets") {
		t.Errorf("test Role rules %s: want no pods/exec, pods/proxy or secrets", rules)
	}
	named := decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "--set", "remoteSecrets={cluster-b-kubeconfig}",
		"--show-only", "templates/tests/diagnose.yaml"))
	if r := find(named, "Role", "meshlet-test"); r == nil || !strings.Contains(fmt.Sprint(r.Object["rules"]), "resourceNames:[cluster-b-kubeconfig] resources:[secrets] verbs:[get]") {
		t.Errorf("test Role with remoteSecrets: %v, want get on secrets by name", r)
	}
	if _, err := exec.Command(helmBin(t), "template", "meshlet", "chart", "--set", "tests.enabled=false", "--show-only", "templates/tests/diagnose.yaml").CombinedOutput(); err == nil {
		t.Error("tests.enabled=false still renders the test hook")
	}
}

// TestChartNotes: what `helm install` prints, whole, from a real API
// server: in a namespace labelled for privileged pods (manifests/namespace),
// and in one without the label (what --create-namespace makes; the
// DaemonSet would have 0 pods on Talos) with monitoring asked for where the
// Prometheus Operator is missing.
func TestChartNotes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv := apiserver.Start(t, apiserver.Options{})
	admin := srv.AdminConfig()
	kubeconfig := srv.WriteKubeconfig("admin", admin)
	cs := kubernetes.NewForConfigOrDie(admin)
	for name, labels := range map[string]map[string]string{
		ns:        {"pod-security.kubernetes.io/enforce": "privileged"},
		"created": nil,
	} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	notes := func(namespace string, set ...string) []byte {
		t.Helper()
		args := []string{"install", "meshlet", "chart", "--namespace", namespace, "--dry-run=server", "--kubeconfig", kubeconfig}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		cmd := exec.CommandContext(ctx, helmBin(t), args...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(dir, "cache"), "HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
			"HELM_DATA_HOME="+filepath.Join(dir, "data"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		i := bytes.Index(out, []byte("\nNOTES:\n"))
		if i < 0 {
			t.Fatalf("helm install printed no NOTES:\n%s", out)
		}
		return out[i+len("\nNOTES:\n"):]
	}
	// install refuses what lint and template refuse (TestChartSchema).
	helmFails(t, "additional properties 'kilo' not allowed", "install", "meshlet", "chart", "--namespace", ns, "--dry-run=server",
		"--kubeconfig", kubeconfig, "-f", "testdata/values/cozystack-kilo.yaml")
	helmFails(t, "additional properties 'transitCidr' not allowed", "install", "meshlet", "chart", "--namespace", ns, "--dry-run=server",
		"--kubeconfig", kubeconfig, "-f", "testdata/values/typo.yaml")
	golden(t, "notes-privileged.txt", notes(ns))
	golden(t, "notes-unlabelled.txt", notes("created", "monitoring.podMonitor.enabled=true"))
}
