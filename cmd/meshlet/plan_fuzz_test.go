package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/config"
)

// planFuzzFlags are the topology flags FuzzPlanInput plans with: the
// defaults and the modes the golden and kilo-compat cases use.
var planFuzzFlags = [][]string{
	nil,
	{"--mesh-granularity=full"},
	{"--mesh-granularity=cross", "--encapsulate=always"},
	{"--local=false", "--compatibility=cilium", "--encapsulate=crosssubnet", "--subnet=100.66.0.0/16", "--tunnel-device=cilium_tunl"},
	{"--cluster-name", "cluster-b", "--encapsulate=never"},
	{"--dual-stack-subnet=fd4b::/64"},
	{"--subnet=fd4b::/64", "--local=false", "--compatibility=cilium", "--encapsulate=crosssubnet"},
}

// FuzzPlanInput feeds `meshlet plan` its input files (what kubectl prints
// for nodes, peers and clustermeshes: a v1 List, single objects, YAML
// documents) for the local and one remote cluster, and plans for one of
// the local nodes with one of planFuzzFlags. Reading never panics; on
// whatever reads, planning never panics either, gives the same plan twice,
// plans for the node asked, and prints in every output format.
//
//	go test -run='^$' -fuzz='^FuzzPlanInput$' -parallel=1 ./cmd/meshlet/
func FuzzPlanInput(f *testing.F) {
	a, errA := os.ReadFile("testdata/cluster-a.yaml")
	b, errB := os.ReadFile("testdata/cluster-b.yaml")
	if errA != nil || errB != nil {
		f.Fatal(errA, errB)
	}
	f.Add(a, b, uint8(0), uint8(0))
	f.Add(a, b, uint8(1), uint8(3))
	f.Add(b, a, uint8(0), uint8(4))
	for i, file := range []string{"testdata/cluster-dual.yaml", "testdata/cluster-v6.yaml"} {
		d, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(d, a, uint8(1), uint8(5+i))
	}
	// The kilo-compat cases: the objects Kilo 0.7 was run on, as JSON.
	files, _ := filepath.Glob("testdata/kilo-compat/*.json")
	for i, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var c compatCase
		if err := json.Unmarshal(raw, &c); err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(c.Input), []byte(nil), uint8(0), uint8(i%len(planFuzzFlags)))
	}
	f.Add([]byte("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n---\n---\nnull\n"), []byte("kind: List\nitems: [{kind: Secret}]"), uint8(0), uint8(0))

	f.Fuzz(func(t *testing.T, localData, remoteData []byte, node, flagSet uint8) {
		local, err := cluster.ReadObjects(bytes.NewReader(localData))
		if err != nil {
			return
		}
		remote, err := cluster.ReadObjects(bytes.NewReader(remoteData))
		if err != nil {
			return
		}
		if len(local.Nodes) == 0 {
			return
		}
		pf := &planFlags{cfg: config.Config{Local: true}, iface: "eth0"}
		fs := pflag.NewFlagSet("plan", pflag.ContinueOnError)
		pf.cfg.RegisterTopology(fs)
		fs.StringVar(&pf.tunnel, "tunnel-device", "", "")
		if err := fs.Parse(planFuzzFlags[int(flagSet)%len(planFuzzFlags)]); err != nil {
			t.Fatal(err)
		}
		if err := pf.cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		name := local.Nodes[int(node)%len(local.Nodes)].Name
		rem := map[string]cluster.Objects{"cluster-b": remote}
		if pf.cfg.ClusterName == "cluster-b" {
			rem = map[string]cluster.Objects{"cluster-a": remote}
		}
		plan, now, err := planObjects(pf, name, fs.Changed("port"), local, rem)
		if err != nil {
			if !strings.Contains(err.Error(), "is not in the local file") {
				t.Fatalf("planning %q: %v", name, err)
			}
			return
		}
		again, _, _ := planObjects(pf, name, fs.Changed("port"), local, rem)
		if !reflect.DeepEqual(plan, again) {
			t.Fatal("two plans from the same input differ")
		}
		if plan.Node != name {
			t.Fatalf("planned for %q, asked %q", plan.Node, name)
		}
		for _, p := range plan.WireGuard.Peers {
			if p.PublicKey == (topology.Key{}) {
				t.Fatalf("a WireGuard peer without a key: %+v", p)
			}
		}
		if _, err := json.Marshal(plan); err != nil {
			t.Fatalf("json: %v", err)
		}
		if _, err := yaml.Marshal(plan); err != nil {
			t.Fatalf("yaml: %v", err)
		}
		if err := printPlan(io.Discard, plan, now); err != nil {
			t.Fatalf("text: %v", err)
		}
	})
}
