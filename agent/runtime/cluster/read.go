package cluster

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
)

// One-shot reads of a cluster through its API, for the commands that look
// at a whole mesh once (`meshlet diagnose`, `meshlet graph`); the agent
// watches instead.

// Cluster is one cluster's objects as read, and what it took.
type Cluster struct {
	Objects
	// Secrets are the kubeconfig Secrets of the ClusterMesh namespace (data
	// by key), for reaching the remote clusters.
	Secrets map[string]map[string][]byte
	// ServerTime is the API server's clock when it answered (its Date
	// header), ClockOffset how far it is ahead of this machine's clock
	// (±1 s: the header has whole seconds): what clock skew between
	// clusters is measured with.
	ServerTime  time.Time
	ClockOffset time.Duration
}

// ReadCluster lists a cluster's Nodes and Peers, and in namespace its
// ClusterMeshes and Secrets (withSecrets: only where the credentials allow
// it and the caller needs the remote clusters).
func ReadCluster(ctx context.Context, clk clock.PassiveClock, cfg *rest.Config, namespace string, withSecrets bool) (Cluster, error) {
	var out Cluster
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return out, fmt.Errorf("kubernetes client: %w", err)
	}
	rc, err := readNodesAndPeers(ctx, cfg, client, &out, true)
	if err != nil {
		return out, err
	}
	var meshes clustermesh.ClusterMeshList
	if err := rc.Get().Namespace(namespace).Resource("clustermeshes").Do(ctx).Into(&meshes); err != nil {
		return out, fmt.Errorf("listing clustermeshes.kilo.squat.ai in %s: %w", namespace, err)
	}
	for i := range meshes.Items {
		out.Meshes = append(out.Meshes, &meshes.Items[i])
	}
	if withSecrets {
		// Only the Secrets the ClusterMeshes name, each read by name (as
		// the agents do: a grant with resourceNames is enough).
		out.Secrets = map[string]map[string][]byte{}
		for _, m := range out.Meshes {
			for _, c := range m.Spec.Clusters {
				ref := c.KubeconfigSecretRef
				if ref == nil || ref.Name == "" || out.Secrets[ref.Name] != nil {
					continue
				}
				s, err := client.CoreV1().Secrets(namespace).Get(ctx, ref.Name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					continue
				}
				if err != nil {
					return out, fmt.Errorf("reading secret %s/%s: %w", namespace, ref.Name, err)
				}
				out.Secrets[s.Name] = s.Data
			}
		}
	}
	out.ServerTime, out.ClockOffset = serverClock(ctx, clk, cfg)
	return out, nil
}

// ReadRemote reads a remote cluster with the kubeconfig of its Secret (the
// read-only credentials the agents use, refused as the agents refuse them:
// RemoteConfig): its Nodes and Peers.
func ReadRemote(ctx context.Context, clk clock.PassiveClock, kubeconfig []byte, policy KubeconfigPolicy) (Cluster, error) {
	cfg, err := RemoteConfig(kubeconfig, policy)
	if err != nil {
		return Cluster{}, fmt.Errorf("kubeconfig refused: %w", err)
	}
	cfg.Timeout = 15 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Cluster{}, fmt.Errorf("kubeconfig refused: %w", clientBuildError(err))
	}
	var out Cluster
	// A cluster without Kilo's Peer CRD still meshes (as the watchers).
	if _, err := readNodesAndPeers(ctx, cfg, client, &out, false); err != nil {
		return out, err
	}
	out.ServerTime, out.ClockOffset = serverClock(ctx, clk, cfg)
	return out, nil
}

// readNodesAndPeers lists the Nodes and Kilo Peers into out (Peers only
// if they can be listed, unless requirePeers) and returns the client of
// Kilo's API group.
func readNodesAndPeers(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, out *Cluster, requirePeers bool) (rest.Interface, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		out.Nodes = append(out.Nodes, &nodes.Items[i])
	}
	rc, err := KiloClient(cfg)
	if err != nil {
		return nil, err
	}
	var peers kilo.PeerList
	if err := rc.Get().Resource("peers").Do(ctx).Into(&peers); err != nil {
		if requirePeers {
			return nil, fmt.Errorf("listing peers.kilo.squat.ai: %w", err)
		}
		return rc, nil
	}
	for i := range peers.Items {
		out.Peers = append(out.Peers, &peers.Items[i])
	}
	return rc, nil
}

// serverClock reads the API server's clock from the Date header of
// /version, and its offset from this machine's clock at the middle of the
// request; zero values when it does not answer.
func serverClock(ctx context.Context, clk clock.PassiveClock, cfg *rest.Config) (time.Time, time.Duration) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return time.Time{}, 0
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/version", nil)
	if err != nil {
		return time.Time{}, 0
	}
	sent := clk.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return time.Time{}, 0
	}
	received := clk.Now()
	resp.Body.Close()
	t, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return time.Time{}, 0
	}
	// The header is truncated to the second: its middle is the best guess.
	t = t.Add(500 * time.Millisecond)
	mid := sent.Add(received.Sub(sent) / 2)
	return t, t.Sub(mid)
}
