package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/meshlet/meshlet/agent/runtime/status"
)

// agentSelector selects meshlet's pods: meshlet's own DaemonSet
// (manifests/base/daemonset.yaml) and Kilo's, where meshlet's image
// replaced kg's (docs/dropin.md).
const agentSelector = "app.kubernetes.io/name in (meshlet,kilo)"

// agentPods lists the running meshlet pods of namespace, by node.
func agentPods(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]corev1.Pod, error) {
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return nil, fmt.Errorf("listing meshlet pods in %s: %w", namespace, err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
			out[p.Spec.NodeName] = p
		}
	}
	return out, nil
}

// agentContainer is the container of a meshlet pod that runs the agent:
// "meshlet" in meshlet's manifests, "kilo" where meshlet's image replaced
// kg's (docs/dropin.md), else the first.
func agentContainer(p corev1.Pod) string {
	for _, want := range []string{"meshlet", "kilo"} {
		for _, c := range p.Spec.Containers {
			if c.Name == want {
				return c.Name
			}
		}
	}
	if len(p.Spec.Containers) > 0 {
		return p.Spec.Containers[0].Name
	}
	return ""
}

// podStatus reads an agent's status by running `meshlet status -o json` in
// its container through the API server (needs create on pods/exec: the
// agent's /status is on a local socket, never on the network; see
// docs/security.md#status).
func podStatus(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, p corev1.Pod) (status.Status, error) {
	var s status.Status
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req := client.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(p.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: agentContainer(p), Command: []string{"meshlet", "status", "-o", "json"},
			Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return s, fmt.Errorf("exec in pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return s, fmt.Errorf("exec in pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return s, fmt.Errorf("exec in pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	var stdout, stderr bytes.Buffer
	if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return s, fmt.Errorf("meshlet status in pod %s/%s (needs create on pods/exec): %s", p.Namespace, p.Name, msg)
	}
	if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
		return s, fmt.Errorf("decoding the status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return s, nil
}

// localStatus reads the /status of the agent on this node from its socket
// (inside the agent's container, or as root on the node).
func localStatus(ctx context.Context, socket string) (status.Status, error) {
	var s status.Status
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	hc := status.SocketClient(socket, 0) // bounded by ctx
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://meshlet/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return s, fmt.Errorf("reading the agent's status at %s (is meshlet running on this node, and are you root? --socket says where it serves): %w", socket, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return s, fmt.Errorf("reading the agent's status at %s: %w", socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("agent at %s: %s: %s", socket, resp.Status, body)
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return s, fmt.Errorf("decoding the agent's status at %s: %w", socket, err)
	}
	return s, nil
}
