package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/e2e/harness"
)

// cpuTime is the CPU time a process used so far, all threads, with
// nanosecond resolution (schedstat; /proc/PID/stat's ticks are 10 ms,
// too coarse for an idle agent).
func cpuTime(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		total += time.Duration(ns)
	}
	return total, nil
}

// rssMiB is a process's resident set (VmRSS), the whole process.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// pidsMatching lists the processes whose command line contains every one
// of parts.
func pidsMatching(parts ...string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(cmd, p)
		}
		if ok {
			out = append(out, pid)
		}
	}
	return out
}

// devicePID is the node's userspace WireGuard device process (meshlet
// wireguard-userspace, detached), from the pid file it leaves.
func devicePID(n *harness.Node) int {
	b, err := os.ReadFile(filepath.Join(n.WGDir, harness.Iface+".meshlet.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// serverPIDs are a cluster's kube-apiserver and etcd.
func serverPIDs(c *harness.Cluster) (apiserver, etcd []int) {
	d := c.Server.Dir()
	return pidsMatching("kube-apiserver", "--cert-dir="+d), pidsMatching("etcd", "--data-dir="+d)
}

// sample is a process's counters at one moment.
type sample struct {
	at  time.Time
	cpu time.Duration
}

func take(pid int) sample {
	c, _ := cpuTime(pid)
	return sample{at: time.Now(), cpu: c}
}

// share is the CPU used between two samples as a percentage of one core.
func share(a, b sample) float64 {
	return 100 * float64(b.cpu-a.cpu) / float64(b.at.Sub(a.at))
}

// watches counts an API server's open watches by resource
// (apiserver_longrunning_requests{verb="WATCH"}), and the watch requests
// made so far ("requests:RESOURCE", apiserver_request_total).
func watches(ctx context.Context, admin kubernetes.Interface) (map[string]int, error) {
	raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scraping the API server: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's metrics: %w", err)
	}
	out := map[string]int{}
	f := fams["apiserver_longrunning_requests"]
	if f == nil {
		return nil, fmt.Errorf("the API server exports no apiserver_longrunning_requests")
	}
	for _, m := range f.Metric {
		if label(m, "verb") == "WATCH" {
			out[label(m, "resource")] += int(m.GetGauge().GetValue())
		}
	}
	// Watch requests ever made, to see watches re-established.
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		if label(m, "verb") == "WATCH" {
			out["requests:"+label(m, "resource")] += int(m.GetCounter().GetValue())
		}
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// goStats are the Go runtime's counters of meshlet (its /metrics).
type goStats struct {
	gcCycles   float64
	allocBytes float64
	mallocs    float64
	heapInuse  float64
	reconciles float64
}

func readGoStats(m harness.Metrics) goStats {
	var s goStats
	for _, x := range m.Series("go_gc_duration_seconds") {
		s.gcCycles += float64(x.GetSummary().GetSampleCount())
	}
	s.allocBytes, _ = m.Value("go_memstats_alloc_bytes_total")
	s.mallocs, _ = m.Value("go_memstats_mallocs_total")
	s.heapInuse, _ = m.Value("go_memstats_heap_inuse_bytes")
	s.reconciles, _ = m.Value("meshlet_reconciles_total")
	return s
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s)-1) + 0.5)
	return s[i]
}
