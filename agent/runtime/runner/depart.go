package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/grants"
	"github.com/meshlet/meshlet/netlinkx"
)

// When the agent stops with kg's --clean-up (docs/dropin.md#clean-up),
// kg removes everything it set up, so a rolling update of its DaemonSet
// cuts traffic until the new pod is up. meshlet removes it only when the
// node is left: its DaemonSet is gone, or no longer runs on this node.
// When a new agent follows (a rolling update, a restart), everything stays
// and traffic flows on.

// Leaving reports whether the node is left, and why. Once judged as the
// agent stopped (stopping), the same judgement is returned.
func (a *Agent) Leaving(ctx context.Context) (bool, string) {
	if l := a.left; l != nil {
		return l.leaving, l.why
	}
	j, ok := a.judgeLeaving(ctx)
	if ok {
		a.left = &j
	}
	return j.leaving, j.why
}

// judgeLeaving is Leaving's judgement; ok is false when the API did not
// answer what it needs.
func (a *Agent) judgeLeaving(ctx context.Context) (j leftJudgement, ok bool) {
	if a.opts.Grants.On(grants.Lifecycle) {
		j, err := a.daemonSetLeaves(ctx)
		if err == nil {
			return j, true
		}
		a.opts.Log.Warn("could not read this agent's DaemonSet; judging from what else the API says", "error", err)
	}
	// kg's grants alone: the signs of an uninstall the agent can see.
	r, err := a.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}}},
		metav1.CreateOptions{})
	switch {
	case apierrors.IsUnauthorized(err):
		return leftJudgement{leaving: true, why: "its credentials are gone (ServiceAccount deleted)"}, true
	case err == nil && !r.Status.Allowed:
		return leftJudgement{leaving: true, why: "its RBAC is gone"}, true
	case err != nil:
		return leftJudgement{why: "the API did not say: " + err.Error()}, false
	}
	_, err = a.client.Discovery().ServerResourcesForGroupVersion("kilo.squat.ai/v1alpha1")
	switch {
	case apierrors.IsNotFound(err):
		return leftJudgement{leaving: true, why: "Kilo's Peer CRD is gone"}, true
	case err != nil:
		return leftJudgement{why: "the API did not say: " + err.Error()}, false
	}
	return leftJudgement{why: "no sign of an uninstall (grant list on pods and get on daemonsets to tell for sure: docs/dropin.md#grants)"}, true
}

// daemonSetLeaves finds this agent's pod on this node (by its
// ServiceAccount) and the DaemonSet that owns it.
func (a *Agent) daemonSetLeaves(ctx context.Context) (leftJudgement, error) {
	ssr, err := a.client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return leftJudgement{}, fmt.Errorf("who am I: %w", err)
	}
	parts := strings.Split(ssr.Status.UserInfo.Username, ":") // system:serviceaccount:NS:NAME
	if len(parts) != 4 || parts[1] != "serviceaccount" {
		return leftJudgement{}, fmt.Errorf("%q is not a ServiceAccount", ssr.Status.UserInfo.Username)
	}
	ns, sa := parts[2], parts[3]
	pods, err := a.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", a.opts.Node).String()})
	if err != nil {
		return leftJudgement{}, err
	}
	var owner *metav1.OwnerReference
	var mine *corev1.Pod
	for i, p := range pods.Items {
		if p.Spec.ServiceAccountName != sa {
			continue
		}
		for _, o := range p.OwnerReferences {
			if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
				owner, mine = &o, &pods.Items[i]
			}
		}
	}
	if owner == nil {
		return leftJudgement{}, errors.New("no pod of a DaemonSet with this agent's ServiceAccount on this node")
	}
	ds, err := a.client.AppsV1().DaemonSets(ns).Get(ctx, owner.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && ds.UID != owner.UID:
		return leftJudgement{leaving: true, why: "its DaemonSet " + ns + "/" + owner.Name + " is gone"}, nil
	case err != nil:
		return leftJudgement{}, err
	case ds.DeletionTimestamp != nil:
		return leftJudgement{leaving: true, why: "its DaemonSet " + ns + "/" + owner.Name + " is being deleted"}, nil
	}
	// The whole Node (the informer keeps only what meshlet reads), by a
	// list: kg's grants have no get on nodes.
	nodes, err := a.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", a.opts.Node).String()})
	if err != nil {
		return leftJudgement{}, fmt.Errorf("reading this node: %w", err)
	}
	if len(nodes.Items) != 1 {
		return leftJudgement{}, fmt.Errorf("node %s not found", a.opts.Node)
	}
	tmpl := &corev1.Pod{Spec: ds.Spec.Template.Spec}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(tmpl).Match(&nodes.Items[0]); err == nil && !ok {
		return leftJudgement{leaving: true, why: "its DaemonSet " + ns + "/" + owner.Name + " no longer runs on this node"}, nil
	}
	// The way back: the DaemonSet now runs another image (kg's) in this
	// agent's container, which takes over the node as kg cleaned up after
	// itself, but for the annotations of Kilo's that kg publishes again
	// (docs/dropin.md#the-way-back).
	for _, c := range mine.Spec.Containers {
		for _, t := range ds.Spec.Template.Spec.Containers {
			if c.Name == t.Name && imageRepository(c.Image) != imageRepository(t.Image) {
				return leftJudgement{leaving: true, successor: true,
					why: fmt.Sprintf("its DaemonSet %s/%s runs %s instead of %s in container %s now", ns, owner.Name, t.Image, c.Image, c.Name)}, nil
			}
		}
	}
	return leftJudgement{why: "its DaemonSet " + ns + "/" + owner.Name + " starts a new agent here"}, nil
}

