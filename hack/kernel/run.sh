#!/usr/bin/env bash
# Kernel lane (`make e2e-kernel`): boot Debian's cloud kernel under QEMU (TCG)
# with an initramfs holding busybox, Debian's ip, the needed kernel modules,
# meshlet and the scenario runner e2e/kernel/guest, and require a PASS line
# for every scenario step. In agent mode (the default) the guest runs the
# real `meshlet run --wireguard=kernel` per node against a kube-apiserver
# that e2e/kernel/host runs on this host (reached over QEMU user
# networking). See e2e/kernel/README.md.
#
# Idempotent. Cached under ${XDG_CACHE_HOME:-$HOME/.cache}/meshlet/kernel-<version>/:
# the kernel image and the module tree (from `apt-get download`). Rebuilt on
# every run (seconds): the guest binary and the initramfs.
#
# Environment:
#   MESHLET_KERNEL_MODE     agent (default): the real agent against an API
#                           server on the host; plan: the planner in-process
#                           and meshlet's wg/netlinkx packages, no API server
#   MESHLET_BIN             static meshlet binary to put into the guest as
#                           /bin/meshlet (`make e2e-kernel` sets it; agent
#                           mode builds one when it is unset)
#   MESHLET_K8S_BIN         etcd/kube-apiserver directory (agent mode; else
#                           hack/k8s/ensure.sh builds or finds them)
#   MESHLET_KERNEL_TIMEOUT  hard limit for the VM in seconds (default 420)
#   MESHLET_KERNEL_LOG      serial console log (default $cache/last-run.log)
#   MESHLET_KERNEL_SMP      guest CPUs (default 2)
set -euo pipefail

t0=$(date +%s.%N)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/meshlet
timeout_s=${MESHLET_KERNEL_TIMEOUT:-420}
smp=${MESHLET_KERNEL_SMP:-2}
mode=${MESHLET_KERNEL_MODE:-agent}
[[ $mode == agent || $mode == plan ]] || { echo "kernel-lane: MESHLET_KERNEL_MODE=$mode: want agent or plan" >&2; exit 2; }
# Modules the scenario needs (their dependencies come from modprobe).
# xfrm_user and nfnetlink: netlink.NewHandle() (vishvananda/netlink, used by
# wg and netlinkx) opens NETLINK_XFRM and NETLINK_NETFILTER sockets too and
# fails with "protocol not supported" when the kernel cannot load them.
# virtio_pci and virtio_net: the NIC of QEMU user networking (agent mode).
modules=(wireguard ipip veth bridge xfrm_user nfnetlink virtio_pci virtio_net)

