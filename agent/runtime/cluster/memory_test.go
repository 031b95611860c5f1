package cluster_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// fatNode looks like a real kubelet-managed Node: images, conditions,
// managed fields and labels that the transform must drop.
func fatNode(i int) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   fmt.Sprintf("node-%05d", i),
			Labels: map[string]string{"kubernetes.io/hostname": fmt.Sprintf("node-%05d", i), "topology.kubernetes.io/region": fmt.Sprintf("r%d", i%20), "node.kubernetes.io/instance-type": "cx41"},
			Annotations: map[string]string{
				"kilo.squat.ai/key":                                      "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEI=",
				"kilo.squat.ai/endpoint":                                 fmt.Sprintf("10.%d.%d.%d:51820", i/65536, i/256%256, i%256),
				"kilo.squat.ai/internal-ip":                              fmt.Sprintf("10.%d.%d.%d/16", i/65536, i/256%256, i%256),
				"kilo.squat.ai/last-seen":                                strconv.FormatInt(time.Now().Unix(), 10),
				"node.alpha.kubernetes.io/ttl":                           "0",
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", (100+i/256)%256, i%256), PodCIDRs: []string{fmt.Sprintf("10.%d.%d.0/24", (100+i/256)%256, i%256)}},
	}
	for j := 0; j < 20; j++ {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{fmt.Sprintf("registry.example.com/team/image-%d@sha256:%064d", j, j)}, SizeBytes: 123456789})
	}
	for _, c := range []corev1.NodeConditionType{"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: "False", Reason: "KubeletHasSufficient" + string(c), Message: "kubelet has sufficient resources available for " + string(c)})
	}
	return n
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			kb, _ := strconv.Atoi(f[1])
			return float64(kb) / 1024
		}
	}
	return 0
}

// BenchmarkRemoteWatch10kNodes: memory of a remote watcher holding 10,000
// kubelet-sized Nodes (target: under 100 MiB for the agent).
func BenchmarkRemoteWatch10kNodes(b *testing.B) { benchRemoteWatch(b, 10000, fatNode) }

// BenchmarkRemoteWatch50kNodes: the same for a hostile remote cluster of
// 50,000 Nodes (docs/security.md#hostile-input), without the kubelet's
// images and conditions (the watcher strips them); a few minutes of Node
// creation, so only with MESHLET_HOSTILE=1.
func BenchmarkRemoteWatch50kNodes(b *testing.B) {
	if os.Getenv("MESHLET_HOSTILE") == "" {
		b.Skip("MESHLET_HOSTILE=1 runs it")
	}
	benchRemoteWatch(b, 50000, func(i int) *corev1.Node {
		n := fatNode(i)
		n.Status = corev1.NodeStatus{}
		return n
	})
}

// createNodes creates Nodes mk(0..n-1) with 16 parallel clients, retrying what
// a loaded API server refuses for a moment; it fails tb if any is missing.
func createNodes(tb testing.TB, cs kubernetes.Interface, n int, mk func(int) *corev1.Node) {
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []error
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				var err error
				for try := 0; try < 5; try++ {
					if _, err = cs.CoreV1().Nodes().Create(ctx, mk(i), metav1.CreateOptions{}); err == nil || apierrors.IsAlreadyExists(err) {
						err = nil
						break
					}
					if apierrors.IsInvalid(err) {
						break // not worth a retry
					}
					time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
				}
				if err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			}
		}()
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(failed) > 0 {
		tb.Fatalf("%d of %d Nodes not created, the first: %v", len(failed), n, failed[0])
	}
	tb.Logf("created %d nodes in %v", n, time.Since(start))
}

func benchRemoteWatch(b *testing.B, n int, mk func(int) *corev1.Node) {
	srv := apiserver.Start(b, apiserver.Options{})
	ctx := context.Background()
	createNodes(b, kubernetes.NewForConfigOrDie(srv.AdminConfig()), n, mk)
	kc, err := apiserver.Kubeconfig(srv.AdminConfig(), "remote")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := heapInUse()
		rctx, cancel := context.WithCancel(ctx)
		synced := make(chan struct{}, 1)
		rs := &cluster.Remotes{Notify: func(time.Time) {}, Secrets: cluster.SecretFunc(func(string, string) ([]byte, bool) { return kc, true })}
		rs.Start(rctx)
		t0 := time.Now()
		rs.Reconcile(true, []clustermesh.Kubeconfig{{Cluster: "remote", Name: "kc", Key: "kubeconfig"}})
		go func() {
			for {
				st := rs.Status()
				if len(st) == 1 && st[0].Synced && st[0].Nodes == n {
					synced <- struct{}{}
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		select {
		case <-synced:
		case <-time.After(10 * time.Minute):
			b.Fatalf("remote watcher not synced with %d nodes: %+v", n, rs.Status())
		}
		syncTime := time.Since(t0)
		held := heapInUse() - before
		t0 = time.Now()
		rs.State()
		b.ReportMetric(time.Since(t0).Seconds()*1000, "state-ms")
		b.ReportMetric(float64(held)/(1<<20), "heap-MiB")
		b.ReportMetric(rssMiB(), "process-RSS-MiB")
		b.ReportMetric(syncTime.Seconds(), "sync-s")
		cancel()
	}
}
