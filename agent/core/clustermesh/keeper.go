package clustermesh

// Keeper remembers the last accepted version of every ClusterMesh, so that
// an edit that fails validation (an overlap, a typo in a CIDR) changes
// nothing on the data plane: the previous version stays in force while the
// new one is reported as rejected. Deleting a ClusterMesh still takes
// effect. Not safe for concurrent use.
type Keeper struct {
	good map[string]*ClusterMesh // by namespace/name
}

// Resolve is Resolve with the last accepted version standing in for a
// rejected one. The rejections of the current versions are all returned.
func (k *Keeper) Resolve(meshes []*ClusterMesh, clusterName string) Result {
	if k.good == nil {
		k.good = map[string]*ClusterMesh{}
	}
	res := Resolve(meshes, clusterName)
	accepted := map[string]bool{}
	for _, m := range res.Meshes {
		accepted[m.Namespace+"/"+m.Name] = true
	}
	present := map[string]bool{}
	list := make([]*ClusterMesh, 0, len(meshes))
	substituted := false
	for _, m := range meshes {
		if m == nil {
			continue
		}
		id := m.Namespace + "/" + m.Name
		present[id] = true
		if old, ok := k.good[id]; ok && !accepted[id] {
			list = append(list, old)
			substituted = true
			continue
		}
		list = append(list, m)
	}
	for id := range k.good {
		if !present[id] {
			delete(k.good, id) // deleted by the user: no longer in force
		}
	}
	for _, m := range meshes {
		if m != nil && accepted[m.Namespace+"/"+m.Name] {
			k.good[m.Namespace+"/"+m.Name] = m
		}
	}
	if !substituted {
		return res
	}
	kept := Resolve(list, clusterName)
	kept.Rejections = res.Rejections
	return kept
}
