package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// kgShape is one of the DaemonSets kg runs in, written as Kilo 0.7's
// manifests (manifests/kilo-*.yaml in github.com/squat/kilo) and
// Cozystack's cozy-kilo chart (packages/system/kilo) write it, with
// meshlet's image. Their facts, as those projects ship them: kg's image has
// kg as its entrypoint and no manifest sets the kilo container's command
// (kg's flags alone); every shape runs hostNetwork and privileged, with
// NODE_NAME from spec.nodeName (NODE_IP from status.hostIP where
// --internal-cidr uses it), port 1107 named metrics, and ServiceAccount kilo
// bound to Kilo's ClusterRole (nodes list/patch/watch, peers list/watch,
// customresourcedefinitions get); each shape's args, kubeconfig and init
// containers are in its fields below and in e2e/node/README.md.
type kgShape struct {
	name      string
	namespace string
	// kubeconfig: the ConfigMap kg's kubeconfig comes from, its key, and
	// whether it is mounted as a directory at /etc/kubernetes (Typhoon,
	// Cozystack) or by subPath at /etc/kubernetes/kubeconfig (kubeadm).
	kubeconfigCM, kubeconfigKey string
	subPath                     bool
	args                        []string // after --kubeconfig and --hostname
	cni                         bool     // Kilo as the CNI: install-cni and ConfigMap kilo
	// k3s: the kubeconfig written by the generate-kubeconfig init container
	// (/bin/sh /scripts/init.sh from ConfigMap kilo-scripts, in the kilo
	// image) from the k3s agent's files into an emptyDir, as Kilo's k3s
	// manifests do; kubeconfigCM is then unused.
	k3s bool
	// sidecar: the userspace manifests' wireguard container (wireguard-go
	// --foreground kilo0) sharing hostPath /var/run/wireguard with kg,
	// which runs with --create-interface=false.
	sidecar bool
	// addon: meshlet's add-on grants (manifests/dropin) applied before the
	// manifest, bound to its ServiceAccount kilo: Lease failover, Events,
	// ClusterMesh and the uninstall check on. Without them the agents run
	// under kg's ClusterRole alone, and diagnose says what is off.
	addon bool
	// helm: installed as Cozystack installs it, a Helm release "kilo" of
	// a chart whose templates are the manifest and Kilo's Peer CRD, the
	// image from values kilo.image.repository and kilo.image.tag; the
	// image changed with `helm upgrade --reuse-values --set
	// kilo.image.tag=…` (what setting the Package's values does), removed
	// with `helm uninstall`.
	helm bool
	// kubePrism: the kubeconfig Cozystack's ConfigMap holds on Talos, the
	// API server at KubePrism's https://127.0.0.1:7445 (Lane.KubePrism on
	// every node).
	kubePrism bool
	// heterogeneous: kilo-k3s-userspace-heterogeneous's two DaemonSets
	// (daemonSets); dsName and nodeSelector are set on each.
	heterogeneous        bool
	dsName, nodeSelector string
	// prepare sets the nodes up as the shape's CNI would (flannel.1).
	prepare func(ctx context.Context, l *Lane) error
	// skip, when not "", is why the shape cannot run here.
	skip string
}

// kiloCNIConf is what Kilo's ConfigMap kilo holds under cni-conf.json: a
// bridge kube-bridge with host-local IPAM without a range (kg fills in the
// node's pod CIDR) and portmap.
const kiloCNIConf = `{"cniVersion":"0.4.0","name":"kilo","plugins":[
 {"name":"kubernetes","type":"bridge","bridge":"kube-bridge","isDefaultGateway":true,"forceAddress":true,"mtu":1420,"ipam":{"type":"host-local"}},
 {"type":"portmap","snat":true,"capabilities":{"portMappings":true}}]}`

// installCNI is the install-cni init container's script: the plugins to the
// host, the conflist written, every other file of the directory removed.
const installCNI = `set -e -x; cp /opt/cni/bin/* /host/opt/cni/bin/; TMP_CONF="$CNI_CONF_NAME".tmp; echo "$CNI_NETWORK_CONFIG" > $TMP_CONF; rm -f /host/etc/cni/net.d/*; cp $TMP_CONF /host/etc/cni/net.d/$CNI_CONF_NAME; rm -f $TMP_CONF;`

// manifest is the shape's objects in the order Kilo's manifests list them
// (ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet), so that
// `kubectl delete -f` of it is the uninstall a user does. Only the image is
// meshlet's.
func (s kgShape) manifest(image, kubeconfig string) string {
	var b strings.Builder
	ns := s.namespace
	indent := func(text, pre string) string {
		return pre + strings.ReplaceAll(strings.TrimSpace(text), "\n", "\n"+pre)
	}
	if s.k3s {
		fmt.Fprintf(&b, `apiVersion: v1
kind: ConfigMap
metadata: {name: kilo-scripts, namespace: %s}
data:
  init.sh: |
%s
`, ns, indent(k3sInitScript, "    "))
	} else {
		fmt.Fprintf(&b, `apiVersion: v1
kind: ConfigMap
metadata: {name: %s, namespace: %s}
data:
  %s: |
%s
`, s.kubeconfigCM, ns, s.kubeconfigKey, indent(kubeconfig, "    "))
	}
	if s.cni {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: ConfigMap
metadata: {name: kilo, namespace: %s, labels: {app.kubernetes.io/name: kilo}}
data:
  cni-conf.json: |
%s
`, ns, indent(kiloCNIConf, "    "))
	}
	fmt.Fprintf(&b, `---
apiVersion: v1
kind: ServiceAccount
metadata: {name: kilo, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kilo}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [list, patch, watch]}
- {apiGroups: [kilo.squat.ai], resources: [peers], verbs: [list, watch]}
- {apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kilo}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kilo}
subjects: [{kind: ServiceAccount, name: kilo, namespace: %[1]s}]
`, ns)
	for _, d := range s.daemonSets() {
		d.daemonSet(&b, image)
	}
	return b.String()
}

// daemonSets are the shape's DaemonSets: one, or kilo-k3s-userspace-
// heterogeneous's two — kilo on the nodes nkml labels
// nkml.squat.ai/wireguard=true (kernel WireGuard), kilo-userspace with
// the userspace device in a sidecar on the others.
func (s kgShape) daemonSets() []kgShape {
	if !s.heterogeneous {
		return []kgShape{s}
	}
	kernel, user := s, s
	kernel.dsName, kernel.nodeSelector, kernel.args = "kilo", "true", []string{"--interface=kilo0"}
	user.dsName, user.nodeSelector, user.args, user.sidecar = "kilo-userspace", "false", []string{"--create-interface=false", "--interface=kilo0"}, true
	return []kgShape{kernel, user}
}

// daemonSet writes one DaemonSet of the shape.
func (s kgShape) daemonSet(b *strings.Builder, image string) {
	name := s.dsName
	if name == "" {
		name = "kilo"
	}
	selector := ""
	if s.nodeSelector != "" {
		selector = fmt.Sprintf("      nodeSelector: {nkml.squat.ai/wireguard: %q}\n", s.nodeSelector)
	}
	fmt.Fprintf(b, `---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: %[4]s
  namespace: %[1]s
  labels: {app.kubernetes.io/name: %[4]s, app.kubernetes.io/part-of: kilo}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: %[4]s, app.kubernetes.io/part-of: kilo}
  template:
    metadata:
      labels: {app.kubernetes.io/name: %[4]s, app.kubernetes.io/part-of: kilo}
    spec:
