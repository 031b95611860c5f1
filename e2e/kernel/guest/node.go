package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/node"
	"github.com/meshlet/meshlet/netlinkx"
	"github.com/meshlet/meshlet/wg"
)

// driver makes meshlet's desired state real on one node, once per call:
// plan mode's planDriver. The planner input is data (scenario.go); run
// computes every node's plan with planner.Compute and applies it in the
// node's namespace with meshlet's wg and netlinkx packages, in a child
// process started through `ip netns exec` (so wgctrl's generic netlink
// socket, the netlink handle and /proc/sys all belong to that namespace).
//
// Agent mode (agent.go, the default) does not apply anything itself: it
// starts `meshlet run --wireguard=kernel` per node through the same
// `ip netns exec` and waits for the kernel to converge. The checks only
// look at the kernel (devices, routes, rules, counters, wgctrl), never at
// the driver, so both modes share them.
type driver interface {
	// apply brings node n to its desired state once and reports what changed.
	apply(ctx context.Context, n nodeDef) (applyResult, error)
}

// applyInput is what run hands to `guest apply` in a node's namespace.
type applyInput struct {
	Node    string        `json:"node"`
	KeyPath string        `json:"keyPath"`
	Plan    topology.Plan `json:"plan"`
}

// applyResult is what `guest apply` reports back.
type applyResult struct {
	DeviceKind  wg.Kind         `json:"deviceKind"`
	WG          wg.Report       `json:"wg"`
	WGChanged   bool            `json:"wgChanged"`
	Host        netlinkx.Report `json:"host"`
	HostChanged bool            `json:"hostChanged"`
}

type planDriver struct {
	dir   string // per-node key and plan files
	self  string // this executable
	keys  keys
	plans map[string]topology.Plan
}

func newPlanDriver(dir string, ks keys, ps map[string]topology.Plan) (*planDriver, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	d := &planDriver{dir: dir, self: exe, keys: ks, plans: ps}
	for name, k := range ks {
		nd := filepath.Join(dir, name)
		if err := os.MkdirAll(nd, 0o700); err != nil {
			return nil, err
		}
		// The format wg.LoadOrCreateKey reads (the agent's key file).
		if err := os.WriteFile(filepath.Join(nd, "key"), []byte(k.String()+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (d *planDriver) apply(ctx context.Context, n nodeDef) (applyResult, error) {
	var res applyResult
	in := applyInput{
		Node:    n.Name,
		KeyPath: filepath.Join(d.dir, n.Name, "key"),
		Plan:    d.plans[n.Name],
	}
	b, err := json.Marshal(in)
	if err != nil {
		return res, err
	}
	file := filepath.Join(d.dir, n.Name, "plan.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return res, err
	}
	out, err := inNS(ctx, n.Name, d.self, "apply", file)
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return res, fmt.Errorf("apply %s: decode %q: %w", n.Name, out, err)
	}
	return res, nil
}

// applyCmd is `guest apply FILE`: the production code path of one reconcile
// pass (wg first, then the host network, as agent/runtime/reconcile does), in the
// current network namespace.
func applyCmd(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var in applyInput
	if err := json.Unmarshal(b, &in); err != nil {
		return fmt.Errorf("decode %s: %w", file, err)
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	key, _, err := wg.LoadOrCreateKey(in.KeyPath)
	if err != nil {
		return err
	}
	dev, err := wg.EnsureDevice(ctx, wg.DeviceConfig{Name: in.Plan.WireGuard.Interface, Mode: wg.ModeKernel, Logger: log})
	if err != nil {
		return err
	}
	defer dev.Close()
	client, err := wgctrl.New()
	if err != nil {
		return err
	}
	defer client.Close()
	m, err := wg.NewManager(wg.Config{Interface: dev.Name, PrivateKey: key, Client: client, Logger: log})
	if err != nil {
		return err
	}
	var res applyResult
	res.DeviceKind = dev.Kind
	var errs []string
	if res.WG, err = m.Apply(ctx, node.WireGuardSpec(in.Plan.WireGuard)); err != nil {
		errs = append(errs, "wg: "+err.Error())
	}
	res.WGChanged = res.WG.Changed()
	host, err := netlinkx.New(netlinkx.Options{Logger: log})
	if err != nil {
		return err
	}
	defer host.Close()
	if res.Host, err = host.Apply(ctx, node.HostSpec(in.Plan)); err != nil {
		errs = append(errs, "netlinkx: "+err.Error())
	}
	res.HostChanged = res.Host.Changed()
	if len(errs) > 0 {
		return fmt.Errorf("apply %s: %s", in.Node, strings.Join(errs, "; "))
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// wgshowCmd is `guest wgshow IFACE`: the device as wgctrl reads it.
func wgshowCmd(iface string) error {
	client, err := wgctrl.New()
	if err != nil {
		return err
	}
	defer client.Close()
	d, err := client.Device(iface)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(wg.StatsFromDevice(d))
}

// wgShow reads node n's WireGuard device from inside its namespace.
func wgShow(ctx context.Context, n nodeDef) (wg.DeviceStats, error) {
	var st wg.DeviceStats
	exe, err := os.Executable()
	if err != nil {
		return st, err
	}
	out, err := inNS(ctx, n.Name, exe, "wgshow", "kilo0")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, fmt.Errorf("wgshow %s: decode %q: %w", n.Name, out, err)
	}
	return st, nil
}
