package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/harness"
)

// remoteNode is one Node of a remote cluster: objects only, no process.
type remoteNode struct {
	name     string
	location int
	leader   bool // publishes the location's WireGuard IP
}

func nodeName(cluster, i int) string { return fmt.Sprintf("r%02d-%04d", cluster, i) }

// remoteEndpoint is a remote leader's endpoint: an address nothing answers
// on (198.18.0.0/15, for benchmarks), so the device never sends to it.
func remoteEndpoint(cluster, location, port int) string {
	n := cluster*1000 + location
	return fmt.Sprintf("198.%d.%d.%d:%d", 18+n/65536, n/256%256, n%256, port)
}

// kubeletNode is a Node as a kubelet registers and reports it (labels,
// capacity, conditions, node info, 30 images), with the annotations a Kilo
// agent publishes: the size a leader's watcher decodes on every change.
func kubeletNode(cluster int, n remoteNode, podNet, wgNet netip.Prefix, key string, now time.Time) *corev1.Node {
	i, _ := strconv.Atoi(n.name[len(n.name)-4:])
	pod := podNet.Addr().As4()
	pod[2], pod[3] = byte(i/4), byte(i%4*64)
	ann := map[string]string{
		topology.AnnotationKey:         key,
		topology.AnnotationEndpoint:    remoteEndpoint(cluster, n.location, 51820),
		topology.AnnotationInternalIP:  "",
		topology.AnnotationLastSeen:    strconv.FormatInt(now.Unix(), 10),
		topology.AnnotationLocation:    fmt.Sprintf("loc-%04d", n.location),
		topology.AnnotationGranularity: "location",
		// A meshlet node: its peer gets no half-dead session probe.
		topology.AnnotationVersion:                               "scale",
		"node.alpha.kubernetes.io/ttl":                           "0",
		"volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"csi.volume.kubernetes.io/nodeid":                        fmt.Sprintf(`{"csi.hetzner.cloud":"%d"}`, 40000000+i),
	}
	if n.leader {
		wg := wgNet.Addr().As4()
		wg[2], wg[3] = byte(n.location/250), byte(n.location%250+1)
		ann[topology.AnnotationWireGuardIP] = netip.PrefixFrom(netip.AddrFrom4(wg), wgNet.Bits()).String()
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Annotations: ann, Labels: map[string]string{
			"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "cx42", "topology.kubernetes.io/region": "fsn1",
			"topology.kubernetes.io/zone": "fsn1-dc14", "node.cluster.x-k8s.io/nodepool": "workers",
			"csi.hetzner.cloud/location": "fsn1",
		}},
		Spec: corev1.NodeSpec{
			PodCIDR: netip.PrefixFrom(netip.AddrFrom4(pod), 26).String(), ProviderID: fmt.Sprintf("hcloud://%d", 40000000+i),
		},
	}
	node.Spec.PodCIDRs = []string{node.Spec.PodCIDR}
	return node
}

// kubeletStatus fills what a kubelet reports.
func kubeletStatus(n *corev1.Node, addr string, now time.Time) {
	t := metav1.NewTime(now)
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16331672Ki"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("158327836Ki"),
		"hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"),
	}
	n.Status.Capacity, n.Status.Allocatable = res, res.DeepCopy()
	for _, c := range []struct {
		typ            corev1.NodeConditionType
		status, reason string
	}{
		{corev1.NodeMemoryPressure, "False", "KubeletHasSufficientMemory"},
		{corev1.NodeDiskPressure, "False", "KubeletHasNoDiskPressure"},
		{corev1.NodePIDPressure, "False", "KubeletHasSufficientPID"},
		{corev1.NodeReady, "True", "KubeletReady"},
	} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c.typ, Status: corev1.ConditionStatus(c.status),
			Reason: c.reason, Message: "kubelet is posting ready status; " + c.reason, LastHeartbeatTime: t, LastTransitionTime: t})
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}, {Type: corev1.NodeHostName, Address: n.Name}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032x", len(n.Name)*7919), SystemUUID: "9d4c1c52-8ab4-4d8a-9b55-3f1c2b7e6a10",
		BootID: "0b5e2c0e-6a2d-4d4f-8a47-1c9a5b1f2e33", KernelVersion: "6.12.40-talos", OSImage: "Talos (v1.11.1)",
		ContainerRuntimeVersion: "containerd://2.1.4", KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"}
	for j := 0; j < 30; j++ {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{SizeBytes: int64(20_000_000 + j*1_234_567), Names: []string{
			fmt.Sprintf("registry.example.com/platform/component-%02d@sha256:%064x", j, j*104729+1),
			fmt.Sprintf("registry.example.com/platform/component-%02d:v1.%d.%d", j, j%7, j%3),
		}})
	}
}