%[5]s      serviceAccountName: kilo
      hostNetwork: true
      containers:
%[3]s      - name: kilo
        image: %[2]s
        args:
        - --kubeconfig=/etc/kubernetes/kubeconfig
        - --hostname=$(NODE_NAME)
`, s.namespace, image, s.sidecarContainer(), name, selector)
	for _, a := range s.args {
		fmt.Fprintf(b, "        - %s\n", a)
	}
	kubeMount := "{name: kubeconfig, mountPath: /etc/kubernetes, readOnly: true}"
	if s.subPath && !s.k3s {
		kubeMount = fmt.Sprintf("{name: kubeconfig, mountPath: /etc/kubernetes/kubeconfig, subPath: %s, readOnly: true}", s.kubeconfigKey)
	}
	fmt.Fprintf(b, `        env:
        - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
        - {name: NODE_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
        ports: [{containerPort: 1107, name: metrics}]
        securityContext: {privileged: true}
        volumeMounts:
        - {name: kilo-dir, mountPath: /var/lib/kilo}
        - %s
        - {name: lib-modules, mountPath: /lib/modules, readOnly: true}
        - {name: xtables-lock, mountPath: /run/xtables.lock, readOnly: false}
`, kubeMount)
	if s.sidecar {
		b.WriteString("        - {name: wireguard, mountPath: /var/run/wireguard, readOnly: false}\n")
	}
	if s.cni {
		// kg writes the pod CIDR into the conflist install-cni wrote.
		b.WriteString("        - {name: cni-conf-dir, mountPath: /etc/cni/net.d}\n")
	}
	if s.cni || s.k3s {
		b.WriteString("      initContainers:\n")
	}
	if s.k3s {
		fmt.Fprintf(b, `      - name: generate-kubeconfig
        image: %s
        command: [/bin/sh]
        args: [/scripts/init.sh]
        volumeMounts:
        - {name: kubeconfig, mountPath: /etc/kubernetes}
        - {name: scripts, mountPath: /scripts/, readOnly: true}
        - {name: k3s-agent, mountPath: /var/lib/rancher/k3s/agent/, readOnly: true}
        env:
        - {name: NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
`, image)
	}
	if s.cni {
		fmt.Fprintf(b, `      - name: install-cni
        image: %s
        command: [/bin/sh, -c, '%s']
        env:
        - {name: CNI_CONF_NAME, value: 10-kilo.conflist}
        - {name: CNI_NETWORK_CONFIG, valueFrom: {configMapKeyRef: {name: kilo, key: cni-conf.json}}}
        volumeMounts:
        - {name: cni-bin-dir, mountPath: /host/opt/cni/bin}
        - {name: cni-conf-dir, mountPath: /host/etc/cni/net.d}
`, image, installCNI)
	}
	fmt.Fprintf(b, `      tolerations:
      - {effect: NoSchedule, operator: Exists}
      - {effect: NoExecute, operator: Exists}
      volumes:
      - {name: kilo-dir, hostPath: {path: /var/lib/kilo}}
      - {name: lib-modules, hostPath: {path: /lib/modules}}
      - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
`)
	if s.k3s {
		b.WriteString(`      - {name: kubeconfig, emptyDir: {}}
      - {name: scripts, configMap: {name: kilo-scripts}}
      - {name: k3s-agent, hostPath: {path: /var/lib/rancher/k3s/agent}}
`)
	} else {
		fmt.Fprintf(b, "      - {name: kubeconfig, configMap: {name: %s}}\n", s.kubeconfigCM)
	}
	if s.sidecar {
		b.WriteString("      - {name: wireguard, hostPath: {path: /var/run/wireguard}}\n")
	}
	if s.cni {
		b.WriteString(`      - {name: cni-bin-dir, hostPath: {path: /opt/cni/bin}}
      - {name: cni-conf-dir, hostPath: {path: /etc/cni/net.d}}
`)
	}
}

// sidecarContainer is the userspace manifests' wireguard container, the
// first of the pod's as there: wireguard-go from this tree's module graph
// (golang.zx2c4.com/wireguard, the library meshlet's own userspace device
// is built on), in an image of its own (pushImages). Its arguments are
// kilo-kubeadm-userspace's; kilo-kubeadm-flannel-userspace's first one,
// "wireguard-go=true", is read by that image's entrypoint, not modelled.
func (s kgShape) sidecarContainer() string {
	if !s.sidecar {
		return ""
	}
	return `      - name: wireguard
        image: ` + registry + `/e2e/wireguard-go:1
        args: [wireguard-go, --foreground, kilo0]
        securityContext: {privileged: true}
        volumeMounts:
        - {name: wireguard, mountPath: /var/run/wireguard, readOnly: false}
`
}

// k3sInitScript is Kilo 0.7's kilo-scripts init.sh (kilo-k3s*.yaml): the
// kubeconfig from the k3s agent's kubelet.kubeconfig (its server), the
// k3s server's CA and the pod's ServiceAccount token.
const k3sInitScript = `#!/bin/sh
cat > /etc/kubernetes/kubeconfig <<EOF
    apiVersion: v1
    kind: Config
    name: kilo
    clusters:
    - cluster:
        server: $(sed -n 's/.*server: \(.*\)/\1/p' /var/lib/rancher/k3s/agent/kubelet.kubeconfig)
        certificate-authority: /var/lib/rancher/k3s/agent/server-ca.crt
    users:
    - name: kilo
      user:
        token: $(cat /var/run/secrets/kubernetes.io/serviceaccount/token)
    contexts:
    - name: kilo
      context:
        cluster: kilo
        namespace: ${NAMESPACE}
        user: kilo
    current-context: kilo
EOF
`

// inClusterKubeconfig is the kubeconfig of Typhoon's and Cozystack's
// ConfigMap kubeconfig-in-cluster (kubeadm's kube-proxy ConfigMap holds
// the same): the pod's ServiceAccount token and CA, the API server's
// address (no kube-proxy here, so not the Service's).
const inClusterKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://%s:%d
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
- name: service-account
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
- context: {cluster: local, user: service-account}
  name: default
current-context: default
`

// kubePrismKubeconfig is Cozystack's ConfigMap kubeconfig-in-cluster
// (packages/system/kilo/templates/configmap.yaml) as it ships: KubePrism's
// address, the pod's ServiceAccount CA and token.
const kubePrismKubeconfig = `apiVersion: v1
clusters:
- cluster:
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    server: https://127.0.0.1:7445
  name: local
contexts:
- context:
    cluster: local
    user: service-account
  name: local
current-context: local
kind: Config
users:
- name: service-account
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
`

// subnet is the shape's WireGuard subnet (--subnet, kg's default else).
func (s kgShape) subnet() string {
	for _, a := range s.args {
		if v, ok := strings.CutPrefix(a, "--subnet="); ok {
			return v
		}
	}
	return "10.4.0.0/16"
}

// flannel says whether the shape runs beside flannel (flannel.1 carries the
// traffic inside a location).
func (s kgShape) flannel() bool {
	for _, a := range s.args {
		if a == "--compatibility=flannel" {
			return true
		}
	}
	return false
}

// chart writes the shape as a Helm chart into dir, as Cozystack's kilo
// package is one: the manifest with the image from values, and Kilo's Peer
// CRD as a template of the same release (so it is Helm's, and goes with
// the release).
func (s kgShape) chart(dir, kubeconfig string, peerCRD []byte) error {
	files := map[string]string{
		"Chart.yaml":               "apiVersion: v2\nname: kilo\nversion: 0.0.0\n",
		"values.yaml":              "kilo:\n  image:\n    repository: ghcr.io/cozystack/cozystack/kilo\n    tag: v0.8.0\n",
		"templates/kilo.yaml":      s.manifest("{{ .Values.kilo.image.repository }}:{{ .Values.kilo.image.tag }}", kubeconfig),
		"templates/crd-peers.yaml": string(peerCRD),
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// dropinGrants is the add-on as docs/dropin.md says to apply it in the
// DaemonSet's namespace ns: manifests/dropin with namespace: in
// grants/kustomization.yaml set to ns (a copy, beside components/ it
// refers to, under dir).
func dropinGrants(t *testing.T, ns, dir string) string {
	t.Helper()
	src := filepath.Join(repoRoot(t), "manifests")
	if ns == "kube-system" {
		return filepath.Join(src, "dropin")
	}
	dst := filepath.Join(dir, "manifests-"+ns)
	for _, d := range []string{"dropin", "components"} {
		if err := os.CopyFS(filepath.Join(dst, d), os.DirFS(filepath.Join(src, d))); err != nil {
			t.Fatal(err)
		}
	}
	kf := filepath.Join(dst, "dropin", "grants", "kustomization.yaml")
	k, err := os.ReadFile(kf)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(k), "namespace: kube-system") {
		t.Fatalf("%s: no namespace: kube-system to set", kf)
	}
	if err := os.WriteFile(kf, []byte(strings.Replace(string(k), "namespace: kube-system", "namespace: "+ns, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dst, "dropin")
}

// kgShapes are the shapes the lane runs, in this order: Kilo as the CNI
// replaces the lane's own CNI configuration, so it runs last.
func kgShapes() []kgShape {
	return []kgShape{
		{
			name: "cozy-kilo (Cozystack's release, KubePrism) + meshlet's add-on grants", namespace: "cozy-kilo",
			kubeconfigCM: "kubeconfig-in-cluster", kubeconfigKey: "kubeconfig", helm: true, kubePrism: true, addon: true,
			args: []string{"--cni=false", "--clean-up-interface=false", "--compatibility=cilium", "--encapsulate=crosssubnet",
				"--local=false", "--mesh-granularity=location", "--subnet=100.66.0.0/16", "--mtu=auto", "--internal-cidr=$(NODE_IP)/32"},
		},
		{
			name: "kilo-kubeadm-flannel", namespace: "kube-system",
			kubeconfigCM: "kube-proxy", kubeconfigKey: "kubeconfig.conf", subPath: true,
			args:    []string{"--cni=false", "--compatibility=flannel", "--local=false", "--internal-cidr=$(NODE_IP)/32"},
			prepare: flannelVXLAN,
		},
		{
			name: "kilo-k3s-flannel", namespace: "kube-system", k3s: true,
			args:    []string{"--cni=false", "--compatibility=flannel", "--local=false", "--internal-cidr=$(NODE_IP)/32"},
			prepare: k3sAgent,
		},
		{
			name: "kilo-kubeadm-flannel-userspace + meshlet's add-on grants", namespace: "kube-system", sidecar: true, addon: true,
			kubeconfigCM: "kube-proxy", kubeconfigKey: "kubeconfig.conf", subPath: true,
			args: []string{"--create-interface=false", "--interface=kilo0", "--cni=false", "--compatibility=flannel", "--local=false",
				"--internal-cidr=$(NODE_IP)/32"},
		},
		{
			name: "kilo-kubeadm (Kilo as the CNI)", namespace: "kube-system",
			kubeconfigCM: "kube-proxy", kubeconfigKey: "kubeconfig.conf", subPath: true, cni: true,
			prepare: withoutLaneCNI,
		},
		{
			name: "kilo-kubeadm-userspace (Kilo as the CNI, wireguard-go sidecar)", namespace: "kube-system", sidecar: true, cni: true,
			kubeconfigCM: "kube-proxy", kubeconfigKey: "kubeconfig.conf", subPath: true,
			args: []string{"--create-interface=false", "--interface=kilo0"},
		},
		{
			name: "kilo-k3s-userspace-heterogeneous (DaemonSets kilo and kilo-userspace, Kilo as the CNI)", namespace: "kube-system",
			k3s: true, cni: true, heterogeneous: true, prepare: nkmlLabels,
		},
	}
}

// nkmlLabels labels the nodes as nkml (kilo-k3s-userspace-heterogeneous's
// node labeller, whose image is not reachable here) does from whether the
// wireguard module loads: node1 as having it, the others not, so each of
// the shape's DaemonSets runs on a node. The kernel here has no WireGuard,
// so the agent of DaemonSet kilo runs its device as a child, as it would on
// a node nkml labelled wrongly. The k3s agent's files are the earlier k3s
// shape's (k3sAgent).
func nkmlLabels(ctx context.Context, l *Lane) error {
	for i, n := range l.Nodes() {
		if _, err := l.Kubectl(ctx, "label", "--overwrite", "node", n.Name, fmt.Sprintf("nkml.squat.ai/wireguard=%v", i == 0)); err != nil {
			return err
		}
	}
	return nil
}

// k3sAgent writes on every node what Kilo's k3s init script reads from the
// k3s agent's directory: kubelet.kubeconfig (its server line) and the
// server's CA. The flannel.1 of the shape before stays.
//
// Kilo 0.7's script names no cluster in the kubeconfig it writes (its one
// clusters entry has no name, the context names "kilo"), so client-go — kg's
// and meshlet's alike — finds no usable configuration there and falls back
// to the pod's in-cluster one: the API server through the kubernetes
// Service (10.0.0.1:443). There is no kube-proxy here, so each node gets
// the one DNAT kube-proxy would give it for that Service (nftables, a table
// of its own: no iptables chain for meshlet's backend detection to see).
func k3sAgent(ctx context.Context, l *Lane) error {
	for _, n := range l.Nodes() {
		for _, c := range [][]string{
			{"add", "table", "ip", "lane-kube-proxy"},
			{"add", "chain", "ip", "lane-kube-proxy", "out", "{ type nat hook output priority -100; }"},
			{"add", "rule", "ip", "lane-kube-proxy", "out", "ip", "daddr", "10.0.0.1", "tcp", "dport", "443", "dnat", "to", fmt.Sprintf("%s:%d", cpIP, apiPort)},
		} {
			if err := run(append([]string{"ip", "netns", "exec", n.NS, "nft"}, c...)...); err != nil {
				return err
			}
		}
	}
	ca, err := os.ReadFile(l.path("pki", "ca.crt"))
	if err != nil {
		return err
	}
	kubelet := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: /var/lib/rancher/k3s/agent/server-ca.crt
    server: https://%s:%d
  name: local
`, cpIP, apiPort)
	for _, n := range l.Nodes() {
		dir := filepath.Join(n.Dir, "priv", "var-lib", "rancher", "k3s", "agent")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := errors.Join(os.WriteFile(filepath.Join(dir, "kubelet.kubeconfig"), []byte(kubelet), 0o600),
			os.WriteFile(filepath.Join(dir, "server-ca.crt"), ca, 0o644)); err != nil {
			return err
		}
	}
	return nil
}

// flannelVXLAN sets up flannel.1 on every node as flanneld's vxlan backend
// does (VNI 1, port 8472, nolearning, the pod subnet's network address as
// its /32, a static neighbour and FDB entry per other node); flanneld itself
// is not built here. flanneld's route to every other node's pod subnet is
// left out: with each node a location of its own Kilo routes those subnets
// through WireGuard.
func flannelVXLAN(ctx context.Context, l *Lane) error {
	nodes := l.Nodes()
	mac := func(n *Node) string { return fmt.Sprintf("0a:58:0a:fb:%02x:00", n.Index) }
	for _, n := range nodes {
		gw := strings.TrimSuffix(n.PodCIDR, "/24")
		cmds := [][]string{
			{"link", "add", "flannel.1", "address", mac(n), "type", "vxlan", "id", "1", "local", n.IP, "dev", "eth0", "dstport", "8472", "nolearning"},
			{"addr", "add", gw + "/32", "dev", "flannel.1"},
			{"link", "set", "flannel.1", "up"},
		}
		for _, o := range nodes {
			if o == n {
				continue
			}
			ogw := strings.TrimSuffix(o.PodCIDR, "/24")
			cmds = append(cmds,
				[]string{"neigh", "replace", ogw, "lladdr", mac(o), "dev", "flannel.1", "nud", "permanent"},
				[]string{"fdb", "append", mac(o), "dev", "flannel.1", "dst", o.IP})
		}
		for _, c := range cmds {
			if c[0] == "fdb" {
				if err := run(append([]string{"ip", "netns", "exec", n.NS, "bridge"}, c...)...); err != nil {
					return err
				}
				continue
			}
			if err := run(append([]string{"ip", "-n", n.NS}, c...)...); err != nil {
				return err
			}
		}
	}
	return nil
}

// withoutLaneCNI removes the lane's pod network (bridge cni0, which holds
// each node's pod subnet's first address, as kube-bridge will) once the
// earlier shapes' pods are gone: Kilo as the CNI is installed on nodes
// that run no other CNI.
func withoutLaneCNI(ctx context.Context, l *Lane) error {
	cs := kubernetes.NewForConfigOrDie(l.Config("admin"))
	if err := poll(ctx, 2*time.Minute, "earlier pods gone", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(p.Items) == 0, err
	}); err != nil {
		return err
	}
	for _, n := range l.Nodes() {
		if err := run("ip", "-n", n.NS, "link", "del", "cni0"); err != nil {
			return err
		}
	}
	return nil
}

// TestKgShapes runs meshlet's image in kg's own DaemonSets, only the image
// changed, on real kubelets (README.md, "kg's DaemonSets").
func TestKgShapes(t *testing.T) {
	cur := laneRelease(t)
	bins := Bins{K8s: env(t, "MESHLET_K8S_BIN"), Node: env(t, "MESHLET_NODE_BIN"), Tools: env(t, "MESHLET_TOOLS_BIN")}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "meshlet-e2e-kgshape-")
	if err != nil {
		t.Fatal(err)
	}
	lane := NewLane(dir, bins, t.Logf)
	t.Cleanup(func() {
		lane.Teardown()
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("logs kept in %s", dir)
		}
	})
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("network", lane.Network(2))
	must("pki", lane.PKI())
	must("control plane", lane.ControlPlane(ctx))
	cs := kubernetes.NewForConfigOrDie(lane.Config("admin"))
	must("images", pushImages(ctx, t, lane, cur.ImageTar, dir))
	for _, n := range lane.Nodes() {
		must("kubelet "+n.Name, lane.StartNode(ctx, n, ""))
		must("node Ready", waitNodeReady(ctx, cs, n.Name, 2*time.Minute))
		// The pod CIDR by hand (no node IPAM here); a location per node and
		// its endpoint, as a user annotates them.
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"kilo.squat.ai/location":"loc-%d","kilo.squat.ai/force-endpoint":"%s:51820"}},"spec":{"podCIDR":"%s","podCIDRs":["%s"]}}`,
			n.Index, n.IP, n.PodCIDR, n.PodCIDR)
		_, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		must("node patch", err)
	}
	// Cozystack's namespace, privileged as its platform namespaces are (the
	// lane enforces baseline outside kube-system, as Talos does). Kilo's
	// Peer CRD comes with each shape (runKgShape).
	// The ClusterMesh CRD, as where kilo-clustermesh-operator runs: under
	// kg's ClusterRole the agents may not read ClusterMeshes (diagnose says
	// so); the add-on grants turn it on.
	_, err = lane.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(repoRoot(t), "manifests", "crds", "clustermeshes.kilo.squat.ai.yaml"))
	must("ClusterMesh CRD", err)
	_, err = lane.Kubectl(ctx, "create", "namespace", "cozy-kilo")
	must("namespace", err)
	_, err = lane.Kubectl(ctx, "label", "namespace", "cozy-kilo", "pod-security.kubernetes.io/enforce=privileged")
	must("namespace label", err)
	for i, s := range kgShapes() {
		s := s
		t.Run(s.name, func(t *testing.T) {
			if s.skip != "" {
				t.Skip(s.skip)
			}
			runKgShape(ctx, t, lane, cs, s, fmt.Sprintf("s%d", i), dir, env(t, "MESHLET_BIN"))
		})
	}
}

// kiloPods waits for one Ready pod of the shape's DaemonSet per node, all
// running image.
func kiloPods(ctx context.Context, cs kubernetes.Interface, ns, image string, want int) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	err := poll(ctx, 4*time.Minute, "kilo pods "+image+" Ready", func() (bool, error) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=kilo"})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		var state []string
		for _, p := range l.Items {
			state = append(state, fmt.Sprintf("%s %s ready=%v %s restarts=%d", p.Name, kiloImage(p), podReady(p), p.Status.Phase, restarts(p)))
			if kiloImage(p) == image && podReady(p) && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		return len(pods) == want && len(l.Items) == want, fmt.Errorf("pods: %s", strings.Join(state, "; "))
	})
	return pods, err
}

// kiloImage is the image of the pod's kilo container (a userspace shape's
// wireguard container comes first).
func kiloImage(p corev1.Pod) string {
	for _, c := range p.Spec.Containers {
		if c.Name == "kilo" {
			return c.Image
		}
	}
	return ""
}

// nodeKey is kg's key file on the node (hostPath /var/lib/kilo, the node's
// private /var/lib).
func nodeKey(n *Node) string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "priv", "var-lib", "kilo", "key"))
	return string(b)
}