log() { echo "kernel-lane: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# --- host packages ---------------------------------------------------------
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
# busybox-static: the guest needs a static busybox (Debian's busybox is
# dynamic); it installs /bin/busybox.
dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
command -v depmod >/dev/null || need_pkgs+=(kmod)
[[ -x /usr/bin/ip ]] || need_pkgs+=(iproute2)
command -v cpio >/dev/null || need_pkgs+=(cpio)
if ((${#need_pkgs[@]})); then
	log "installing ${need_pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null ||
		{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null; } ||
		die "apt-get install ${need_pkgs[*]} failed"
fi

# --- kernel and modules (cached) ------------------------------------------
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
if [[ -z $pkg ]]; then
	apt-get update -q >/dev/null || die "apt-get update failed"
	pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')
fi
[[ -n $pkg ]] || die "apt-cache depends linux-image-cloud-amd64 names no kernel"
kver=${pkg#linux-image-}
kdir=$cache_root/kernel-$kver
# The cache is complete when .complete names the same module list.
if [[ "$(cat "$kdir/.complete" 2>/dev/null)" != "${modules[*]}" ]]; then
	log "fetching $pkg into $kdir"
	mkdir -p "$cache_root"
	tmp=$(mktemp -d "$cache_root/.kernel-$kver.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	# (apt warns that its _apt user cannot write here and downloads as root.)
	(cd "$tmp" && apt-get download -q "$pkg" >"$tmp/download.log" 2>&1) ||
		{ cat "$tmp/download.log" >&2; die "apt-get download $pkg failed"; }
	dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/root"
	depmod -b "$tmp/root" "$kver"
	mkdir -p "$tmp/out/lib/modules/$kver"
	cp "$tmp/root/boot/vmlinuz-$kver" "$tmp/out/vmlinuz"
	# Only the modules the scenario needs, with their dependencies.
	for m in "${modules[@]}"; do
		modprobe -d "$tmp/root" -S "$kver" --show-depends "$m" || die "module $m not in $pkg"
	done | awk '$1 == "insmod" { print $2 }' | sort -u >"$tmp/ko.list"
	while read -r ko; do
		rel=${ko#"$tmp/root/"}
		mkdir -p "$tmp/out/$(dirname "$rel")"
		cp "$ko" "$tmp/out/$rel"
	done <"$tmp/ko.list"
	for f in modules.order modules.builtin modules.builtin.modinfo; do
		[[ -f $tmp/root/lib/modules/$kver/$f ]] && cp "$tmp/root/lib/modules/$kver/$f" "$tmp/out/lib/modules/$kver/"
	done
	depmod -b "$tmp/out" "$kver"
	rm -rf "$kdir"
	mv "$tmp/out" "$kdir"
	echo "${modules[*]}" >"$kdir/.complete"
	rm -rf "$tmp"
	trap - EXIT
fi
log "kernel $kver, modules: $(cd "$kdir" && find lib -name '*.ko*' | wc -l) files"

# --- guest binary and initramfs (every run) --------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/meshlet-kernel.XXXXXX")
qemu_pid=
host_pid=
stop_host() {
	if [[ -n $host_pid ]] && kill -0 "$host_pid" 2>/dev/null; then
		kill "$host_pid" 2>/dev/null || true
		# It stops etcd and kube-apiserver before it exits.
		wait "$host_pid" 2>/dev/null || true
	fi
	host_pid=
}
cleanup() {
	if [[ -n $qemu_pid ]] && kill -0 "$qemu_pid" 2>/dev/null; then
		kill "$qemu_pid" 2>/dev/null || true
	fi
	stop_host
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

guest_bin=$work/kernel-guest
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$guest_bin" ./e2e/kernel/guest) ||
	die "building e2e/kernel/guest failed"
mapfile -t steps < <("$guest_bin" steps "$mode")

# --- agent mode: the API server on this host --------------------------------
host_dir=$work/host
if [[ $mode == agent ]]; then
	if [[ -z ${MESHLET_BIN:-} ]]; then
		MESHLET_BIN=$work/meshlet
		(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w -X main.version=kernel-lane' -o "$MESHLET_BIN" ./cmd/meshlet) ||
			die "building cmd/meshlet failed"
	fi
	(cd "$repo" && go build -o "$work/kernel-host" ./e2e/kernel/host) || die "building e2e/kernel/host failed"
	mapfile -t host_steps < <("$work/kernel-host" steps)
	steps+=("${host_steps[@]}")
	mkdir -p "$host_dir"
	# Runs while the initramfs is packed; run.sh waits for its "ready" file
	# before packing what it wrote. Killed by stop_host (also on EXIT).
	MESHLET_REPO=$repo "$work/kernel-host" serve "$host_dir" >"$work/host.log" 2>&1 &
	host_pid=$!
fi

rootfs=$work/rootfs
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,var/lib}
cp /bin/busybox "$rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do
	[[ $applet == busybox ]] || ln -sf busybox "$rootfs/bin/$applet"
done
# The kernel runs /sbin/modprobe to load modules on demand.
ln -sf ../bin/busybox "$rootfs/sbin/modprobe"
# Debian's ip (netns, JSON) with its libraries.
cp /usr/bin/ip "$rootfs/usr/bin/ip"
for lib in $(ldd /usr/bin/ip | awk '/=>/ { print $3 } /^\t\// { print $1 }'); do
	mkdir -p "$rootfs$(dirname "$lib")"
	cp -L "$lib" "$rootfs$lib"
done
cp -a "$kdir/lib" "$rootfs/"
depmod -b "$rootfs" "$kver"
printf '%s\n' "${modules[@]}" >"$rootfs/etc/modules-needed"
cp "$guest_bin" "$rootfs/bin/kernel-guest"
if [[ -n ${MESHLET_BIN:-} ]]; then
	[[ -x $MESHLET_BIN ]] || die "MESHLET_BIN=$MESHLET_BIN is not executable"
	cp "$MESHLET_BIN" "$rootfs/bin/meshlet"
fi
install -m 0755 "$repo/hack/kernel/init" "$rootfs/init"
mkdir -p "$rootfs/etc/meshlet"
echo "$mode" >"$rootfs/etc/meshlet/mode"
if [[ $mode == agent ]]; then
	# The API server is up (a cold etcd + kube-apiserver start takes a few
	# seconds) when the host program has written its "ready" file.
	deadline=$(($(date +%s) + 120))
	until [[ -f $host_dir/ready ]]; do
		kill -0 "$host_pid" 2>/dev/null || { cat "$work/host.log" >&2; die "e2e/kernel/host exited"; }
		(($(date +%s) < deadline)) || { cat "$work/host.log" >&2; die "API server not ready within 120 s"; }
		sleep 0.2
	done
	log "API server $(cat "$host_dir/ready") ready after $(elapsed "$t0")s"
	cp "$host_dir/meshlet.kubeconfig" "$host_dir/api-port" "$rootfs/etc/meshlet/"
	cp -r "$host_dir/keys" "$rootfs/etc/meshlet/keys"
fi
# Uncompressed: the emulated CPU would spend seconds inflating it.
(cd "$rootfs" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/initrd.cpio"
log "initramfs $(du -m "$work/initrd.cpio" | cut -f1) MiB, built in $(elapsed "$t0")s"

# --- boot ------------------------------------------------------------------
run_log=${MESHLET_KERNEL_LOG:-$cache_root/last-run.log}
mkdir -p "$(dirname "$run_log")"
t_boot=$(date +%s.%N)
# QEMU runs as a child of this script under `timeout` (the hard limit); the
# EXIT trap kills it if this script is interrupted. Result lines are streamed
# to stderr while it runs.
raw=$work/serial.raw
net_args=()
if [[ $mode == agent ]]; then
	# User networking: the guest's eth0 (10.0.2.15) reaches this host's
	# 127.0.0.1:PORT at 10.0.2.2:PORT. romfile= needs no PXE ROM package.
	net_args=(-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=)
fi
timeout -k 5 "$timeout_s" qemu-system-x86_64 -accel tcg -smp "$smp" -m 1024 -nographic -no-reboot \
	-kernel "$kdir/vmlinuz" -initrd "$work/initrd.cpio" "${net_args[@]}" \
	-append "console=ttyS0 panic=-1 quiet" </dev/null >"$raw" 2>&1 &
qemu_pid=$!
tail --pid="$qemu_pid" -n +1 -f "$raw" | tr -d '\r' | grep --line-buffered -oE '(PASS|FAIL|GUEST|SUMMARY) .*' >&2 || true
wait "$qemu_pid" || true
qemu_pid=
tr -d '\r' <"$raw" >"$run_log"
vm_wall=$(elapsed "$t_boot")

# --- agent mode: what the agents published, read on the host ----------------
if [[ $mode == agent ]]; then
	{
		echo "HOST checks (e2e/kernel/host check)"
		"$work/kernel-host" check "$host_dir" || true
	} >"$work/host-check.log" 2>&1
	grep -E '^(PASS|FAIL|INFO) ' "$work/host-check.log" >&2 || true
	cat "$work/host-check.log" >>"$run_log"
	stop_host
fi

# --- verdict ---------------------------------------------------------------
pass=0
missing=()
for s in "${steps[@]}"; do
	if grep -qE "^PASS $s( |$)" "$run_log"; then
		pass=$((pass + 1))
	else
		missing+=("$s")
	fi
done
boot=$(sed -n 's/.*GUEST init .*uptime=\([0-9.]*\).*/\1/p' "$run_log" | head -n 1)
done_up=$(sed -n 's/^GUEST done .*uptime=\([0-9.]*\).*/\1/p' "$run_log" | head -n 1)
scenario=$(awk -v a="${boot:-0}" -v b="${done_up:-0}" 'BEGIN { if (b > 0) printf "%.1f", b - a; else print "?" }')

echo
echo "kernel lane summary"
echo "  kernel:       $kver (Debian cloud, QEMU TCG, $smp vCPU)"
echo "  mode:         $mode$([[ $mode == agent ]] && echo " (meshlet run --wireguard=kernel per node, API server on the host)")"
echo "  boot:         ${boot:-?}s to /init (guest clock)"
echo "  scenario:     ${scenario}s (guest clock)"
echo "  VM wall:      ${vm_wall}s; total ${0##*/}: $(elapsed "$t0")s"
echo "  steps:        ${#steps[@]}, PASS $pass, FAIL $((${#steps[@]} - pass))"
echo "  serial log:   $run_log"
if ((${#missing[@]})); then
	echo
	echo "no PASS line for: ${missing[*]}"
	grep -E '^(FAIL|GUEST|SUMMARY|AGENTLOG) |panic|Call Trace|BUG' "$run_log" | head -n 120 || true
	if ! grep -q '^GUEST done' "$run_log"; then
		echo "--- last lines of the serial log ---"
		tail -n 30 "$run_log"
	fi
	exit 1
fi
