package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	restclientwatch "k8s.io/client-go/rest/watch"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// The largest Peer there can be (docs/security.md#hostile-input: 100,000
// allowedIPs, about the 1.5 MiB etcd takes) on its two ways into a plan:
// a watch event the agent decodes with KiloClient's serializer and its
// informer's transform, and a dump `meshlet plan` reads
// (docs/performance.md#hostile-peer).

// hostilePeer is the Peer with n allowedIPs as the API server stores it.
func hostilePeer(n int) *kilo.Peer {
	p := budgetPeer(0, 1000, n)
	p.APIVersion, p.Kind = kilo.GroupName+"/v1alpha1", kilo.KindPeer
	return p
}

// dump is what `kubectl get nodes,peers -o json|yaml` prints for the
// ordinary local cluster and the hostile Peer.
func dump(tb testing.TB, in budgetInput, asYAML bool) []byte {
	tb.Helper()
	var items []any
	for _, n := range in.localNodes {
		n := n.DeepCopy()
		n.APIVersion, n.Kind = "v1", "Node"
		items = append(items, n)
	}
	for _, p := range in.localPeers {
		p := p.DeepCopy()
		p.APIVersion, p.Kind = kilo.GroupName+"/v1alpha1", kilo.KindPeer
		items = append(items, p)
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{"resourceVersion": ""}, "items": items}
	out, err := json.MarshalIndent(list, "", "    ")
	if asYAML {
		out, err = yaml.Marshal(list)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// cpuTime is the CPU the process used so far (every thread: the
// collector's work counts).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// watchDecoder decodes one watch event as the agent's Peer informer does:
// KiloClient's serializer through client-go's stream decoder (what
// rest.Request.Watch builds for it).
func watchDecoder(tb testing.TB, event []byte) *restclientwatch.Decoder {
	tb.Helper()
	neg := runtime.NewClientNegotiator(serializer.NewCodecFactory(scheme).WithoutConversion(),
		schema.GroupVersion{Group: kilo.GroupName, Version: "v1alpha1"})
	objDec, streamDec, framer, err := neg.StreamDecoder("application/json", nil)
	if err != nil {
		tb.Fatal(err)
	}
	fr := framer.NewFrameReader(readCloser{bytes.NewReader(event)})
	return restclientwatch.NewDecoder(streaming.NewDecoder(fr, streamDec), objDec)
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// BenchmarkHostilePeer: the Peer of 100,000 allowedIPs from its bytes to
// the local leader's plan. path=watch: the watch event the API server
// sends, decoded, transformed (the informer keeps limit+1 entries),
// converted with the other objects, planned. path=file-json|file-yaml:
// `meshlet plan`'s reading of a dump of the cluster (ReadObjects),
// Snapshot, plan. The figures are means over the passes; cpu-ms is the
// process's CPU (the collector's included), steadier than the wall time
// on a shared machine.
//
//	go test -run '^$' -bench HostilePeer -benchtime=10x ./agent/runtime/cluster/
func BenchmarkHostilePeer(b *testing.B) {
	peer := hostilePeer(100000)
	obj, err := json.Marshal(peer)
	if err != nil {
		b.Fatal(err)
	}
	event := []byte(`{"type":"MODIFIED","object":` + string(obj) + "}\n")
	in := ordinary()
	in.localPeers = append(in.localPeers, peer)
	for _, path := range []string{"watch", "file-json", "file-yaml"} {
		b.Run("path="+path, func(b *testing.B) {
			var data []byte
			switch path {
			case "file-json":
				data = dump(b, in, false)
			case "file-yaml":
				data = dump(b, in, true)
			default:
				data = event
			}
			var read, convert, plan, cpu time.Duration // sums over the passes
			var pl topology.Plan
			for b.Loop() {
				c0, t0 := cpuTime(), time.Now()
				var snap topology.Snapshot
				if path == "watch" {
					_, obj, err := watchDecoder(b, data).Decode()
					if err != nil {
						b.Fatal(err)
					}
					p, _ := kilo.DefaultLimits.TransformPeer(obj)
					t1 := time.Now()
					read += t1.Sub(t0)
					in := ordinary()
					in.localPeers = append(in.localPeers, p.(*kilo.Peer))
					snap = budgetSnapshot(in, kilo.DefaultLimits)
					convert += time.Since(t1)
				} else {
					local, err := ReadObjects(bytes.NewReader(data))
					if err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					read += t1.Sub(t0)
					snap = Snapshot(local, nil, "")
					snap.Now, snap.Settings = budgetNow, topology.Settings{Subnet: netip.MustParsePrefix("10.4.0.0/16")}
					convert += time.Since(t1)
				}
				t2 := time.Now()
				pl = planner.Compute(snap, budgetSelf(snap))
				plan += time.Since(t2)
				cpu += cpuTime() - c0
			}
			if !pl.Leader || !rejected(pl, peer.Name) {
				b.Fatalf("leader %v; the Peer not rejected: %v", pl.Leader, pl.Rejections)
			}
			ms := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(b.N) }
			b.ReportMetric(float64(len(data))/(1<<10), "input-KiB")
			b.ReportMetric(ms(read), "read-ms")
			b.ReportMetric(ms(convert), "convert-ms")
			b.ReportMetric(ms(plan), "plan-ms")
			b.ReportMetric(ms(read+convert+plan), "total-ms")
			b.ReportMetric(ms(cpu), "cpu-ms")
		})
	}
}

// rejected: the plan rejects the Peer name for its allowedIPs' count.
func rejected(pl topology.Plan, name string) bool {
	for _, r := range pl.Rejections {
		if r.Object.Name == name && r.Reason == topology.ReasonLimitExceeded && r.Field == "spec.allowedIPs" {
			return true
		}
	}
	return false
}

// readThroughYAML is ReadObjects before JSON was decoded as it is: every
// document, split line by line, converted through YAML. The reference
// FuzzReadObjects holds ReadObjects to.
func readThroughYAML(data []byte) (Objects, error) {
	var out Objects
	for i, doc := range splitLines(data) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return out, fmt.Errorf("document %d: %w", i+1, err)
		}
		if err := out.add(j); err != nil {
			return out, fmt.Errorf("document %d: %w", i+1, err)
		}
	}
	return out, nil
}

