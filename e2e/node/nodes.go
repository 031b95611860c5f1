package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// containerd 1.6 (Debian) configuration, version 2. restrict_oom_score_adj
// is required here: the machine's capability bounding set lacks
// CAP_SYS_RESOURCE, so a negative oom_score_adj fails every sandbox.
const containerdConfig = `version = 2
root = "{{dir}}/containerd/root"
state = "{{dir}}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{{dir}}/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{registry}}/e2e/pause:1"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{{dir}}/cni"
{{cni-template}}  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{{dir}}/certs.d"
`

// The lane's registry mirrors ghcr.io, so the chart's unmodified image
// name pulls from it, with any pull policy.
const hostsTOML = `server = "https://{{upstream}}"
[host."http://{{registry}}"]
  capabilities = ["pull", "resolve"]
`

const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 here: kubelet 1.37 refuses it by default.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /{{name}}
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://{{dir}}/containerd.sock
address: {{ip}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: {{ca}}}
authorization: {mode: Webhook}
clusterDNS: [10.0.0.10]
clusterDomain: cluster.local
podLogsDir: {{dir}}/pod-logs
rotateCertificates: false
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`

// The pod network of a node: a bridge on its pod CIDR (the CNI is
// required for NodeReady; meshlet routes the CIDRs between nodes).
const cniConflist = `{
  "cniVersion": "1.0.0",
  "name": "e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "{{podcidr}}"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// The pod network of a dual-stack node: containerd writes it from the pod
// CIDRs the controller manager allocated, as kubelet reports them (the
// CRI's conf_template), one host-local range per family.
const cniTemplate = `{
  "cniVersion": "1.0.0",
  "name": "e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$r}}"}]{{end}}],
              "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

func fill(tmpl string, kv ...string) string {
	return strings.NewReplacer(kv...).Replace(tmpl)
}

// StartNode writes the node's configuration and starts containerd and
// kubelet in its namespaces (node.sh).
func (l *Lane) StartNode(ctx context.Context, n *Node, labels string) error {
	kv := []string{"{{dir}}", n.Dir, "{{name}}", n.Name, "{{ip}}", n.IP, "{{registry}}", registry,
		"{{ca}}", l.path("pki", "ca.crt"), "{{podcidr}}", n.PodCIDR, "{{cni-template}}", ""}
	files := map[string]string{
		"containerd.toml":                     fill(containerdConfig, kv...),
		"kubelet.yaml":                        fill(kubeletConfig, kv...),
		"cni/10-bridge.conflist":              fill(cniConflist, kv...),
		"certs.d/ghcr.io/hosts.toml":          fill(hostsTOML, append(kv, "{{upstream}}", "ghcr.io")...),
		"certs.d/" + registry + "/hosts.toml": fill(hostsTOML, append(kv, "{{upstream}}", registry)...),
		"node-ip":                             n.IP,
		"node-labels":                         labels,
	}
	if l.DualStack {
		delete(files, "cni/10-bridge.conflist")
		kv[len(kv)-1] = `    conf_template = "` + filepath.Join(n.Dir, "cni-template.json") + `"` + "\n"
		files["containerd.toml"] = fill(containerdConfig, kv...)
		files["cni-template.json"] = cniTemplate
		files["node-ip"] = n.IP + "," + n.IP6
	}
	for name, content := range files {
		p := filepath.Join(n.Dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := l.kubeconfig(filepath.Join(n.Dir, "kubeconfig"), "system:node:"+n.Name); err != nil {
		return err
	}
	script, err := filepath.Abs("node.sh")
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "setsid", "unshare", "--mount", "--propagation", "slave", "--",
		"nsenter", "--net=/run/netns/"+n.NS, "--", "bash", script, n.Dir, n.Name)
	cmd.Env = append(os.Environ(), "PATH="+l.Bins.Node+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("node %s: %w\n%s", n.Name, err, out)
	}
	return nil
}

// pids of the node's own processes and of everything in its cgroups.
func (n *Node) pids() []int {
	var pids []int
	for _, f := range []string{"kubelet.pid", "containerd.pid"} {
		if b, err := os.ReadFile(filepath.Join(n.Dir, f)); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				pids = append(pids, p)
			}
		}
	}
	// Containers (and their shims, started by containerd in its own
	// cgroup, found by the namespace instead) live under /<name>.
	_ = filepath.Walk("/sys/fs/cgroup/pids/"+n.Name, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Name() == "cgroup.procs" {
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
		}
		return nil
	})
	if out, err := exec.Command("ip", "netns", "pids", n.NS).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// stop kills kubelet, containerd, the shims and every container of the
// node, then removes its cgroups. Polls until the processes are gone.
func (n *Node) stop(l *Lane) {
	for round := 0; round < 50; round++ {
		pids := n.pids()
		// Shims are in containerd's session; find them by their -id args.
		if out, err := exec.Command("pgrep", "-f", "containerd-shim.*"+regexpQuote(n.Dir)).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
		}
		alive := 0
		for _, p := range pids {
			if syscall.Kill(p, syscall.SIGKILL) == nil {
				alive++
			}
		}
		if alive == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling for the processes to exit, bounded by the loop
	}
	// Deepest cgroups first.
	for _, h := range []string{"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids", "systemd"} {
		root := filepath.Join("/sys/fs/cgroup", h, n.Name)
		var dirs []string
		_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

func regexpQuote(s string) string {
	r := strings.NewReplacer(".", `\.`, "+", `\+`, "*", `\*`, "?", `\?`, "(", `\(`, ")", `\)`, "[", `\[`, "]", `\]`)
	return r.Replace(s)
}
