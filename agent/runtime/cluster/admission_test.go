package cluster

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestClassifyDryRun: only admission's answers make the dry run a refusal;
// every other error is a reason it could not be asked.
func TestClassifyDryRun(t *testing.T) {
	peers := schema.GroupResource{Group: "kilo.squat.ai", Resource: "peers"}
	denied := &apierrors.StatusError{}
	denied.ErrStatus.Status, denied.ErrStatus.Code = "Failure", http.StatusBadRequest
	denied.ErrStatus.Message = `admission webhook "peers.kilo.squat.ai" denied the request: the public key is not valid`
	tests := []struct {
		name    string
		err     error
		refused bool
		skipped string // a prefix; "" when not skipped
	}{
		{"admitted", nil, false, ""},
		{"a webhook's denial", denied, true, ""},
		{"a webhook that cannot be called, failurePolicy Fail",
			apierrors.NewInternalError(errors.New(`failed calling webhook "peers.kilo.squat.ai": failed to call webhook: Post "https://kilo-peer-validation.kube-system.svc:443/validate?timeout=10s": dial tcp 10.96.0.10:443: connect: connection refused`)),
			true, ""},
		{"a ValidatingAdmissionPolicy's denial",
			apierrors.NewForbidden(peers, "meshlet-diagnose-x7k2p", errors.New(`ValidatingAdmissionPolicy 'no-peers' with binding 'no-peers' denied request: failed expression: false`)),
			true, ""},
		{"RBAC: no create on Peers",
			apierrors.NewForbidden(peers, "", errors.New(`User "system:serviceaccount:kube-system:kilo" cannot create resource "peers" in API group "kilo.squat.ai" at the cluster scope`)),
			false, "no permission"},
		{"no CRD", apierrors.NewNotFound(peers, ""), false, "the Peer CRD"},
		{"timeout", apierrors.NewTimeoutError("request did not complete within 15s", 0), false, "the dry run got no answer from admission"},
		{"throttled", apierrors.NewTooManyRequests("too many requests", 1), false, "the dry run got no answer from admission"},
		{"an API server in trouble", apierrors.NewInternalError(errors.New("etcdserver: leader changed")), false, "the dry run got no answer from admission"},
		{"the connection", errors.New(`Post "https://127.0.0.1:6443/apis/kilo.squat.ai/v1alpha1/peers?dryRun=All": dial tcp 127.0.0.1:6443: connect: connection refused`), false, "the dry run got no answer from admission"},
		{"the installed CRD's schema", apierrors.NewInvalid(schema.GroupKind{Group: "kilo.squat.ai", Kind: "Peer"}, "x", nil), false, "the dry run got no answer from admission"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refused, skipped := classifyDryRun(tt.err)
			if refused != tt.refused || (tt.skipped == "") != (skipped == "") || !strings.HasPrefix(skipped, tt.skipped) {
				t.Errorf("refused %v, skipped %q; want %v, %q…", refused, skipped, tt.refused, tt.skipped)
			}
		})
	}
}