// splitLines is splitYAML as it was: every line copied.
func splitLines(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		if strings.TrimRight(string(line), " \t") == "---" {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
			cur.Reset()
			continue
		}
		cur.Write(line)
		cur.WriteByte('\n')
	}
	return append(docs, cur.Bytes())
}

// TestReadObjectsJSON: JSON decoded as it is reads as the YAML conversion
// did, the conversion's leniency included.
func TestReadObjectsJSON(t *testing.T) {
	peer := `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"p"},"spec":{"allowedIPs":["10.5.0.1/32"],"publicKey":"x","persistentKeepalive":%s}}`
	for _, tc := range []struct{ name, in string }{
		{"a JSON List", `{"apiVersion":"v1","kind":"List","items":[` + fmt.Sprintf(peer, "25") + `,{"apiVersion":"v1","kind":"Node","metadata":{"name":"a"}}]}`},
		{"JSON documents", fmt.Sprintf(peer, "25") + "\n---\n" + `{"apiVersion":"v1","kind":"Secret"}`},
		// An integer as YAML's conversion writes it: decoded after the
		// conversion, as before.
		{"an integer written 25.0", fmt.Sprintf(peer, "25.0")},
		{"an integer written 2.5e1", fmt.Sprintf(peer, "2.5e1")},
		{"a key twice", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"a","name":"b"}}`},
		{"JSON and YAML documents", "kind: Node\napiVersion: v1\nmetadata: {name: a}\n---\n" + fmt.Sprintf(peer, "1")},
		// One document: read as it is, not line by line.
		{"YAML with CRLF", "kind: Node\r\napiVersion: v1\r\nmetadata:\r\n  name: a\r\n  annotations: {a: \"x\r\n  y\"}\r\n"},
		{"a block scalar with CRLF", "kind: Node\r\napiVersion: v1\r\nmetadata:\r\n  name: a\r\n  annotations:\r\n    a: |\r\n      x\r\n      y\r"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := readThroughYAML([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ReadObjects(strings.NewReader(tc.in))
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("ReadObjects = %+v, %v\nthrough YAML %+v", got, err, want)
			}
		})
	}
}

// FuzzReadObjects: whatever ReadObjects read when it converted every
// document through YAML (readThroughYAML), it reads alike now that JSON is
// decoded as it is; where that reading erred, ReadObjects may read more
// (JSON the conversion refused, a lone UTF-16 surrogate escape), never
// panic.
//
//	go test -run='^$' -fuzz='^FuzzReadObjects$' -parallel=1 ./agent/runtime/cluster/
func FuzzReadObjects(f *testing.F) {
	in := ordinary()
	in.localPeers = append(in.localPeers, hostilePeer(3))
	f.Add(dump(f, in, false))
	f.Add(dump(f, in, true))
	f.Add([]byte(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"p"},"spec":{"allowedIPs":[],"persistentKeepalive":25.0,"endpoint":{"port":1e1}}}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"NodeList","items":[{"apiVersion":"v1","kind":"Node","metadata":{"name":"a","annotations":{"k":"\ud800"}}}]}` + "\n---\nnull\n"))
	f.Add([]byte("apiVersion: kilo.squat.ai/v1alpha1\nkind: ClusterMesh\nmetadata: {name: m, namespace: kilo-system}\nspec: {clusters: [{name: a, local: true}]}\n---\nkind: Secret\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Node","spec":{"podCIDRs":3}}` + "\n---\nmetadata: {name: a}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		want, wantErr := readThroughYAML(data)
		got, err := ReadObjects(bytes.NewReader(data))
		if wantErr != nil {
			return
		}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("ReadObjects = %+v, %v\nthrough YAML %+v", got, err, want)
		}
	})
}
