package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/leadership"
	"github.com/meshlet/meshlet/agent/runtime/status"
)

// newDiagnoseCmd is `meshlet diagnose`: a whole cluster's mesh checked from
// its API, its remote clusters (with the ClusterMesh Secrets' read-only
// credentials) and its agents' status, each finding with what to do.
func newDiagnoseCmd() *cobra.Command {
	var src meshSource
	var output *outputFlag
	var agents bool
	statusFiles := nodeFiles{remoteFiles{}}
	cfg := config.Config{Local: true}
	c := &cobra.Command{
		Use:   "diagnose",
		Short: "Check a cluster's mesh: leaders, kg vs meshlet nodes, remote clusters, clocks, peers, rejections",
		Long: "Check a cluster's mesh and say what to do about each problem.\n\n" +
			"It reads the cluster's Nodes, Peers and ClusterMeshes, the remote clusters through the ClusterMesh Secrets\n" +
			"(the agents' read-only credentials), and each meshlet agent's status (meshlet status run in its pod: pods/exec).\n" +
			"The topology flags are read from meshlet's DaemonSet unless given; without one, --subnet, --mesh-granularity and\n" +
			"--port from what the nodes publish (their wireguard-ip, granularity and endpoint). Exit status 1 when an error is found.",
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := output.check(); err != nil {
				return err
			}
			flagsFrom := "flags"
			// Without the DaemonSet's flags (none to read, a dump), the
			// topology flags not given come from what the nodes publish.
			var infer func(cluster.Objects)
			if !topologyFlagsSet(c.Flags()) {
				var why error = errors.New("read from a dump")
				if src.local.file == "" {
					var from string
					from, why = daemonSetFlags(c.Context(), src, &cfg)
					flagsFrom = orDefault(from, flagsFrom)
				}
				if why != nil {
					infer = func(local cluster.Objects) {
						set := publishedSettings(c.Flags(), &cfg, local.Nodes)
						flagsFrom = "what the nodes publish (" + strings.Join(set, " ") + "; no DaemonSet: " + why.Error() + ")"
						if len(set) == 0 {
							flagsFrom = "defaults (no DaemonSet: " + why.Error() + "; the nodes publish no settings)"
						}
					}
				}
			}
			in, err := diagnoseInput(c.Context(), src, &cfg, infer, agents && src.local.file == "" && len(statusFiles.remoteFiles) == 0)
			if err != nil {
				return err
			}
			if len(statusFiles.remoteFiles) > 0 {
				if in.Agents, err = readStatusFiles(statusFiles.remoteFiles); err != nil {
					return err
				}
			}
			if src.local.file == "" {
				in.PeerAdmission = askPeerAdmission(c.Context(), c.ErrOrStderr(), src)
			}
			fs := diagnose.Check(in)
			if output.value == "json" {
				enc := json.NewEncoder(c.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(fs); err != nil {
					return err
				}
			} else {
				printFindings(c.OutOrStdout(), in, flagsFrom, fs)
			}
			if n := diagnose.Errors(fs); n > 0 {
				return fmt.Errorf("%s found", plural(n, "error"))
			}
			return nil
		},
	}
	src.register(c.Flags(), &cfg.Local)
	cfg.RegisterTopology(c.Flags())
	registerLeaderElection(c.Flags(), &cfg)
	output = registerOutput(c.Flags(), "text", "json")
	c.Flags().BoolVar(&agents, "agents", true, "read each meshlet agent's status by running meshlet status in its pod (needs create on pods/exec)")
	c.Flags().Var(statusFiles, "status-file", "read a node's agent status from a file, what meshlet status -o json printed on the node (repeatable); the agents are then not asked")
	return c
}

