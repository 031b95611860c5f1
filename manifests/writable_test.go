package manifests_test

import (
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/meshlet/meshlet/agent/runtime/config"
)

// TestAgentWritesWhereItMay: the agent's container runs with a read-only
// root filesystem, so every path it creates at start with its default flags
// (the /status socket's directory, the key's directory, the userspace
// device's socket directory) must lie on a volume. The chart's first release
// with the /status socket missed this: the agent exited at start ("mkdir
// /run/meshlet: read-only file system") on every upgrade.
func TestAgentWritesWhereItMay(t *testing.T) {
	writes := []string{filepath.Dir(config.DefaultStatusSocket), "/var/lib/meshlet", "/var/run/wireguard"}
	for _, tc := range []struct {
		name string
		objs []*unstructured.Unstructured
	}{
		{"manifests/", decode(t, kustomizeBuild(t, "."))},
		{"chart defaults", decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "--skip-tests"))},
		{"chart kgKey", decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "--skip-tests", "--set", "kgKey=true"))},
		{"chart sidecar", decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "--skip-tests", "--set", "wireguard.sidecar=true"))},
		{"chart privileged=false", decode(t, helm(t, "template", "meshlet", "chart", "--namespace", ns, "--skip-tests", "--set", "privileged=false"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := find(tc.objs, "DaemonSet", "meshlet")
			if ds == nil {
				t.Fatal("no DaemonSet meshlet")
			}
			cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
			for _, c := range cs {
				c := c.(map[string]any)
				if c["name"] != "meshlet" {
					continue
				}
				ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem")
				if !ro {
					t.Fatal("the agent's root filesystem is writable: this test guards the read-only case, make it read-only or drop the test")
				}
				mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
				for _, dir := range writes {
					if !onVolume(dir, mounts) {
						t.Errorf("the agent creates %s at start, and no volume is mounted there or above it (mounts %v)", dir, mountPaths(mounts))
					}
				}
				return
			}
			t.Fatal("no container meshlet")
		})
	}
}

// onVolume says whether dir is at or below a writable mount.
func onVolume(dir string, mounts []any) bool {
	for _, m := range mounts {
		m := m.(map[string]any)
		if ro, _ := m["readOnly"].(bool); ro {
			continue
		}
		p, _ := m["mountPath"].(string)
		if dir == p || strings.HasPrefix(dir, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	return false
}

func mountPaths(mounts []any) []string {
	var out []string
	for _, m := range mounts {
		p, _ := m.(map[string]any)["mountPath"].(string)
		out = append(out, p)
	}
	return out
}
