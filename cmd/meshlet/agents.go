package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshlet/meshlet/agent/runtime/status"
)

// agentSelector selects meshlet's pods (manifests/base/daemonset.yaml).
const agentSelector = "app.kubernetes.io/name=meshlet"

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

// statusPort is the pod's metrics port (where /status is served).
func statusPort(p corev1.Pod) string {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "metrics" {
				return strconv.Itoa(int(port.ContainerPort))
			}
		}
	}
	return "1107"
}

// podStatus reads an agent's /status through the API server's pod proxy
// (needs get on pods/proxy).
func podStatus(ctx context.Context, client kubernetes.Interface, p corev1.Pod) (status.Status, error) {
	var s status.Status
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	raw, err := client.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, statusPort(p), "/status", nil).DoRaw(ctx)
	if err != nil {
		return s, fmt.Errorf("reading /status of pod %s/%s through the API server: %w", p.Namespace, p.Name, err)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, fmt.Errorf("decoding /status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return s, nil
}

// localStatus reads the /status of the agent listening on address (inside
// its pod: 127.0.0.1:1107).
func localStatus(ctx context.Context, address string) (status.Status, error) {
	var s status.Status
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, fmt.Errorf("reading the agent's status at %s (is meshlet running on this node? --address sets where it listens): %w", address, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return s, fmt.Errorf("reading the agent's status at %s: %w", address, err)
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("agent at %s: %s: %s", address, resp.Status, body)
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return s, fmt.Errorf("decoding the agent's status at %s: %w", address, err)
	}
	return s, nil
}