// askPeerAdmission asks the API server to admit a valid Peer (a dry run;
// docs/runbooks.md#peeradmissionrefused); nil, with a note on w, when it
// could not be asked.
func askPeerAdmission(ctx context.Context, w io.Writer, src meshSource) *diagnose.PeerAdmission {
	rc, err := restConfig(src.kubeconfig)
	if err != nil {
		return nil // reading the cluster failed already with this error
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	a, skipped, err := cluster.PeerAdmission(ctx, rc)
	switch {
	case err != nil:
		fmt.Fprintf(w, "meshlet diagnose: Peer admission not checked: %v\n", err)
	case skipped != "":
		fmt.Fprintf(w, "meshlet diagnose: Peer admission not checked: %s\n", skipped)
	}
	return a
}

// topologyFlags are the flags that change the topology (leaders, WireGuard
// IPs, remote clusters), read from the DaemonSet when not given.
var topologyFlags = []string{"cluster-name", "interface", "port", "subnet", "mesh-granularity", "topology-label", "local", "compatibility", "encapsulate", "service-cidr", "leader-election"}

// registerLeaderElection is the agent's --leader-election, for the
// leadership check (docs/failover.md#governed).
func registerLeaderElection(fs *pflag.FlagSet, cfg *config.Config) {
	// The Lease's timing does not matter to the checks; valid values do.
	cfg.LeaseDuration, cfg.LeaseRenew = leadership.DefaultDuration, leadership.DefaultRenew
	fs.BoolVar(&cfg.LeaderElection, "leader-election", true, "whether the agents elect each location's leader with a Lease, as meshlet run's flag")
}

func topologyFlagsSet(fs *pflag.FlagSet) bool {
	for _, f := range topologyFlags {
		if fs.Changed(f) {
			return true
		}
	}
	return false
}

// daemonSetFlags parses the topology flags of meshlet's DaemonSet (its
// `run` arguments) into cfg.
func daemonSetFlags(ctx context.Context, src meshSource, cfg *config.Config) (string, error) {
	rc, err := restConfig(src.kubeconfig)
	if err != nil {
		return "", err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return "", err
	}
	list, err := client.AppsV1().DaemonSets(src.namespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return "", fmt.Errorf("reading meshlet's DaemonSet: %w", err)
	}
	if len(list.Items) == 0 {
		return "", fmt.Errorf("no DaemonSet labelled %s in %s", agentSelector, src.namespace)
	}
	ds := list.Items[0]
	args, kg := runArgs(ds)
	if args == nil {
		return "", fmt.Errorf("DaemonSet %s/%s has no container running `meshlet run` or kg's command line", ds.Namespace, ds.Name)
	}
	fs := pflag.NewFlagSet("daemonset", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	cfg.RegisterTopology(fs)
	registerLeaderElection(fs, cfg)
	// Only the topology flags: the others carry $(VAR) references.
	var keep []string
	for _, a := range args {
		for _, f := range topologyFlags {
			if a == "--"+f || strings.HasPrefix(a, "--"+f+"=") {
				keep = append(keep, a)
			}
		}
	}
	if err := fs.Parse(keep); err != nil {
		return "", fmt.Errorf("DaemonSet %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	if kg {
		return "DaemonSet " + ds.Namespace + "/" + ds.Name + " (kg's command line)", nil
	}
	return "DaemonSet " + ds.Namespace + "/" + ds.Name, nil
}

// runArgs is the agent's command line in a DaemonSet: the arguments of
// `meshlet run`, or of kg (Kilo's DaemonSet: only flags, kg's defaults).
func runArgs(ds appsv1.DaemonSet) (args []string, kg bool) {
	for _, c := range ds.Spec.Template.Spec.Containers {
		all := append(append([]string(nil), c.Command...), c.Args...)
		for i, a := range all {
			if a == "run" || a == "kg" {
				return all[i+1:], a == "kg"
			}
		}
		if len(c.Command) == 0 && kgMode(c.Args) {
			return c.Args, true
		}
	}
	return nil, false
}

// diagnoseInput reads everything the checks need.
func diagnoseInput(ctx context.Context, src meshSource, cfgp *config.Config, infer func(cluster.Objects), askAgents bool) (diagnose.Input, error) {
	local, remotes, remoteErrs, err := src.read(ctx, cfgp.ClusterName)
	if err != nil {
		return diagnose.Input{}, err
	}
	if infer != nil {
		infer(local.Objects)
	}
	if err := cfgp.Validate(); err != nil {
		return diagnose.Input{}, usage(fmt.Errorf("invalid flags: %w", err))
	}
	cfg := *cfgp
	snap := snapshot(local, remotes, cfg.Settings())
	in := diagnose.Input{Cluster: orDefault(cfg.ClusterName, "local"), Snapshot: snap, Plans: map[string]topology.Plan{}, ClockOffset: local.ClockOffset,
		LeaderElection: cfg.LeaderElection}
	r := clustermesh.Resolve(local.Meshes, cfg.ClusterName)
	seen := map[string]bool{}
	for _, kc := range r.Kubeconfigs {
		if seen[kc.Cluster] {
			continue
		}
		seen[kc.Cluster] = true
		rm := diagnose.Remote{Cluster: kc.Cluster, Mesh: kc.Mesh.String(), Secret: fmt.Sprintf("%s/%s[%s]", kc.Namespace, kc.Name, kc.Key)}
		if e, bad := remoteErrs[kc.Cluster]; bad {
			rm.Err = e.Error()
			_, rm.Refused = cluster.AsKubeconfigError(e)
		} else if rc, ok := remotes[kc.Cluster]; ok {
			rm.ServerTime, rm.ClockOffset = rc.ServerTime, rc.ClockOffset
		}
		in.Remotes = append(in.Remotes, rm)
	}
	if name := localName(r); name != "" && cfg.ClusterName == "" {
		in.Cluster = name
	}
	for _, n := range snap.Nodes {
		p, err := planAs(snap, n.Name)
		if err != nil {
			return in, err
		}
		in.Plans[n.Name] = p
	}
	if askAgents {
		in.Agents, err = readAgents(ctx, src)
		if err != nil {
			return in, err
		}
	}
	return in, nil
}

func localName(r clustermesh.Result) string {
	for _, m := range r.Meshes {
		for _, c := range m.Clusters {
			if c.Local {
				return c.Name
			}
		}
	}
	return ""
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// readAgents reads every meshlet pod's /status, a few at a time.
func readAgents(ctx context.Context, src meshSource) (map[string]diagnose.Agent, error) {
	rc, err := restConfig(src.kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "meshlet/" + version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	pods, err := agentPods(ctx, client, src.namespace)
	if err != nil {
		return nil, err
	}
	out := map[string]diagnose.Agent{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for node, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			s, err := podStatus(ctx, rc, client, p)
			a := agentOf(s)
			if err != nil {
				a = diagnose.Agent{Err: err.Error()}
			}
			mu.Lock()
			out[node] = a
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out, nil
}

// nodeFiles is a NODE=FILE flag.
type nodeFiles struct{ remoteFiles }

func (nodeFiles) Type() string { return "NODE=FILE" }

// readStatusFiles reads saved `meshlet status -o json` outputs by node.
func readStatusFiles(files map[string]string) (map[string]diagnose.Agent, error) {
	out := map[string]diagnose.Agent{}
	for node, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("status of node %s: %w", node, err)
		}
		var s status.Status
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("status of node %s: %s: %w", node, file, err)
		}
		out[node] = agentOf(s)
	}
	return out, nil
}

func agentOf(s status.Status) diagnose.Agent {
	a := diagnose.Agent{Role: s.Role, Version: s.Version, LastError: s.LastRun.Error, Drift: s.Drift, Findings: s.Findings}
	for _, p := range s.Peers {
		a.Peers = append(a.Peers, p.Agent())
	}
	for _, f := range s.FeaturesOff {
		a.FeaturesOff = append(a.FeaturesOff, diagnose.FeatureOff{Name: f.Name, Missing: f.Missing})
	}
	return a
}

func printFindings(w io.Writer, in diagnose.Input, flagsFrom string, fs []diagnose.Finding) {
	agents := "not asked"
	if in.Agents != nil {
		agents = fmt.Sprintf("%d read", len(in.Agents))
	}
	fmt.Fprintf(w, "Cluster %s: %d nodes, %d remote clusters, agents %s; topology from %s (meshlet %s)\n\n",
		in.Cluster, len(in.Snapshot.Nodes), len(in.Remotes), agents, flagsFrom, version)
	counts := map[diagnose.Severity]int{}
	for _, f := range fs {
		counts[f.Severity]++
		if f.ID != "" {
			fmt.Fprintf(w, "%-8s %-16s ", strings.ToUpper(string(f.Severity)), f.Check)
			status.WriteFinding(w, f)
			continue
		}
		fmt.Fprintf(w, "%-8s %-16s %s: %s\n", strings.ToUpper(string(f.Severity)), f.Check, f.Subject, f.Message)
		if f.Fix != "" {
			fmt.Fprintf(w, "%-8s %-16s → %s\n", "", "", f.Fix)
		}
	}
	fmt.Fprintf(w, "\n%s, %s, %d ok\n", plural(counts[diagnose.Error], "error"), plural(counts[diagnose.Warning], "warning"), counts[diagnose.OK])
}
