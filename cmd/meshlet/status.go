package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/runtime/config"
	"github.com/meshlet/meshlet/agent/runtime/status"
)

// newStatusCmd is `meshlet status`: what the running agent of a node does,
// read from its /status endpoint — the agent's own plan, device and health,
// not a second computation.
func newStatusCmd() *cobra.Command {
	var socket, node, kubeconfig, namespace string
	var output *outputFlag
	c := &cobra.Command{
		Use:   "status",
		Short: "Show what the agent on a node does: role, device, peer health, routes, drift, remote clusters",
		Long: "Show what the running agent on a node does.\n\n" +
			"Inside the agent's pod (kubectl exec -n kilo-system ds/meshlet -- meshlet status), or as root on the node, it reads\n" +
			"the agent's local socket (--socket); with --node it runs this command in that node's meshlet pod through the API\n" +
			"server (needs create on pods/exec). The agent never serves its status on the network.",
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := output.check(); err != nil {
				return err
			}
			var s status.Status
			var err error
			if node == "" {
				s, err = localStatus(c.Context(), socket)
			} else {
				s, err = nodeStatus(c, kubeconfig, namespace, node)
			}
			if err != nil {
				return err
			}
			if output.value == "json" {
				enc := json.NewEncoder(c.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(s)
			}
			return status.Print(c.OutOrStdout(), s)
		},
	}
	fs := c.Flags()
	fs.StringVar(&socket, "socket", config.DefaultStatusSocket, "the agent's status socket on this node (its --status-socket)")
	output = registerOutput(fs, "text", "json")
	fs.StringVar(&node, "node", "", "read this node's agent through the API server (pods/exec) instead of --socket")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "with --node: kubeconfig (default: $KUBECONFIG, else in-cluster)")
	fs.StringVar(&namespace, "namespace", "kilo-system", "with --node: namespace of meshlet's pods")
	return c
}

func nodeStatus(c *cobra.Command, kubeconfig, namespace, node string) (status.Status, error) {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return status.Status{}, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "meshlet/" + version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return status.Status{}, fmt.Errorf("kubernetes client: %w", err)
	}
	pods, err := agentPods(c.Context(), client, namespace)
	if err != nil {
		return status.Status{}, err
	}
	p, ok := pods[node]
	if !ok {
		return status.Status{}, fmt.Errorf("no running meshlet pod on node %s in namespace %s", node, namespace)
	}
	return podStatus(c.Context(), rc, client, p)
}
