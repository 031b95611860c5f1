package scale

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// cpusetRoot is cgroup v1's cpuset hierarchy (docs/testing.md: the
// machines here have cgroup v1).
const cpusetRoot = "/sys/fs/cgroup/cpuset"

// pinning is the lane's CPU isolation: the measured leader (its agent and
// its device process) alone on the last CPU, and everything else the lane
// runs — the API servers and etcds, the non-leader, the test process that
// drives the heartbeats — on the others. Then the leader's figures are
// its own, not what the API servers left it (docs/performance.md#scale).
type pinning struct {
	leaderCPU, restCPUs string
	dirs                []string // created cpusets, leader's first
}

// pin moves leader and rest into two new cpusets. It fails on a machine
// with one CPU or without the cpuset controller, leaving nothing behind.
func pin(leader, rest []int) (*pinning, error) {
	n := runtime.NumCPU()
	if n < 2 {
		return nil, errors.New("one CPU: nothing to isolate")
	}
	mems, err := os.ReadFile(filepath.Join(cpusetRoot, "cpuset.mems"))
	if err != nil {
		return nil, fmt.Errorf("cgroup v1 cpuset: %w", err)
	}
	p := &pinning{leaderCPU: strconv.Itoa(n - 1), restCPUs: fmt.Sprintf("0-%d", n-2)}
	if n == 2 {
		p.restCPUs = "0"
	}
	for _, set := range []struct {
		name, cpus string
		pids       []int
	}{{"meshlet-scale-leader", p.leaderCPU, leader}, {"meshlet-scale-rest", p.restCPUs, rest}} {
		dir := filepath.Join(cpusetRoot, set.name)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			p.undo()
			return nil, fmt.Errorf("cpuset %s: %w", set.name, err)
		}
		p.dirs = append(p.dirs, dir)
		// v1 takes no task before both are set.
		for file, v := range map[string]string{"cpuset.cpus": set.cpus, "cpuset.mems": strings.TrimSpace(string(mems))} {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o644); err != nil {
				p.undo()
				return nil, fmt.Errorf("cpuset %s: %s: %w", set.name, file, err)
			}
		}
		for _, pid := range set.pids {
			if pid <= 0 {
				continue // not running (0 would move the writer)
			}
			// cgroup.procs moves every thread of the process.
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
				p.undo()
				return nil, fmt.Errorf("cpuset %s: process %d: %w", set.name, pid, err)
			}
		}
	}
	return p, nil
}

// undo moves every process still in the cpusets back to the root one and
// removes them.
func (p *pinning) undo() {
	for _, dir := range p.dirs {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(cpusetRoot, "cgroup.procs"), []byte(pid), 0o644)
		}
		_ = os.Remove(dir)
	}
	p.dirs = nil
}

// String says where what runs, for the report.
func (p *pinning) String() string {
	if p == nil {
		return "not pinned (every process on every CPU)"
	}
	return fmt.Sprintf("leader and its device alone on CPU %s, the API servers, etcds, non-leader and driver on CPU %s", p.leaderCPU, p.restCPUs)
}