// hostState is what a node holds of the mesh: kilo0, routes to other nodes'
// pod subnets, non-default rules, iptables chains of Kilo's or meshlet's.
func hostState(ctx context.Context, l *Lane, n *Node) []string {
	var left []string
	if err := run("ip", "-n", n.NS, "link", "show", "kilo0"); err == nil {
		left = append(left, "kilo0")
	}
	out, _ := exec.CommandContext(ctx, "ip", "-n", n.NS, "route", "show", "table", "all").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "proto kernel") || strings.Contains(line, "table local") || strings.HasPrefix(line, "multicast") {
			continue
		}
		if strings.Contains(line, "kilo0") || strings.HasPrefix(line, podCIDRBase) && !strings.HasPrefix(line, n.PodCIDR) {
			left = append(left, "route "+line)
		}
	}
	out, _ = exec.CommandContext(ctx, "ip", "-n", n.NS, "rule").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] != "0:" && f[0] != "32766:" && f[0] != "32767:" {
			left = append(left, "rule "+line)
		}
	}
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, _ = exec.CommandContext(ctx, "ip", "netns", "exec", n.NS, save).Output()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, ":") && (strings.Contains(line, "KILO") || strings.Contains(line, "MESHLET")) {
				left = append(left, save+" chain "+strings.Fields(line)[0])
			}
		}
	}
	return left
}

