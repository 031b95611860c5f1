package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
)

// meshSource is where the commands that look at a whole mesh (graph,
// diagnose) read it from: a live cluster through its API (and its remote
// clusters through the ClusterMesh Secrets, the agents' read-only
// credentials), or kubectl dumps.
type meshSource struct {
	kubeconfig, namespace string
	// policy is what remote kubeconfigs may carry: as the agents'.
	policy  cluster.KubeconfigPolicy
	local   localOrFile
	remotes remoteFiles
}

// register adds the source's flags; --local=true|false sets *routes (kg's
// --local, as for the agent).
func (s *meshSource) register(fs *pflag.FlagSet, routes *bool) {
	s.remotes = remoteFiles{}
	s.local.routes = routes
	fs.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to look at (default: $KUBECONFIG, else in-cluster)")
	fs.StringVar(&s.namespace, "namespace", "kilo-system", "namespace of ClusterMesh objects and their Secrets")
	fs.Var(&s.local, "local", "read the local cluster from this kubectl dump instead of its API (--local=true|false is kg's flag)")
	fs.Var(s.remotes, "remote", "with --local: a remote cluster's dump, CLUSTER=FILE (repeatable)")
	fs.BoolVar(&s.policy.AllowExec, "insecure-kubeconfig-exec", false, "let the ClusterMesh Secrets' kubeconfigs run exec credential plugins on this machine (as the agents' flag; default: refused, as are auth providers and file paths)")
}

// read returns the local cluster's objects and the remote clusters' (by
// name), and for live reads each cluster's API clock and the errors of the
// remote clusters that could not be read.
func (s *meshSource) read(ctx context.Context, clusterName string) (local cluster.Cluster, remotes map[string]cluster.Cluster, remoteErrs map[string]error, err error) {
	remotes, remoteErrs = map[string]cluster.Cluster{}, map[string]error{}
	if s.local.file != "" {
		if local.Objects, err = readObjectsFile(s.local.file); err != nil {
			return local, nil, nil, err
		}
		for name, file := range s.remotes {
			o, err := readObjectsFile(file)
			if err != nil {
				return local, nil, nil, err
			}
			remotes[name] = cluster.Cluster{Objects: o}
		}
		return local, remotes, remoteErrs, nil
	}
	rc, err := restConfig(s.kubeconfig)
	if err != nil {
		return local, nil, nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "meshlet/" + version
	if local, err = cluster.ReadCluster(ctx, clock.RealClock{}, rc, s.namespace, true); err != nil {
		return local, nil, nil, err
	}
	for _, kc := range clustermesh.Resolve(local.Meshes, clusterName).Kubeconfigs {
		if _, done := remotes[kc.Cluster]; done {
			continue
		}
		data, ok := local.Secrets[kc.Name][kc.Key]
		if !ok {
			remoteErrs[kc.Cluster] = fmt.Errorf("the Secret %s/%s has no key %q", kc.Namespace, kc.Name, kc.Key)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		r, err := cluster.ReadRemote(rctx, clock.RealClock{}, data, s.policy)
		cancel()
		if err != nil {
			remoteErrs[kc.Cluster] = err
			continue
		}
		remotes[kc.Cluster] = r
	}
	return local, remotes, remoteErrs, nil
}

// snapshot turns what was read into the planner's input, at the local API
// server's time (or the dump's newest last-seen).
func snapshot(local cluster.Cluster, remotes map[string]cluster.Cluster, settings topology.Settings) topology.Snapshot {
	objs := map[string]cluster.Objects{}
	for name, r := range remotes {
		objs[name] = r.Objects
	}
	snap := cluster.Snapshot(local.Objects, objs, settings.ClusterName)
	snap.Settings = settings
	snap.Now = local.ServerTime
	if snap.Now.IsZero() {
		snap.Now, _ = planTime("", snap.Nodes)
	}
	for i := range snap.Remotes {
		snap.Remotes[i].HeardOnce(snap.Now)
	}
	return snap
}

// planAs plans for node name as its agent would, from what the node
// published (selfFromFile); the private interface is named eth0.
func planAs(snap topology.Snapshot, name string) (topology.Plan, error) {
	set := snap.Settings
	self, _, err := selfFromFile(name, snap.Nodes, &set, false, "eth0", "", "")
	if err != nil {
		return topology.Plan{}, err
	}
	s := snap
	s.Settings = set
	return planner.Compute(s, self), nil
}

// aLeader plans for a node and returns the plan of the first segment
// leader (the view that includes the remote clusters).
func aLeader(snap topology.Snapshot) (topology.Plan, error) {
	if len(snap.Nodes) == 0 {
		return topology.Plan{}, fmt.Errorf("the cluster has no nodes")
	}
	names := make([]string, len(snap.Nodes))
	for i, n := range snap.Nodes {
		names[i] = n.Name
	}
	sort.Strings(names)
	pl, err := planAs(snap, names[0])
	if err != nil || len(pl.Segments) == 0 {
		return pl, err
	}
	return planAs(snap, pl.Segments[0].Leader)
}
