package harness

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

// The drop-in (docs/dropin.md): meshlet as the image of kg's DaemonSet.
// The harness has no kubelet and no DaemonSet controller, but its API
// server is real: a DaemonSet object and one Pod object per node (bound to
// it, run by meshlet's ServiceAccount, owned by the DaemonSet) are what the
// agent reads when it stops with kg's --clean-up to tell a rolling update
// from the way back (agent/runtime/runner/depart.go, Leaving).

// KgContainer is the agent's container in Kilo's DaemonSet.
const KgContainer = "kilo"

// GrantLifecycle grants meshlet's ServiceAccount what the lifecycle
// feature needs (manifests/dropin: pods list, daemonsets get in its
// namespace), and waits until the API server allows it. Agents started
// after it see the feature on.
func (c *Cluster) GrantLifecycle(ctx context.Context) error {
	rbac := c.Admin.RbacV1()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "meshlet-lifecycle", Namespace: Namespace},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
			{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get"}},
		}}
	if _, err := rbac.Roles(Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "meshlet-lifecycle", Namespace: Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "meshlet", Namespace: Namespace}}}
	if _, err := rbac.RoleBindings(Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	tok, err := c.Server.ServiceAccountToken(ctx, Namespace, "meshlet")
	if err != nil {
		return err
	}
	return apiserver.WaitAuthorized(ctx, c.Server.TokenConfig(tok),
		authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods", Namespace: Namespace},
		authorizationv1.ResourceAttributes{Verb: "get", Group: "apps", Resource: "daemonsets", Namespace: Namespace})
}

// DaemonSet is the agent's DaemonSet object (Kilo's "kilo").
type DaemonSet struct {
	c    *Cluster
	Name string
	UID  types.UID
}

// CreateDaemonSet creates the DaemonSet name running image in container
// KgContainer with meshlet's ServiceAccount.
func (c *Cluster) CreateDaemonSet(ctx context.Context, name, image string) (*DaemonSet, error) {
	labels := map[string]string{"app.kubernetes.io/name": name}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{ServiceAccountName: "meshlet", HostNetwork: true, Containers: []corev1.Container{{Name: KgContainer, Image: image}}},
			},
		},
	}
	got, err := c.Admin.AppsV1().DaemonSets(Namespace).Create(ctx, ds, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	return &DaemonSet{c: c, Name: name, UID: got.UID}, nil
}

// SetImage changes the image of the template's container (`kubectl set
// image`): what starts a rolling update, one way or the other.
func (d *DaemonSet) SetImage(ctx context.Context, image string) error {
	b, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []map[string]any{{"name": KgContainer, "image": image}}}}}})
	if _, err := d.c.Admin.AppsV1().DaemonSets(Namespace).Patch(ctx, d.Name, types.StrategicMergePatchType, b, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cluster %s: daemonset %s: %w", d.c.Name, d.Name, err)
	}
	return nil
}

// RollPod does what the DaemonSet controller does for node in a rolling
// update once the old pod is gone: the node's pod of the DaemonSet (if
// any) is deleted and a new one created from the template as it is now.
func (d *DaemonSet) RollPod(ctx context.Context, node string) error {
	pods := d.c.Admin.CoreV1().Pods(Namespace)
	old, err := pods.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return err
	}
	zero := int64(0)
	for _, p := range old.Items {
		for _, o := range p.OwnerReferences {
			if o.UID == d.UID {
				if err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		}
	}
	ds, err := d.c.Admin.AppsV1().DaemonSets(Namespace).Get(ctx, d.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	yes := true
	spec := *ds.Spec.Template.Spec.DeepCopy()
	spec.NodeName = node
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: d.Name + "-", Namespace: Namespace, Labels: ds.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: d.Name, UID: d.UID,
				Controller: &yes, BlockOwnerDeletion: &yes}}},
		Spec: spec,
	}
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("cluster %s: pod of %s on %s: %w", d.c.Name, d.Name, node, err)
	}
	return nil
}