// createRemoteNodes creates a remote cluster's Nodes (create, then status,
// as a kubelet registers) with workers in parallel; it returns the names.
// Their last-seen is an hour ahead: nothing ages out of Kilo's 60 s window
// while the lane measures an idle leader (no heartbeats); the heartbeats
// then set the real time.
func createRemoteNodes(ctx context.Context, c *harness.Cluster, cluster, nodes, locations int, keys []string) ([]string, error) {
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	work := make(chan int)
	now := time.Now().Add(time.Hour)
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				n := remoteNode{name: nodeName(cluster, i), location: i % locations, leader: i < locations}
				obj := kubeletNode(cluster, n, c.PodNet, c.WGSubnet, keys[i], now)
				created, err := c.Admin.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
				if err == nil {
					kubeletStatus(created, fmt.Sprintf("10.%d.%d.%d", 200+cluster, i/250, i%250+1), time.Now())
					_, err = c.Admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
				}
				if err != nil {
					err = fmt.Errorf("cluster %s: node %s: %w", c.Name, n.name, err)
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	names := make([]string, nodes)
	for i := range nodes {
		names[i] = nodeName(cluster, i)
		work <- i
	}
	close(work)
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return nil, *p
	}
	return names, nil
}

// heartbeats refreshes every node's last-seen once per period, spread
// evenly (Kilo agents refresh it every ~30 s), as a merge patch of the
// annotation, until ctx ends. When the API servers do not keep up, beats
// are dropped rather than queued: sent and dropped say what was reached.
// The value written is an hour ahead, as at creation: a beat the driver
// could not send never lets a node age out of Kilo's 60 s window (which
// would re-plan the mesh and measure something else), and the leader's
// work for a beat is the same for any value.
type heartbeats struct {
	sent, dropped, failed atomic.Int64
}

func (h *heartbeats) drive(ctx context.Context, client kubernetes.Interface, names []string, period time.Duration, workers int) {
	jobs := make(chan string, workers)
	wg := h.workers(ctx, client, jobs, workers)
	t := time.NewTicker(period / time.Duration(len(names)))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			close(jobs)
			wg.Wait()
			return
		case <-t.C:
		}
		select {
		case jobs <- names[i%len(names)]:
		default:
			h.dropped.Add(1)
		}
	}
}

// sweep beats every node once, as fast as the API server takes it: every
// remote node heard just now, so none ages out of Kilo's window (judged by
// when the leader heard its last-seen change) for the next minute.
func (h *heartbeats) sweep(ctx context.Context, client kubernetes.Interface, names []string, workers int) {
	jobs := make(chan string)
	wg := h.workers(ctx, client, jobs, workers)
	for _, n := range names {
		jobs <- n
	}
	close(jobs)
	wg.Wait()
}

// workers start n goroutines that beat the nodes named on jobs until it
// is closed.
func (h *heartbeats) workers(ctx context.Context, client kubernetes.Interface, jobs <-chan string, n int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range jobs {
				now := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
				b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{topology.AnnotationLastSeen: now}}})
				if _, err := client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
					if ctx.Err() == nil {
						h.failed.Add(1)
					}
					continue
				}
				h.sent.Add(1)
			}
		}()
	}
	return &wg
}
