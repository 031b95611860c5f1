package clustermesh

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Kind is the ObjectRef kind of rejections about ClusterMeshes.
const Kind = "ClusterMesh"

// ReasonMeshConflict rejects a mesh that contradicts an earlier mesh (by
// namespace/name): the same cluster declared with other allowedNetworks.
// Overlaps between different clusters of different meshes use
// topology.ReasonNetworksOverlap.
//
// TODO(topology): move to agent/topology's Reason constants.
const ReasonMeshConflict = topology.ReasonMeshConflict

// DefaultKubeconfigKey is the Secret key used when kubeconfigSecretRef names
// no key (the operator's conventional key).
const DefaultKubeconfigKey = "kubeconfig"

const maxKeepalive = 65535

// Kubeconfig locates the kubeconfig of one remote cluster of an accepted mesh.
type Kubeconfig struct {
	// Mesh is the ClusterMesh that declares the cluster.
	Mesh topology.ObjectRef
	// Cluster is the remote cluster's name.
	Cluster string
	// Namespace, Name and Key locate the Secret (the mesh's namespace).
	Namespace, Name, Key string
	// Field is the mesh's field that names the Secret
	// (spec.clusters[i].kubeconfigSecretRef), for rejections.
	Field string
}

// Result is the outcome of Resolve.
type Result struct {
	// Meshes are the accepted meshes, sorted by namespace/name, clusters in
	// spec order, with Local set on exactly one entry: this cluster's.
	Meshes []topology.Mesh
	// Rejections explain every refused mesh, in the same order.
	Rejections []topology.Rejection
	// Kubeconfigs are the remote clusters of the accepted meshes, in order;
	// the remote watchers connect with them.
	Kubeconfigs []Kubeconfig
}

// ToTopology validates meshes for the cluster named clusterName ("" = use the
// local: true entries) and converts the valid ones; see Resolve.
func ToTopology(meshes []*ClusterMesh, clusterName string) ([]topology.Mesh, []topology.Rejection) {
	r := Resolve(meshes, clusterName)
	return r.Meshes, r.Rejections
}

// Resolve validates every mesh (Validate), then checks the meshes against
// each other in namespace/name order: a mesh is rejected whole when it
// declares a cluster already declared by an accepted mesh with other
// networks (ReasonMeshConflict; the same networks in the other schema's
// fields are the same), or when any of its networks overlaps
// a network of a different cluster of an accepted mesh
// (ReasonNetworksOverlap). "Earlier wins" makes the outcome independent of
// the order the informer lists objects in. This cluster's entry counts as
// the same cluster in every mesh even where meshes name it differently.
// Nil entries are ignored.
func Resolve(meshes []*ClusterMesh, clusterName string) Result {
	sorted := make([]*ClusterMesh, 0, len(meshes))
	for _, m := range meshes {
		if m != nil {
			sorted = append(sorted, m)
		}
	}
	slices.SortStableFunc(sorted, func(a, b *ClusterMesh) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})

	type claim struct {
		networks []netip.Prefix // sorted
		mesh     topology.ObjectRef
		cluster  string
	}
	var res Result
	claims := map[string]claim{} // by cluster identity
	var prev *ClusterMesh
	for _, m := range sorted {
		ref := meshRef(m)
		if prev != nil && prev.Namespace == m.Namespace && prev.Name == m.Name {
			res.Rejections = append(res.Rejections, topology.Rejection{Object: ref, Reason: topology.ReasonInvalidClusterMesh,
				Message: "duplicate ClusterMesh object; the first one is used"})
			continue
		}
		prev = m
		tm, fields, rejs := validate(m, clusterName)
		if len(rejs) > 0 {
			res.Rejections = append(res.Rejections, rejs...)
			continue
		}
		// Cross-mesh checks against the claims of accepted meshes.
		for i, c := range tm.Clusters {
			id := identity(c)
			nets := sortedPrefixes(c.AllowedNetworks)
			if prior, ok := claims[id]; ok && !slices.Equal(prior.networks, nets) {
				rejs = append(rejs, topology.Rejection{Object: ref, Field: networksField(m.Spec.Clusters[i], i), Reason: ReasonMeshConflict,
					Message: fmt.Sprintf("cluster %q has the networks %v here but %v in %s (as %q), which takes precedence",
						c.Name, nets, prior.networks, prior.mesh, prior.cluster)})
				continue
			}
			for pid, prior := range sortedClaims(claims) {
				if pid == id {
					continue
				}
				if x, b, ok := firstOverlap(c.AllowedNetworks, prior.networks); ok {
					a := c.AllowedNetworks[x]
					rejs = append(rejs, topology.Rejection{Object: ref, Field: fields[i][x], Reason: topology.ReasonNetworksOverlap,
						Message: fmt.Sprintf("%s of cluster %q overlaps %s of cluster %q in %s, which takes precedence",
							a, c.Name, b, prior.cluster, prior.mesh)})
				}
			}
		}
		if len(rejs) > 0 {
			res.Rejections = append(res.Rejections, rejs...)
			continue
		}
		for i, c := range tm.Clusters {
			id := identity(c)
			if _, ok := claims[id]; !ok {
				claims[id] = claim{networks: sortedPrefixes(c.AllowedNetworks), mesh: ref, cluster: c.Name}
			}
			if c.Local {
				continue
			}
			s := m.Spec.Clusters[i].KubeconfigSecretRef
			key := s.Key
			if key == "" {
				key = DefaultKubeconfigKey
			}
			res.Kubeconfigs = append(res.Kubeconfigs, Kubeconfig{Mesh: ref, Cluster: c.Name, Namespace: m.Namespace, Name: s.Name, Key: key,
				Field: fmt.Sprintf("spec.clusters[%d].kubeconfigSecretRef", i)})
		}
		res.Meshes = append(res.Meshes, tm)
	}
	return res
}

