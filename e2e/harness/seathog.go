package harness

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// HogUser is the user a SeatHog's requests come from.
const HogUser = "meshlet-e2e-seat-hog"

// hogLabel marks the ConfigMaps the hog creates; the webhook matches
// only them.
const hogLabel = "meshlet-e2e/seat-hog"

// SeatHog keeps one request of a Flow's priority level executing: it
// creates ConfigMaps as HogUser, and a validating admission webhook (an
// HTTPS server in the test process) holds each create until the hog is
// released. APF counts the seat from dispatch to the end of the request,
// admission included, so while one is held a level of 0 seats refuses
// every other request of its flow with HTTP 429 — which a level of 0
// seats with nothing executing does not do (docs/failover.md#shedding).
type SeatHog struct {
	srv     *httptest.Server
	release chan struct{}
	once    sync.Once
	done    chan struct{}
	held    atomic.Int64
	holding atomic.Int64
}

// hookName is the webhook configuration's name.
const hookName = "meshlet-e2e-seat-hog"

// hogSchema is the FlowSchema that puts a SeatHog's requests into the
// flow's level: a schema of its own, so the flow's counts stay the
// ServiceAccount's.
func (f *Flow) hogSchema() string { return f.Name + "-seat-hog" }

// Hog starts a seat hog in the flow's priority level. Held tells when a
// request is held; Release lets it through and stops the hog.
func (f *Flow) Hog(ctx context.Context) (*SeatHog, error) {
	c := f.c
	if err := f.schema(ctx, f.hogSchema(), flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: HogUser}}); err != nil {
		return nil, err
	}
	h := &SeatHog{release: make(chan struct{}), done: make(chan struct{})}
	h.srv = httptest.NewUnstartedServer(http.HandlerFunc(h.admit))
	h.srv.StartTLS()
	c.env.onClose(h.srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.srv.Certificate().Raw})
	url := h.srv.URL + "/validate"
	ignore := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(30)
	hook := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: hookName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "seat-hog.meshlet-e2e.test",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{hogLabel: "true"}},
			FailurePolicy:           &ignore,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}}}
	adm := c.Admin.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := adm.Create(ctx, hook, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("cluster %s: seat hog webhook: %w", c.Name, err)
	}
	c.env.onClose(func() { _ = adm.Delete(context.Background(), hookName, metav1.DeleteOptions{}) })
	rb := c.Admin.RbacV1()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: hookName, Namespace: Namespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}}}}
	if _, err := rb.Roles(Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("cluster %s: seat hog role: %w", c.Name, err)
	}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: hookName, Namespace: Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: hookName},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: HogUser}}}
	if _, err := rb.RoleBindings(Namespace).Create(ctx, bind, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("cluster %s: seat hog role binding: %w", c.Name, err)
	}
	cfg := rest.CopyConfig(c.RestConfig())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: HogUser}
	cfg.QPS, cfg.Burst = -1, 0 // its own pace: one create at a time
	cfg.Timeout = 40 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	go h.run(ctx, cs)
	return h, nil
}

// admit holds a create until the hog is released or the API server
// gives up on the webhook, then allows it.
func (h *SeatHog) admit(w http.ResponseWriter, r *http.Request) {
	var rev admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&rev); err != nil || rev.Request == nil {
		http.Error(w, "bad admission review", http.StatusBadRequest)
		return
	}
	h.held.Add(1)
	h.holding.Add(1)
	select {
	case <-h.release:
	case <-r.Context().Done():
	case <-time.After(28 * time.Second): // inside the webhook's 30 s
	}
	h.holding.Add(-1)
	rev.Response = &admissionv1.AdmissionResponse{UID: rev.Request.UID, Allowed: true}
	rev.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rev)
}

// run creates ConfigMaps one after another until released; a create
// refused (the level full: a request of its flow executes) is tried
// again after 5 ms, so the seat is taken back as soon as it is free.
func (h *SeatHog) run(ctx context.Context, cs kubernetes.Interface) {
	defer close(h.done)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "seat-hog-", Labels: map[string]string{hogLabel: "true"}}}
	for {
		select {
		case <-h.release:
			return
		case <-ctx.Done():
			return
		default:
		}
		// No client-side retry: client-go would wait the 429's
		// Retry-After, leaving the seat to the flow's other requests.
		err := cs.CoreV1().RESTClient().Post().Namespace(Namespace).Resource("configmaps").Body(cm).MaxRetries(0).Do(ctx).Error()
		if err != nil {
			t := time.NewTimer(5 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// Held is how many creates the webhook has held so far.
func (h *SeatHog) Held() int64 { return h.held.Load() }

// Holding is whether a create is held now.
func (h *SeatHog) Holding() bool { return h.holding.Load() > 0 }

// Release lets the held create through and stops the hog.
func (h *SeatHog) Release(ctx context.Context) error {
	h.once.Do(func() { close(h.release) })
	select {
	case <-h.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
