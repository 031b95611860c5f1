package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's times
// (100 on every Linux this runs on).
const clockTicks = 100

// processCPU is a process's CPU time so far, its children's that it waited
// for included (the iptables runs go-iptables forks).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command may hold spaces: the fields start after its ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// CPU is the CPU time used so far by the node's agent and by every other
// process in its network namespace (the WireGuard device), children
// included.
func (n *Node) CPU(ctx context.Context) (agent, others time.Duration, err error) {
	pid := n.PID()
	if pid == 0 {
		return 0, 0, fmt.Errorf("node %s: meshlet not running", n.Name)
	}
	if agent, err = processCPU(pid); err != nil {
		return 0, 0, err
	}
	for _, p := range nsPIDs(ctx, n.NS) {
		if p == pid || p == os.Getpid() {
			continue
		}
		if d, err := processCPU(p); err == nil {
			others += d
		}
	}
	return agent, others, nil
}

// CPUProfile takes a CPU profile of the agent over d from its status socket
// (pprof's format).
func (n *Node) CPUProfile(ctx context.Context, d time.Duration) ([]byte, error) {
	return n.Profile(ctx, fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), d)
}

// Profile fetches one of Go's profiles from the agent's status socket:
// what is a path under /debug/pprof/ (e.g. "allocs"), taking about d.
func (n *Node) Profile(ctx context.Context, what string, d time.Duration) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://status/debug/pprof/"+what, nil)
	if err != nil {
		return nil, err
	}
	hc := n.statusClient()
	hc.Timeout = d + 30*time.Second
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s: profile %s: %w", n.Name, what, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("node %s: profile %s: %s: %s", n.Name, what, resp.Status, b)
	}
	return b, err
}