// identity keys a cluster across meshes: this cluster's entry is one cluster
// whatever each mesh calls it.
func identity(c topology.MeshCluster) string {
	if c.Local {
		return "\x00local"
	}
	return c.Name
}

// sortedClaims iterates claims in key order so that rejection messages are
// deterministic.
func sortedClaims[V any](m map[string]V) func(yield func(string, V) bool) {
	return func(yield func(string, V) bool) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !yield(k, m[k]) {
				return
			}
		}
	}
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// firstOverlap returns the index in a and the prefix of b of the first
// overlapping pair.
func firstOverlap(a, b []netip.Prefix) (int, netip.Prefix, bool) {
	for i, x := range a {
		for _, y := range b {
			if x.Overlaps(y) {
				return i, y, true
			}
		}
	}
	return 0, netip.Prefix{}, false
}

func meshRef(m *ClusterMesh) topology.ObjectRef {
	return topology.ObjectRef{Kind: Kind, Namespace: m.Namespace, Name: m.Name}
}

// Validate checks one ClusterMesh on its own and converts it. This cluster's
// entry is the one named clusterName if there is one, else the single entry
// marked local: true. Rules (docs/clustermesh.md): at least one cluster; names
// are DNS labels, unique; at most one local: true entry, and exactly one if
// clusterName names no entry; the networks — allowedNetworks, podCIDRs,
// wireguardCIDR, serviceCIDR and additionalCIDRs, which add up (in that
// order) to the cluster's AllowedNetworks — are CIDRs (masked to their
// network; 0.0.0.0/0 and ::/0 refused, a cluster must not claim
// everything), each rejected under the field it was written in; a network
// written in both forms (allowedNetworks and one of the others) counts
// once; wireguardPort 1–65535 (0 = 51820); persistentKeepalive 0–65535;
// every remote entry has a kubeconfigSecretRef with a name (key defaults to
// "kubeconfig"); no two networks overlap, within a cluster or across
// clusters. Any problem rejects the whole mesh: the returned Mesh is then
// zero and every problem is listed.
func Validate(m *ClusterMesh, clusterName string) (topology.Mesh, []topology.Rejection) {
	tm, _, rejs := validate(m, clusterName)
	return tm, rejs
}

