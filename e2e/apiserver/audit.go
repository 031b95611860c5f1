package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ByMeshlet matches meshlet's requests: its user agents start with
// "meshlet" (meshlet/VERSION, meshlet-remote).
func ByMeshlet(_, userAgent string) bool { return strings.HasPrefix(userAgent, "meshlet") }

// Forbidden returns the requests of ServiceAccounts that the API server
// refused with 403 and that match (by user name and user agent), from its
// audit log: "time user verb URI (agent)" each, but those made while the
// server restarted (from Stop to 2 s after Start found it ready: RBAC
// refuses requests until its caches filled). A test that runs meshlet with exactly the shipped RBAC
// asserts there are none from meshlet.
func (s *Server) Forbidden(match func(user, userAgent string) bool) ([]string, error) {
	s.mu.Lock()
	restarts := append([][2]time.Time(nil), s.restarts...)
	s.mu.Unlock()
	restarting := func(at time.Time) bool {
		for _, w := range restarts {
			if !at.Before(w[0]) && (w[1].IsZero() || !at.After(w[1].Add(2*time.Second))) {
				return true
			}
		}
		return false
	}
	f, err := os.Open(s.path("audit.log"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev struct {
			Verb       string    `json:"verb"`
			RequestURI string    `json:"requestURI"`
			UserAgent  string    `json:"userAgent"`
			Stage      time.Time `json:"stageTimestamp"`
			User       struct {
				Username string `json:"username"`
			} `json:"user"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // a line cut by a restart
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code == 403 && match(ev.User.Username, ev.UserAgent) && !restarting(ev.Stage) {
			out = append(out, fmt.Sprintf("%s %s %s %s (%s)", ev.Stage.Format(time.RFC3339Nano), ev.User.Username, ev.Verb, ev.RequestURI, ev.UserAgent))
		}
	}
	return out, sc.Err()
}

// WaitAuthorized waits until cfg's user may do verb on resource (group,
// namespace as in RBAC; "" for core and cluster scope), polling a
// SelfSubjectAccessReview: RBAC grants take effect through the
// authorizer's informer, a moment after they are applied, and a test
// that asserts "no request refused" starts its agent only then.
func WaitAuthorized(ctx context.Context, cfg *rest.Config, checks ...authorizationv1.ResourceAttributes) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range checks {
		for {
			r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &c}}, metav1.CreateOptions{})
			if err == nil && r.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s %s/%s in %q never allowed (%v)", c.Verb, c.Group, c.Resource, c.Namespace, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond): // poll interval
			}
		}
	}
	return nil
}

// AgentGrants are requests meshlet's agent makes with manifests/base's
// RBAC, RemoteGrants those of its remote credentials (manifests/remote):
// what WaitAuthorized waits for before an agent starts. The base grants no
// Secret: a test that names kubeconfig Secrets grants and waits for them.
func AgentGrants(namespace string) []authorizationv1.ResourceAttributes {
	return []authorizationv1.ResourceAttributes{
		{Verb: "watch", Resource: "nodes"}, {Verb: "patch", Resource: "nodes"},
		{Verb: "watch", Group: "kilo.squat.ai", Resource: "peers"},
		{Verb: "watch", Group: "kilo.squat.ai", Resource: "clustermeshes", Namespace: namespace},
		{Verb: "patch", Group: "kilo.squat.ai", Resource: "clustermeshes", Subresource: "status", Namespace: namespace},
		{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: namespace},
		{Verb: "create", Resource: "events", Namespace: "default"},
		{Verb: "get", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	}
}

// RemoteGrants: see AgentGrants.
func RemoteGrants() []authorizationv1.ResourceAttributes {
	return []authorizationv1.ResourceAttributes{
		{Verb: "watch", Resource: "nodes"}, {Verb: "watch", Group: "kilo.squat.ai", Resource: "peers"},
	}
}