// imageRepository is an image reference without its tag and digest.
func imageRepository(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}

// Cleaner removes meshlet's host state (*netlinkx.Host is one).
type Cleaner interface {
	Cleanup(ctx context.Context, opts netlinkx.CleanupOptions) error
}

// Forgetter readies the WireGuard device for kg before the agent leaves
// (*wg.Manager is one: ForgetLearnedEndpoints).
type Forgetter interface {
	ForgetLearnedEndpoints(ctx context.Context) ([]string, error)
}

// Depart removes what the agent set up on a node that is left: its routes,
// rules and chains (and the WireGuard interface with deleteInterface), and
// its annotations, meshlet's leader mark among them — but for Kilo's own
// when another agent (kg) takes the node over: kg publishes the same key,
// WireGuard IP and endpoint again, and meanwhile the other nodes keep this
// one as their peer, its sessions and its location's leader unchanged. A device that stays
// (dev not nil) is first left as kg configures it where meshlet differs on
// purpose — roaming peers without the endpoints they taught it — so that kg,
// when it takes the node over (the way back), finds nothing to rewrite and
// keeps the sessions of the other peers (docs/dropin.md#the-way-back).
func (a *Agent) Depart(ctx context.Context, host Cleaner, dev Forgetter, deleteInterface bool) error {
	var errs []error
	if dev != nil && !deleteInterface {
		if _, err := dev.ForgetLearnedEndpoints(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := host.Cleanup(ctx, netlinkx.CleanupOptions{Interface: a.opts.Config.Interface, DeleteInterface: deleteInterface}); err != nil {
		errs = append(errs, err)
	}
	keepKilo := a.left != nil && a.left.successor
	if err := cluster.Unpublish(ctx, a.client, a.opts.Node, keepKilo); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// How long the agent, stopping, waits for its hand-over or its Lease's
// last renewal (well inside a pod's default 30 s termination grace).
const (
	handOverTimeout = 5 * time.Second
	suspendTimeout  = 3 * time.Second
)

// stopping decides, as the agent stops while this node holds its
// location's Lease, what becomes of it (docs/failover.md#restart): a node
// going away — its Node cordoned, being deleted or not Ready (the kubelet
// shutting the node down), or the agent's DaemonSet gone or no longer
// running here — hands it over at once: the planner steps it aside (the
// device role down first), the Lease is released and the next candidate
// takes it. Any other stop is a restart (a rolling update or a deleted pod
// brings the agent back on this node; the Lease's holder is the node, so
// the next process resumes it): the Lease is stretched to
// --leader-restart-grace so nobody takes it meanwhile.
func (a *Agent) stopping(ctx context.Context) {
	if a.elector == nil || !a.elector.Held() {
		return
	}
	log := a.opts.Log
	why := a.goingAway(ctx)
	if why == "" {
		grace := a.opts.Config.LeaseRestartGrace
		if grace <= 0 {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, suspendTimeout)
		defer cancel()
		ok, err := a.elector.Suspend(sctx, grace)
		switch {
		case err != nil:
			log.Warn("could not keep the location Lease for the restart: the next candidate takes it once it expires", "error", err)
		case ok:
			log.Info("keeping the location Lease for the agent that follows", "grace", grace)
		}
		return
	}
	log.Info("this node is going away: handing the location Lease over", "why", why)
	a.leaving.Store(&why)
	a.Loop.Notify(time.Time{})
	t := a.opts.Clock.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	deadline := a.opts.Clock.Now().Add(handOverTimeout)
	for a.elector.Held() {
		if !a.opts.Clock.Now().Before(deadline) {
			log.Warn("the location Lease was not handed over (no other candidate, or the API did not answer): it expires", "waited", handOverTimeout)
			return
		}
		<-t.C()
	}
}

// goingAway says why this node goes away ("" = it does not: a restart).
// The Node is read afresh (a list: kg's grants have no get on nodes): the
// kubelet marks it not Ready just before it stops the pods, and the watch
// may not have delivered that yet; the informer's copy when the API does
// not answer.
func (a *Agent) goingAway(ctx context.Context) string {
	lctx, cancel := context.WithTimeout(ctx, suspendTimeout)
	defer cancel()
	n := a.Local.SelfNode()
	if l, err := a.client.CoreV1().Nodes().List(lctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", a.opts.Node).String()}); err == nil && len(l.Items) == 1 {
		n = &l.Items[0]
	}
	if n != nil {
		switch {
		case n.DeletionTimestamp != nil:
			return "its Node is being deleted"
		case n.Spec.Unschedulable:
			return "its Node is cordoned"
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionFalse {
				return "its Node is not Ready (" + c.Reason + "): the node is shutting down or failing"
			}
		}
	}
	leaving, why := a.Leaving(lctx)
	if leaving {
		return why
	}
	return ""
}