// validate is Validate, with the field each network of each cluster was
// written in (its list, e.g. spec.clusters[1].podCIDRs), aligned with the
// clusters' AllowedNetworks.
func validate(m *ClusterMesh, clusterName string) (topology.Mesh, [][]string, []topology.Rejection) {
	if m == nil {
		return topology.Mesh{}, nil, nil
	}
	ref := meshRef(m)
	var rejs []topology.Rejection
	reject := func(field string, reason topology.Reason, format string, args ...any) {
		rejs = append(rejs, topology.Rejection{Object: ref, Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	clusters := m.Spec.Clusters
	if len(clusters) == 0 {
		reject("spec.clusters", topology.ReasonInvalidClusterMesh, "spec.clusters is empty")
		return topology.Mesh{}, nil, rejs
	}
	local := localIndex(clusters, clusterName, reject)
	out := topology.Mesh{Namespace: m.Namespace, Name: m.Name, Clusters: make([]topology.MeshCluster, len(clusters))}
	fields := make([][]string, len(clusters))
	seen := map[string]int{}
	for i, c := range clusters {
		f := fmt.Sprintf("spec.clusters[%d]", i)
		if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
			reject(f+".name", topology.ReasonInvalidClusterMesh, "cluster name %s is not a DNS label: %s", quote(c.Name), strings.Join(errs, "; "))
		} else if j, dup := seen[c.Name]; dup {
			reject(f+".name", topology.ReasonInvalidClusterMesh, "cluster name %q is also used by spec.clusters[%d]", c.Name, j)
		} else {
			seen[c.Name] = i
		}
		// Which entries are remote is unknown while the local one is
		// unresolved; that error is reported already.
		out.Clusters[i], fields[i] = validateCluster(c, f, i == local, local >= 0 && i != local, reject)
	}
	rejectOverlaps(out.Clusters, fields, reject)
	if len(rejs) > 0 {
		return topology.Mesh{}, nil, rejs
	}
	return out, fields, nil
}

// rejecter records one problem of a ClusterMesh.
type rejecter func(field string, reason topology.Reason, format string, args ...any)

// localIndex finds this cluster's entry: by name with --cluster-name, else
// the one marked local (-1 when there is none, with the problem reported).
func localIndex(clusters []Cluster, clusterName string, reject rejecter) int {
	local := -1
	var marked []int
	for i, c := range clusters {
		if clusterName != "" && c.Name == clusterName && local < 0 {
			local = i
		}
		if c.Local {
			marked = append(marked, i)
		}
	}
	if len(marked) > 1 {
		reject("spec.clusters", topology.ReasonInvalidClusterMesh, "%d entries are marked local: true (%s); at most one may be", len(marked), names(clusters, marked))
	}
	if local < 0 {
		switch {
		case len(marked) == 1:
			local = marked[0]
		case len(marked) == 0 && clusterName != "":
			reject("spec.clusters", topology.ReasonInvalidClusterMesh, "no entry is named %q (--cluster-name) and none is marked local: true", clusterName)
		case len(marked) == 0:
			reject("spec.clusters", topology.ReasonInvalidClusterMesh, "no entry is marked local: true and no --cluster-name is set")
		}
	}
	return local
}

// network is one CIDR of an entry as written: the value, its field
// (spec.clusters[1].podCIDRs[0]) and the field's list (…podCIDRs), and
// whether it is in 0.6's allowedNetworks.
type network struct {
	value, field, list string
	flat               bool
}

// networks lists the CIDRs of entry c (field f) in both forms, in the order
// they add up: allowedNetworks, podCIDRs, wireguardCIDR, serviceCIDR,
// additionalCIDRs. An empty wireguardCIDR or serviceCIDR is unset.
func networks(c Cluster, f string) []network {
	var out []network
	list := func(name string, values []string, flat bool) {
		for j, v := range values {
			out = append(out, network{value: v, field: fmt.Sprintf("%s.%s[%d]", f, name, j), list: f + "." + name, flat: flat})
		}
	}
	one := func(name, v string) {
		if v != "" {
			out = append(out, network{value: v, field: f + "." + name, list: f + "." + name})
		}
	}
	list("allowedNetworks", c.AllowedNetworks, true)
	list("podCIDRs", c.PodCIDRs, false)
	one("wireguardCIDR", c.WireguardCIDR)
	one("serviceCIDR", c.ServiceCIDR)
	list("additionalCIDRs", c.AdditionalCIDRs, false)
	return out
}

// networksField names the networks of entry i as a whole, for a rejection
// about all of them: allowedNetworks where the entry has only 0.6's form,
// else the entry (its networks are in several fields).
func networksField(c Cluster, i int) string {
	f := fmt.Sprintf("spec.clusters[%d]", i)
	if len(c.PodCIDRs) == 0 && c.WireguardCIDR == "" && c.ServiceCIDR == "" && len(c.AdditionalCIDRs) == 0 {
		return f + ".allowedNetworks"
	}
	return f
}

// validateCluster checks one entry (field f) and converts it; the second
// result is the list each of its AllowedNetworks was written in.
func validateCluster(c Cluster, f string, local, remote bool, reject rejecter) (topology.MeshCluster, []string) {
	mc := topology.MeshCluster{Name: c.Name, Local: local, WireGuardPort: c.WireguardPort, PersistentKeepalive: c.PersistentKeepalive}
	var lists []string
	flat := map[netip.Prefix]bool{} // allowedNetworks, which come first
	for _, n := range networks(c, f) {
		p, err := netip.ParsePrefix(strings.TrimSpace(n.value))
		if err == nil && p.Addr().Is4In6() {
			err = fmt.Errorf("IPv4-mapped IPv6 address")
		}
		switch {
		case err != nil:
			reject(n.field, topology.ReasonInvalidCIDR, "invalid CIDR %s: %v", quote(n.value), err)
		case p.Bits() == 0:
			reject(n.field, topology.ReasonDefaultRoute, "%s would route everything to cluster %q", p, c.Name)
		case !n.flat && flat[p.Masked()]:
			// The same network in both forms (an entry being moved from
			// one to the other): one network. Within one form a repeat is
			// an overlap, as the operator has it.
		default:
			mc.AllowedNetworks = append(mc.AllowedNetworks, p.Masked())
			lists = append(lists, n.list)
			if n.flat {
				flat[p.Masked()] = true
			}
		}
	}
	switch {
	case c.WireguardPort == 0:
		mc.WireGuardPort = DefaultWireGuardPort
	case c.WireguardPort < 0 || c.WireguardPort > 65535:
		reject(f+".wireguardPort", topology.ReasonInvalidClusterMesh, "wireguardPort %d out of range 1-65535", c.WireguardPort)
	}
	if c.PersistentKeepalive < 0 || c.PersistentKeepalive > maxKeepalive {
		reject(f+".persistentKeepalive", topology.ReasonInvalidClusterMesh, "persistentKeepalive %d out of range 0-%d", c.PersistentKeepalive, maxKeepalive)
	}
	if remote {
		if r := c.KubeconfigSecretRef; r == nil || r.Name == "" {
			reject(f+".kubeconfigSecretRef", topology.ReasonInvalidClusterMesh, "remote cluster %q needs kubeconfigSecretRef.name", c.Name)
		} else if errs := validation.IsDNS1123Subdomain(r.Name); len(errs) > 0 {
			reject(f+".kubeconfigSecretRef.name", topology.ReasonInvalidClusterMesh, "Secret name %s: %s", quote(r.Name), strings.Join(errs, "; "))
		}
	}
	return mc, lists
}

// rejectOverlaps reports overlapping networks, within a cluster and across
// clusters, each pair once, under the field of the later network of the
// pair (fields: the list each network was written in).
func rejectOverlaps(clusters []topology.MeshCluster, fields [][]string, reject rejecter) {
	for i := range clusters {
		for j := i; j < len(clusters); j++ {
			a, b := clusters[i], clusters[j]
			for x, pa := range a.AllowedNetworks {
				start := 0
				if i == j {
					start = x + 1
				}
				for y, pb := range b.AllowedNetworks[start:] {
					if !pa.Overlaps(pb) {
						continue
					}
					where := fmt.Sprintf("clusters %q and %q", a.Name, b.Name)
					if i == j {
						where = fmt.Sprintf("cluster %q", a.Name)
					}
					reject(fields[j][start+y], topology.ReasonNetworksOverlap, "%s and %s overlap (%s)", pa, pb, where)
				}
			}
		}
	}
}

func names(cs []Cluster, idx []int) string {
	var s []string
	for _, i := range idx {
		s = append(s, strconv.Quote(cs[i].Name))
	}
	return strings.Join(s, ", ")
}

// quote formats a user value for a message, truncated: values may be large.
func quote(s string) string {
	const maxQuoted = 64
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}
