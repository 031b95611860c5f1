package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// Objects are the Kubernetes objects of one cluster as read from a file.
type Objects struct {
	Nodes  []*corev1.Node
	Peers  []*kilo.Peer
	Meshes []*clustermesh.ClusterMesh
	// Skipped counts items of other kinds (Secrets, Pods, ...).
	Skipped int
}

// ReadObjects reads what `kubectl get nodes,peers.kilo.squat.ai,clustermeshes
// -A -o yaml` (or -o json) prints: a v1 List, or single objects, or several
// YAML documents separated by ---.
func ReadObjects(r io.Reader) (Objects, error) {
	var out Objects
	data, err := io.ReadAll(r)
	if err != nil {
		return out, fmt.Errorf("reading: %w", err)
	}
	for i, doc := range splitYAML(data) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if err := out.addDocument(doc); err != nil {
			return out, fmt.Errorf("document %d: %w", i+1, err)
		}
	}
	return out, nil
}

// addDocument adds the objects of one document. JSON (`kubectl -o json`)
// is decoded as it is: converting it through YAML first cost more than
// the decoding itself (a Peer of 100,000 allowedIPs:
// docs/performance.md#hostile-peer). A document that does not decode so
// (YAML; JSON whose numbers only YAML's conversion makes fit, such as 25.0
// for an integer) is converted, as before.
func (o *Objects) addDocument(doc []byte) error {
	var direct Objects
	if direct.add(doc) == nil {
		o.Nodes = append(o.Nodes, direct.Nodes...)
		o.Peers = append(o.Peers, direct.Peers...)
		o.Meshes = append(o.Meshes, direct.Meshes...)
		o.Skipped += direct.Skipped
		return nil
	}
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	return o.add(j)
}

type typeMeta struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
}

func (o *Objects) add(j []byte) error {
	if string(bytes.TrimSpace(j)) == "null" {
		return nil
	}
	var tm typeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return fmt.Errorf("not a Kubernetes object: %w", err)
	}
	switch {
	case strings.HasSuffix(tm.Kind, "List"):
		for i, it := range tm.Items {
			if err := o.add(it); err != nil {
				return fmt.Errorf("item %d: %w", i, err)
			}
		}
	case tm.Kind == "Node" && tm.APIVersion == "v1":
		var n corev1.Node
		if err := json.Unmarshal(j, &n); err != nil {
			return fmt.Errorf("decoding a Node: %w", err)
		}
		o.Nodes = append(o.Nodes, &n)
	case tm.Kind == "Peer" && strings.HasPrefix(tm.APIVersion, kilo.GroupName+"/"):
		var p kilo.Peer
		if err := json.Unmarshal(j, &p); err != nil {
			return fmt.Errorf("decoding a Peer: %w", err)
		}
		o.Peers = append(o.Peers, &p)
	case tm.Kind == clustermesh.Kind && strings.HasPrefix(tm.APIVersion, clustermesh.GroupName+"/"):
		var m clustermesh.ClusterMesh
		if err := json.Unmarshal(j, &m); err != nil {
			return fmt.Errorf("decoding a ClusterMesh: %w", err)
		}
		o.Meshes = append(o.Meshes, &m)
	case tm.Kind == "":
		return errors.New("object without kind")
	default:
		o.Skipped++
	}
	return nil
}

// splitYAML splits a stream on lines that are exactly "---". A stream
// with no "---" at all is one document, as it is: not copied line by line.
func splitYAML(data []byte) [][]byte {
	if !bytes.Contains(data, []byte("---")) {
		return [][]byte{data}
	}
	var docs [][]byte
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		if string(bytes.TrimRight(line, " \t")) == "---" { // no string per line: a dump has 100,000s
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
			cur.Reset()
			continue
		}
		cur.Write(line)
		cur.WriteByte('\n')
	}
	docs = append(docs, cur.Bytes())
	return docs
}

// Snapshot converts objects read from files into a planner snapshot (all
// remote clusters synced). Now and Settings are left to the caller.
func Snapshot(local Objects, remotes map[string]Objects, clusterName string) topology.Snapshot {
	var snap topology.Snapshot
	snap.Nodes, snap.Peers, snap.Rejections = convertObjects(local, "")
	res := clustermesh.Resolve(local.Meshes, clusterName)
	snap.Meshes = res.Meshes
	snap.Rejections = append(snap.Rejections, res.Rejections...)
	names := make([]string, 0, len(remotes))
	for n := range remotes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		rc := topology.RemoteCluster{Name: name, Synced: true}
		var rejs []topology.Rejection
		rc.Nodes, rc.Peers, rejs = convertObjects(remotes[name], name)
		snap.Remotes = append(snap.Remotes, rc)
		snap.Rejections = append(snap.Rejections, rejs...)
	}
	return snap
}

// convertObjects converts o as the watchers do, with the default limits.
func convertObjects(o Objects, cluster string) ([]topology.Node, []topology.Peer, []topology.Rejection) {
	lim := kilo.DefaultLimits
	nodes := make([]kilo.NodeResult, 0, len(o.Nodes))
	for _, n := range o.Nodes {
		nodes = append(nodes, lim.ConvertNode(n, cluster))
	}
	kept, rejs := limitNodes(cluster, lim, nodes)
	var tnodes []topology.Node
	for _, r := range kept {
		tnodes = append(tnodes, r.Node)
		rejs = append(rejs, r.Rejections...)
	}
	var valid []convertedPeer
	for _, p := range o.Peers {
		tp, r, ok := lim.PeerToTopology(p, cluster)
		if ok {
			valid = append(valid, convertedPeer{peer: tp, ok: true, created: p.CreationTimestamp.Time})
		}
		rejs = append(rejs, r...)
	}
	valid, r := limitPeers(cluster, lim, valid)
	rejs = append(rejs, r...)
	var peers []topology.Peer
	for _, p := range valid {
		peers = append(peers, p.peer)
	}
	return tnodes, peers, rejs
}
