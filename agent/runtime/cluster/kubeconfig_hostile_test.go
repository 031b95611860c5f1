package cluster

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/agent/runtime/cluster/kubeconfigtest"
)

// TestRemoteConfigNeverEchoes: every hostile kubeconfig shape
// (kubeconfigtest.Hostiles: duplicate entries with inline tokens and keys,
// user info in server and proxy-url, tokens in malformed YAML, bad base64
// and PEM, aliases, oversized, …) is refused with a *KubeconfigError naming
// the field or the check, and its message carries none of the shape's
// marker token or key bytes. The control: client-go's own loader, on the
// shapes it refuses, quotes them for some (the duplicate users), so the
// check can fail.
func TestRemoteConfigNeverEchoes(t *testing.T) {
	srv := newHostileServer(t)
	hs, err := kubeconfigtest.Hostiles(srv.URL, []byte(srv.caData()))
	if err != nil {
		t.Fatal(err)
	}
	controls := 0
	for _, h := range hs {
		t.Run(h.Name, func(t *testing.T) {
			cfg, err := RemoteConfig(h.Kubeconfig, KubeconfigPolicy{})
			if h.Field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if leaks := kubeconfigtest.Leaks(hs, cfg.Host); len(leaks) > 0 {
					t.Errorf("host %q carries %v", cfg.Host, leaks)
				}
				return
			}
			ke, ok := AsKubeconfigError(err)
			if !ok || cfg != nil {
				t.Fatalf("RemoteConfig = %v, %v; want a *KubeconfigError", cfg, err)
			}
			t.Logf("%d bytes: %v", len(h.Kubeconfig), err)
			if !strings.Contains(err.Error(), h.Field) {
				t.Errorf("%q does not name %s", err, h.Field)
			}
			if ke.Reason == "" || len(err.Error()) > 400 {
				t.Errorf("message %q: want a short reason", err)
			}
			if leaks := kubeconfigtest.Leaks(hs, err.Error()); len(leaks) > 0 {
				t.Errorf("the message carries %v", leaks)
			}
			if _, cerr := clientcmd.Load(h.Kubeconfig); cerr != nil && len(kubeconfigtest.Leaks(hs, cerr.Error())) > 0 {
				controls++
			}
		})
	}
	// Not in a subtest: the count is over all of them.
	if controls == 0 {
		t.Error("control: client-go's loader quoted no shape's credentials, so this test proves nothing")
	}
	t.Logf("client-go's loader quotes the credentials of %d of %d shapes", controls, len(hs))
}

// maximalKubeconfigs are the costliest kubeconfigs of at most
// MaxKubeconfigSize for RemoteConfig: as many YAML nodes as it parses
// (MaxKubeconfigMarks) and the rest in one scalar, accepted or refused
// after parsing twice (two users of one name); a CA bundle of that size;
// as many nodes as fit (refused before parsing).
func maximalKubeconfigs(tb testing.TB) map[string][]byte {
	ca := seedCA(tb)
	head := string(kubeconfigWith("https://10.0.0.1:6443", string(ca), nil, []string{"token: tok-123"}))
	nodes := func(budget int) string {
		// `{a: b},` is 3 marks, the costliest per mark measured.
		return "x: [" + strings.Repeat("{a: b},", budget/3) + "{}]\n"
	}
	fill := func(doc string) []byte {
		pad := MaxKubeconfigSize - len(doc) - len("pad: \n")
		return []byte(doc + "pad: " + strings.Repeat("QUJD", pad/4) + "\n")
	}
	marks := func(doc string) int { return MaxKubeconfigMarks - 40 - strings.Count(doc, "\n")*3 }
	dup := strings.Replace(head, "users:\n", "users:\n- name: remote\n  user:\n    token: tok-456\n", 1)
	bundle := strings.Repeat(string(ca), (MaxKubeconfigSize*3/4-len(head))/len(ca))
	out := map[string][]byte{
		"nodes at the bound, accepted":              fill(head + nodes(marks(head))),
		"nodes at the bound, two users of one name": fill(dup + nodes(marks(dup))),
		"CA bundle at the size bound":               []byte(strings.Replace(head, b64(string(ca)), b64(bundle), 1)),
		"as many nodes as fit, refused unparsed":    []byte(head + nodes((MaxKubeconfigSize-len(head)-16)/7*3)),
	}
	for name, kc := range out {
		if len(kc) > MaxKubeconfigSize {
			tb.Fatalf("%s: %d bytes", name, len(kc))
		}
	}
	return out
}

// TestRemoteConfigMaximal: the costliest kubeconfigs meet the outcome
// BenchmarkRemoteConfigMaximal measures (the time is reported, not
// asserted).
func TestRemoteConfigMaximal(t *testing.T) {
	want := map[string]string{ // "" accepted, else a part of the refusal
		"nodes at the bound, accepted":              "",
		"nodes at the bound, two users of one name": `users["remote"]: two entries`,
		"CA bundle at the size bound":               "",
		"as many nodes as fit, refused unparsed":    "line breaks and YAML/JSON indicators",
	}
	for name, kc := range maximalKubeconfigs(t) {
		start, cpu := time.Now(), processCPU(t)
		_, err := RemoteConfig(kc, KubeconfigPolicy{})
		took, tookCPU := time.Since(start), processCPU(t)-cpu
		if w := want[name]; (w == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want %q", name, err, w)
		}
		t.Logf("%s (%d bytes): %v in %v (CPU %v)", name, len(kc), err, took.Round(time.Millisecond), tookCPU.Round(time.Millisecond))
	}
}

// processCPU is the CPU time this process has used (garbage collection
// included).
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRemoteConfigMaximal: RemoteConfig's CPU on the costliest
// kubeconfigs it can be given (docs/security.md#budgets):
//
//	go test -run='^$' -bench=RemoteConfigMaximal -benchtime=20x ./agent/runtime/cluster/
func BenchmarkRemoteConfigMaximal(b *testing.B) {
	for name, kc := range maximalKubeconfigs(b) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(kc)))
			cpu := processCPU(b)
			for b.Loop() {
				_, _ = RemoteConfig(kc, KubeconfigPolicy{})
			}
			// CPU, garbage collection included: on a shared machine the
			// wall time per op says more about the neighbours.
			b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N)/1e6, "cpu-ms/op")
		})
	}
}
