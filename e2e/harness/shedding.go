package harness

import (
	"bytes"
	"context"
	"fmt"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

// Flow is an API Priority and Fairness flow of one ServiceAccount's
// requests to a cluster's API server: a FlowSchema matching only it, and
// its own priority level. It counts that account's requests (the API
// server's apiserver_flowcontrol_* series by flow schema). A level with
// no seats refuses with HTTP 429 only requests that arrive while another
// of its requests executes: a SeatHog's (docs/failover.md#shedding).
type Flow struct {
	c    *Cluster
	Name string
}

// NewFlow makes a flow for ServiceAccount namespace/sa of cluster c, with
// shares seats, the FlowSchema ahead of the built-in ones. (A level of 0
// seats still serves a request while none of its own executes:
// docs/failover.md#shedding.)
func (c *Cluster) NewFlow(ctx context.Context, name, namespace, sa string, shares int32) (*Flow, error) {
	f := &Flow{c: c, Name: name}
	return f, f.Set(ctx, namespace, sa, shares)
}

// Set creates or changes the flow's priority level to shares seats.
func (f *Flow) Set(ctx context.Context, namespace, sa string, shares int32) error {
	fc := f.c.Admin.FlowcontrolV1()
	zero := int32(0)
	plc := &flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: f.Name},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{NominalConcurrencyShares: &shares,
				LendablePercent: &zero, BorrowingLimitPercent: &zero,
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}}
	cur, err := fc.PriorityLevelConfigurations().Get(ctx, f.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = fc.PriorityLevelConfigurations().Create(ctx, plc, metav1.CreateOptions{})
	case err == nil:
		cur.Spec = plc.Spec
		_, err = fc.PriorityLevelConfigurations().Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("cluster %s: priority level %s: %w", f.c.Name, f.Name, err)
	}
	return f.schema(ctx, f.Name, flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
		ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: sa}})
}

// schema makes a FlowSchema name (unless it exists) that puts every
// request of subject into the flow's priority level.
func (f *Flow) schema(ctx context.Context, name string, subject flowcontrolv1.Subject) error {
	fc := f.c.Admin.FlowcontrolV1()
	all := []string{"*"}
	fs := &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: f.Name},
			// Ahead of every built-in schema but exempt (1 is reserved for
			// it): "probes" (2, /readyz) loses the tie by name.
			MatchingPrecedence: 2, DistinguisherMethod: &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects:         []flowcontrolv1.Subject{subject},
				ResourceRules:    []flowcontrolv1.ResourcePolicyRule{{Verbs: all, APIGroups: all, Resources: all, ClusterScope: true, Namespaces: all}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: all, NonResourceURLs: all}},
			}}}}
	if _, err := fc.FlowSchemas().Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := fc.FlowSchemas().Create(ctx, fs, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("cluster %s: flow schema %s: %w", f.c.Name, name, err)
		}
	}
	return nil
}

// FlowCounts are an API server's counters of one flow schema.
type FlowCounts struct {
	Dispatched, Rejected float64
}

// Total is every request of the flow, served or not.
func (c FlowCounts) Total() float64 { return c.Dispatched + c.Rejected }

// Sub is c minus an earlier b.
func (c FlowCounts) Sub(b FlowCounts) FlowCounts {
	return FlowCounts{Dispatched: c.Dispatched - b.Dispatched, Rejected: c.Rejected - b.Rejected}
}

// Counts reads the flow's apiserver_flowcontrol_dispatched_requests_total
// and apiserver_flowcontrol_rejected_requests_total from the API server's
// /metrics (as its admin: the admin's own requests are in another flow).
func (f *Flow) Counts(ctx context.Context) (FlowCounts, error) {
	raw, err := f.c.Admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return FlowCounts{}, fmt.Errorf("cluster %s: /metrics: %w", f.c.Name, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return FlowCounts{}, fmt.Errorf("cluster %s: parsing /metrics: %w", f.c.Name, err)
	}
	var out FlowCounts
	for name, v := range map[string]*float64{
		"apiserver_flowcontrol_dispatched_requests_total": &out.Dispatched,
		"apiserver_flowcontrol_rejected_requests_total":   &out.Rejected,
	} {
		fam := fams[name]
		if fam == nil {
			continue
		}
		for _, m := range fam.Metric {
			for _, l := range m.Label {
				if l.GetName() == "flow_schema" && l.GetValue() == f.Name {
					*v += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}

// Delete removes the flow: the account's requests go back to the
// built-in flow schemas.
func (f *Flow) Delete(ctx context.Context) error {
	fc := f.c.Admin.FlowcontrolV1()
	for _, name := range []string{f.Name, f.hogSchema()} {
		if err := fc.FlowSchemas().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster %s: deleting flow schema %s: %w", f.c.Name, name, err)
		}
	}
	if err := fc.PriorityLevelConfigurations().Delete(ctx, f.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster %s: deleting priority level %s: %w", f.c.Name, f.Name, err)
	}
	return nil
}

// SlowView is a delay line to a cluster's API server (a slow link or an
// API server answering slowly).
type SlowView = apiserver.DelayLine

// SlowView serves cluster c's API to the nodes at another address,
// through a SlowView, and returns a kubeconfig of c's read-only remote
// credentials that goes through it (the serving certificate is for
// 127.0.0.1, which the proxy's address is too).
func (c *Cluster) SlowView(ctx context.Context) (*SlowView, []byte, error) {
	e := c.env
	cfg, err := clientcmd.Load(c.RemoteKubeconfig)
	if err != nil {
		return nil, nil, err
	}
	v, err := apiserver.NewDelayLine(ctx, "127.0.0.1:"+c.APIPort())
	if err != nil {
		return nil, nil, err
	}
	e.onClose(func() { _ = v.Close() })
	for _, n := range e.Nodes() {
		if err := e.forwardInto(n.NS, v.Addr()); err != nil {
			return nil, nil, err
		}
	}
	for _, cl := range cfg.Clusters {
		cl.Server = "https://" + v.Addr()
	}
	kc, err := clientcmd.Write(*cfg)
	return v, kc, err
}

// Readyz is the agent's /readyz: its status code and body.
func (n *Node) Readyz(ctx context.Context) (int, []byte, error) { return n.get(ctx, "/readyz") }
