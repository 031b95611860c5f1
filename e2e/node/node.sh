#!/usr/bin/env bash
# Starts one node of make e2e-node: containerd and kubelet in the node's
# network namespace and in a mount namespace of their own. Run by the test
# (lane.go) as
#   setsid unshare --mount --propagation slave -- nsenter --net=/run/netns/NS -- node.sh DIR NAME
# DIR holds containerd.toml, kubelet.yaml, kubeconfig; this writes
# DIR/{containerd,kubelet}.pid and logs.
#
# Why each step (e2e/node/README.md has the whole recipe):
# - a fresh sysfs: /sys/class/net must be the node's links (kubelet, meshlet);
#   the host's cgroup tree is saved first and put back on it. `ip netns exec`
#   is not used: it remounts /sys without the cgroup mounts, and every call
#   would get a mount namespace of its own (kubelet's volume mounts would be
#   invisible to containerd).
# - private /var/lib, /var/log and /run: hostPath volumes (/var/lib/meshlet,
#   /run/xtables.lock) and kubelet's state land in DIR, not on the host.
# - overlays on the host's /etc, /opt and /usr/lib (/lib is usr/lib): hostPath
#   volumes under them (Kilo's /etc/cni/net.d, /opt/cni/bin, /lib/modules;
#   containerd creates a missing hostPath) are written in DIR, never on the
#   host. The node's /etc/cni/net.d is DIR/cni (containerd's conf_dir), its
#   /opt/cni/bin is /usr/lib/cni (containerd's bin_dir), so what Kilo's
#   install-cni writes there is what containerd runs.
# - cgroup v1 (this machine): each hierarchy gets a /NAME parent (kubelet's
#   cgroupRoot); cpuset needs its cpus and mems copied down.
set -euo pipefail
dir=$1
name=$2
mkdir -p "$dir/cgsave" "$dir/priv/var-lib" "$dir/priv/var-log" "$dir/priv/run"
mount --rbind /sys/fs/cgroup "$dir/cgsave"
mount -t sysfs sysfs /sys
mount --rbind "$dir/cgsave" /sys/fs/cgroup
for d in etc opt usr/lib; do
	o="$dir/priv/overlay/${d//\//-}"
	mkdir -p "$o/upper" "$o/work"
	mount -t overlay overlay -o "lowerdir=/$d,upperdir=$o/upper,workdir=$o/work" "/$d"
done
mkdir -p /etc/cni/net.d /opt/cni/bin "$dir/cni"
mount --bind "$dir/cni" /etc/cni/net.d
mount --bind /usr/lib/cni /opt/cni/bin
mount --bind "$dir/priv/var-lib" /var/lib
mount --bind "$dir/priv/var-log" /var/log
mount --bind "$dir/priv/run" /run
for h in /sys/fs/cgroup/*/; do
	h=${h%/}
	case $(basename "$h") in unified) continue ;; esac
	mkdir -p "$h/$name"
done
cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$name/cpuset.cpus"
cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$name/cpuset.mems"
ip link set lo up

containerd --config "$dir/containerd.toml" >"$dir/containerd.log" 2>&1 &
echo $! >"$dir/containerd.pid"
for _ in $(seq 1 200); do
	[ -S "$dir/containerd.sock" ] && break
	kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null || { echo "containerd exited" >&2; tail -20 "$dir/containerd.log" >&2; exit 1; }
	sleep 0.05 # polling for the socket, bounded by the loop
done
[ -S "$dir/containerd.sock" ] || { echo "containerd: no socket after 10 s" >&2; exit 1; }

kubelet --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubeconfig" --root-dir /var/lib/kubelet \
	--hostname-override "$name" --node-ip "$(cat "$dir/node-ip")" \
	--node-labels "$(cat "$dir/node-labels")" >"$dir/kubelet.log" 2>&1 &
echo $! >"$dir/kubelet.pid"