// checkGrantsMode checks what the agents may do under the shape's RBAC, as
// `meshlet diagnose` (run as an admin would, reading the agents through
// pods/exec and kg's flags from the DaemonSet) reports it: under kg's
// ClusterRole alone the features it lacks, each with the grant that turns
// it on; with the add-on every feature, and then for real: an Event for a
// rejected Peer, and a location's Lease once two nodes share it.
func checkGrantsMode(ctx context.Context, t *testing.T, lane *Lane, cs kubernetes.Interface, s kgShape, meshletBin string) {
	t.Helper()
	out, _ := lane.InNS(ctx, meshletBin, "diagnose", "--kubeconfig", lane.AdminKubeconfig(), "--namespace", s.namespace)
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "grants") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	t.Logf("RESULT kg-shape %s: meshlet diagnose: %s", s.name, strings.Join(lines, " | "))
	if s.addon {
		if !strings.Contains(out, "may use every feature") {
			t.Errorf("with the add-on grants diagnose does not report every feature on:\n%s", out)
		}
	} else if !strings.Contains(out, "features off: leader-election") || !strings.Contains(out, "manifests/dropin") {
		t.Errorf("under kg's ClusterRole diagnose does not say Lease failover is off and what turns it on:\n%s", out)
	}
	if !s.addon {
		return
	}
	// Events: a Peer with a bad key is rejected with one.
	bad := `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"bad-key"},"spec":{"allowedIPs":["10.9.251.1/32"],"publicKey":"not-a-key"}}`
	f := filepath.Join(lane.Dir, "bad-peer.json")
	if err := os.WriteFile(f, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := lane.Kubectl(ctx, "apply", "-f", f); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	if err := poll(ctx, time.Minute, "an InvalidKey Event for Peer bad-key", func() (bool, error) {
		l, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad-key,reason=InvalidKey"})
		return err == nil && len(l.Items) > 0, err
	}); err != nil {
		t.Errorf("with the add-on grants: %v", err)
	} else {
		t.Logf("RESULT kg-shape %s: add-on: InvalidKey Event for a bad Peer after %.1fs", s.name, time.Since(from).Seconds())
	}
	if _, err := lane.Kubectl(ctx, "delete", "-f", f); err != nil {
		t.Fatal(err)
	}
	// ClusterMesh: a mesh naming a remote cluster whose Secret is absent
	// is read, and its status written (Ready False, naming the cluster).
	cm := `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"ClusterMesh","metadata":{"name":"lane","namespace":"` + s.namespace + `"},
"spec":{"clusters":[{"name":"local","local":true,"allowedNetworks":["10.251.0.0/16","` + s.subnet() + `"]},
{"name":"other","kubeconfigSecretRef":{"name":"other-kubeconfig","key":"kubeconfig"},"allowedNetworks":["10.99.0.0/16"]}]}}`
	f = filepath.Join(lane.Dir, "clustermesh.json")
	if err := os.WriteFile(f, []byte(cm), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := lane.Kubectl(ctx, "apply", "-f", f); err != nil {
		t.Fatal(err)
	}
	from = time.Now()
	var ready string
	if err := poll(ctx, time.Minute, "ClusterMesh lane's status written", func() (bool, error) {
		out, err := lane.Kubectl(ctx, "get", "clustermesh", "-n", s.namespace, "lane", "-o",
			`jsonpath={range .status.conditions[?(@.type=="Ready")]}{.status} {.reason}: {.message}{end}`)
		ready = strings.TrimSpace(out)
		return err == nil && ready != "", err
	}); err != nil {
		t.Errorf("with the add-on grants: %v", err)
	} else {
		t.Logf("RESULT kg-shape %s: add-on: ClusterMesh read, its status written %.1fs after it was applied: Ready %s", s.name, time.Since(from).Seconds(), ready)
	}
	if _, err := lane.Kubectl(ctx, "delete", "-f", f); err != nil {
		t.Fatal(err)
	}
	// Lease failover: node2 joins node1's location; the location's Lease
	// gets a holder. Then node2 goes back to its own. Meanwhile flannel.1
	// is missing (flanneld not running): inside a location flannel carries
	// the traffic, so the agents must say what is missing and recover once
	// it is back.
	nodes := lane.Nodes()
	if s.flannel() {
		for _, n := range nodes {
			if err := run("ip", "-n", n.NS, "link", "del", "flannel.1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	loc := func(n *Node, l string) {
		t.Helper()
		if _, err := lane.Kubectl(ctx, "annotate", "--overwrite", "node", n.Name, "kilo.squat.ai/location="+l); err != nil {
			t.Fatal(err)
		}
	}
	loc(nodes[1], fmt.Sprintf("loc-%d", nodes[0].Index))
	from = time.Now()
	lease := "meshlet-leader-" + fmt.Sprintf("loc-%d", nodes[0].Index)
	var holder string
	if err := poll(ctx, time.Minute, "Lease "+lease+" held", func() (bool, error) {
		l, err := cs.CoordinationV1().Leases(s.namespace).Get(ctx, lease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, err
		}
		holder = *l.Spec.HolderIdentity
		return holder != "", nil
	}); err != nil {
		t.Errorf("with the add-on grants, two nodes in one location: %v", err)
	} else {
		t.Logf("RESULT kg-shape %s: add-on: Lease %s/%s held by %s %.1fs after two nodes share a location", s.name, s.namespace, lease, holder, time.Since(from).Seconds())
	}
	if !s.flannel() {
		loc(nodes[1], fmt.Sprintf("loc-%d", nodes[1].Index))
		return
	}
	const flannelHint = "is flannel running on this node?"
	var said string
	if err := poll(ctx, time.Minute, "the agents naming flannel.1 missing", func() (bool, error) {
		out, err := lane.Kubectl(ctx, "logs", "-n", s.namespace, "-l", "app.kubernetes.io/part-of=kilo", "-c", "kilo", "--tail=400")
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, flannelHint) {
				said = l
			}
		}
		return said != "", err
	}); err != nil {
		t.Errorf("flannel.1 missing inside a location: %v", err)
	} else {
		t.Logf("RESULT kg-shape %s: flannel.1 missing: the agent says %s", s.name, said)
	}
	if err := flannelVXLAN(ctx, lane); err != nil {
		t.Fatal(err)
	}
	from = time.Now()
	if err := poll(ctx, time.Minute, "diagnose without a failed reconcile once flannel.1 is back", func() (bool, error) {
		out, _ := lane.InNS(ctx, meshletBin, "diagnose", "--kubeconfig", lane.AdminKubeconfig(), "--namespace", s.namespace)
		return !strings.Contains(out, "the last reconcile failed") && strings.Contains(out, "may use every feature"), fmt.Errorf("%s", out)
	}); err != nil {
		t.Errorf("after flannel.1 came back: %v", err)
	} else {
		t.Logf("RESULT kg-shape %s: flannel.1 back: every agent's last reconcile succeeds (diagnose) within %.1fs", s.name, time.Since(from).Seconds())
	}
	loc(nodes[1], fmt.Sprintf("loc-%d", nodes[1].Index))
}

// kgAnnotations are the annotations kg publishes on its node (kgctl reads
// them).
var kgAnnotations = []string{"kilo.squat.ai/key", "kilo.squat.ai/wireguard-ip", "kilo.squat.ai/endpoint",
	"kilo.squat.ai/internal-ip", "kilo.squat.ai/last-seen", "kilo.squat.ai/granularity"}

func runKgShape(ctx context.Context, t *testing.T, lane *Lane, cs kubernetes.Interface, s kgShape, id, dir, meshletBin string) {
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	nodes := lane.Nodes()
	image1, image2 := "ghcr.io/meshlet/meshlet:e2e1", "ghcr.io/meshlet/meshlet:e2e2"
	if s.prepare != nil {
		must("prepare", s.prepare(ctx, lane))
	}
	kubeconfig := fmt.Sprintf(inClusterKubeconfig, cpIP, apiPort)
	if s.kubePrism {
		prismCtx, stop := context.WithCancel(ctx)
		defer stop()
		for _, n := range nodes {
			carried, err := lane.KubePrism(prismCtx, n)
			must("KubePrism", err)
			// Checked once the agents have published: their API
			// connections went through KubePrism, not around it.
			defer func() {
				if t.Failed() {
					return
				}
				t.Logf("RESULT kg-shape %s: %s's KubePrism carried %d API connections", s.name, n.Name, carried.Load())
				if carried.Load() == 0 {
					t.Errorf("%s: no API connection through KubePrism (127.0.0.1:7445)", n.Name)
				}
			}()
		}
		kubeconfig = kubePrismKubeconfig
	}
	peerCRD := filepath.Join(repoRoot(t), "manifests", "crds", "peers.kilo.squat.ai.yaml")
	file := filepath.Join(dir, id+"-kilo.yaml")
	chart := filepath.Join(dir, id+"-chart")
	if s.helm {
		crd, err := os.ReadFile(peerCRD)
		must("Peer CRD", err)
		must("chart", s.chart(chart, kubeconfig, crd))
	} else {
		// Kilo's Peer CRD (meshlet's copy is the same CRD), as Kilo's
		// install applies it before the manifest.
		_, err := lane.Kubectl(ctx, "apply", "--server-side", "-f", peerCRD)
		must("Peer CRD", err)
		must("manifest", os.WriteFile(file, []byte(s.manifest(image1, kubeconfig)), 0o644))
	}
	// What the agents said, for the report and a failure's diagnosis,
	// read while they run.
	agentLogs := func() {
		out, _ := lane.Kubectl(ctx, "logs", "-n", s.namespace, "-l", "app.kubernetes.io/part-of=kilo", "--all-containers", "--prefix", "--tail=60")
		_ = os.WriteFile(filepath.Join(dir, id+"-logs"), []byte(out), 0o644)
		if t.Failed() {
			t.Logf("OUTPUT agents' logs:\n%s", out)
		}
	}
	defer func() {
		if t.Failed() {
			agentLogs()
		}
	}()
	if s.addon {
		addon := dropinGrants(t, s.namespace, dir)
		_, err := lane.Kubectl(ctx, "apply", "--server-side", "-k", addon)
		must("add-on grants", err)
		defer func() { _, _ = lane.Kubectl(ctx, "delete", "-k", addon, "--ignore-not-found") }()
	}
	repo, tag1, _ := strings.Cut(image1, ":")
	_, tag2, _ := strings.Cut(image2, ":")
	start := time.Now()
	if s.helm {
		_, err := lane.Helm(ctx, "install", "kilo", chart, "--namespace", s.namespace,
			"--set", "kilo.image.repository="+repo, "--set", "kilo.image.tag="+tag1)
		must("helm install", err)
	} else {
		_, err := lane.Kubectl(ctx, "apply", "-f", file)
		must("kubectl apply", err)
	}
	pods, err := kiloPods(ctx, cs, s.namespace, image1, len(nodes))
	must("pods Ready", err)
	for _, p := range pods {
		t.Logf("RESULT kg-shape %s: pod on %s Ready %.1fs after kubectl apply (restarts %d)", s.name, p.Spec.NodeName,
			readySince(p).Sub(start).Seconds(), restarts(p))
	}
	must("annotations", poll(ctx, 2*time.Minute, "kg's annotations", func() (bool, error) {
		for _, n := range nodes {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, k := range kgAnnotations {
				if node.Annotations[k] == "" {
					return false, fmt.Errorf("%s: %s missing", n.Name, k)
				}
			}
			if node.Annotations["kilo.squat.ai/last-seen"] == "" || node.Annotations["meshlet.io/version"] == "" {
				return false, fmt.Errorf("%s not published by meshlet", n.Name)
			}
		}
		return true, nil
	}))
	if s.cni {
		// The conflist install-cni wrote, with the pod CIDR kg fills in.
		for _, n := range nodes {
			must("CNI conflist", poll(ctx, time.Minute, n.Name+" conflist with its pod CIDR", func() (bool, error) {
				b, err := os.ReadFile(filepath.Join(n.Dir, "cni", "10-kilo.conflist"))
				return err == nil && strings.Contains(string(b), n.PodCIDR), err
			}))
			if _, err := os.Stat(filepath.Join(n.Dir, "cni", "10-bridge.conflist")); err == nil {
				t.Fatalf("%s: install-cni left the lane's conflist", n.Name)
			}
		}
	}
	pinger, err := startPingPod(ctx, cs, id+"-pinger", nodes[0].Name)
	must("ping pod", err)
	target, err := startPingPod(ctx, cs, id+"-target", nodes[1].Name)
	must("ping pod", err)
	defer func() {
		for _, p := range []string{pinger.Name, target.Name} {
			_ = cs.CoreV1().Pods("default").Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	}()
	if s.cni {
		// Addresses from Kilo's conflist: host-local's record under its
		// network name, on kube-bridge.
		for _, p := range []*corev1.Pod{pinger, target} {
			n := nodes[0]
			if p == target {
				n = nodes[1]
			}
			if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !netip.MustParsePrefix(n.PodCIDR).Contains(ip) {
				t.Fatalf("pod %s: address %s not in %s", p.Name, p.Status.PodIP, n.PodCIDR)
			}
			if _, err := os.Stat(filepath.Join(n.Dir, "priv", "var-lib", "cni", "networks", "kilo", p.Status.PodIP)); err != nil {
				t.Fatalf("pod %s's address %s not given by Kilo's conflist: %v", p.Name, p.Status.PodIP, err)
			}
		}
		must("kube-bridge", run("ip", "-n", nodes[0].NS, "link", "show", "kube-bridge"))
	}
	must("ping across nodes", poll(ctx, time.Minute, "ping "+target.Status.PodIP, func() (bool, error) {
		r, err := ping(ctx, lane, pinger.Name, target.Status.PodIP, 3, "0.2")
		return err == nil && r.received > 0, err
	}))
	t.Logf("RESULT kg-shape %s: ping %s(%s) -> %s(%s) answered", s.name, pinger.Spec.NodeName, pinger.Status.PodIP,
		target.Spec.NodeName, target.Status.PodIP)
	checkGrantsMode(ctx, t, lane, cs, s, meshletBin)
	must("ping across nodes again", poll(ctx, time.Minute, "ping "+target.Status.PodIP, func() (bool, error) {
		r, err := ping(ctx, lane, pinger.Name, target.Status.PodIP, 3, "0.2")
		return err == nil && r.received > 0, err
	}))

	// The rolling update to another tag of meshlet's image, pinging 10/s.
	keys := map[string]string{}
	for _, n := range nodes {
		keys[n.Name] = nodeKey(n)
		if keys[n.Name] == "" {
			t.Fatalf("%s: no key in /var/lib/kilo/key", n.Name)
		}
	}
	before, err := readNodeStates(ctx, cs, nodes)
	must("node states", err)
	pingDone := pingAsync(ctx, lane, pinger.Name, target.Status.PodIP, 300, "0.1")
	rollStart := time.Now()
	if s.helm {
		_, err = lane.Helm(ctx, "upgrade", "kilo", chart, "--namespace", s.namespace, "--reuse-values", "--set", "kilo.image.tag="+tag2)
		must("helm upgrade", err)
	} else {
		// Every DaemonSet of the shape: `set image ds/kilo` alone leaves
		// kilo-userspace's nodes on the old image.
		var ds []string
		for _, d := range s.daemonSets() {
			ds = append(ds, "ds/"+cmp.Or(d.dsName, "kilo"))
		}
		_, err = lane.Kubectl(ctx, append(append([]string{"set", "image", "-n", s.namespace}, ds...), "kilo="+image2)...)
		must("kubectl set image", err)
	}
	_, err = kiloPods(ctx, cs, s.namespace, image2, len(nodes))
	rolled := time.Since(rollStart)
	res := <-pingDone
	must("rolled pods Ready", err)
	must("ping during the roll", res.err)
	t.Logf("RESULT kg-shape %s: rolling update e2e1 -> e2e2: rollout %.1fs; %d/%d pings lost (10/s) over %d gaps %v, longest %s",
		s.name, rolled.Seconds(), res.sent-res.received, res.sent, len(res.gaps()), res.gaps(), res.longestGap())
	for _, n := range nodes {
		if k := nodeKey(n); k != keys[n.Name] {
			t.Errorf("%s: /var/lib/kilo/key changed over the rolling update", n.Name)
		}
	}
	must("annotations across the roll", checkAcrossVersions(ctx, cs, nodes, before, rollStart))
	must("ping after the roll", poll(ctx, time.Minute, "ping after the roll", func() (bool, error) {
		r, err := ping(ctx, lane, pinger.Name, target.Status.PodIP, 3, "0.2")
		return err == nil && r.received > 0, err
	}))

	agentLogs()
	// The uninstall: kubectl delete -f of the manifest (its ServiceAccount
	// and RBAC go first, then the DaemonSet), and what each node keeps.
	for _, n := range nodes {
		t.Logf("RESULT kg-shape %s: %s before the uninstall: %v", s.name, n.Name, hostState(ctx, lane, n))
	}
	if s.helm {
		_, err = lane.Helm(ctx, "uninstall", "kilo", "--namespace", s.namespace, "--wait")
		must("helm uninstall", err)
	} else {
		_, err = lane.Kubectl(ctx, "delete", "-f", file, "--wait")
		must("kubectl delete", err)
	}
	must("pods gone", poll(ctx, 2*time.Minute, "kilo pods gone", func() (bool, error) {
		l, err := cs.CoreV1().Pods(s.namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=kilo"})
		return err == nil && len(l.Items) == 0, err
	}))
	for _, n := range nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		must("node", err)
		var ann []string
		for k := range node.Annotations {
			if strings.HasPrefix(k, "kilo.squat.ai/") && k != "kilo.squat.ai/location" && k != "kilo.squat.ai/force-endpoint" || strings.HasPrefix(k, "meshlet.io/") {
				ann = append(ann, k)
			}
		}
		left := hostState(ctx, lane, n)
		t.Logf("RESULT kg-shape %s: %s after the uninstall: host %v; annotations %v; key file kept %v", s.name, n.Name, left, ann, nodeKey(n) == keys[n.Name])
		if len(left) > 0 {
			t.Errorf("%s: the uninstall left %v on the host", n.Name, left)
		}
	}
	// The next shape starts from nodes without this one's annotations
	// (an uninstall that cannot remove them leaves them for a user).
	for _, n := range nodes {
		var rm []string
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		must("node", err)
		for k := range node.Annotations {
			if strings.HasPrefix(k, "meshlet.io/") || strings.HasPrefix(k, "kilo.squat.ai/") && k != "kilo.squat.ai/location" && k != "kilo.squat.ai/force-endpoint" {
				rm = append(rm, k+"-")
			}
		}
		if len(rm) > 0 {
			_, err := lane.Kubectl(ctx, append([]string{"annotate", "node", n.Name}, rm...)...)
			must("annotations removed", err)
		}
	}
}
