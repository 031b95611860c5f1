package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/kilo"
)

// PeerAdmission asks the API server whether it accepts a valid Peer: a
// server-side dry run of creating one (dryRun=All calls the validating
// webhooks and stores nothing). When it is refused, the validating
// webhooks whose rules match Peers are listed as evidence. skipped says
// why the question could not be asked (no CRD, no permission to create
// Peers); the answer is then nil.
func PeerAdmission(ctx context.Context, cfg *rest.Config) (answer *diagnose.PeerAdmission, skipped string, err error) {
	kc, err := KiloClient(cfg)
	if err != nil {
		return nil, "", err
	}
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return nil, "", fmt.Errorf("a key for the dry-run Peer: %w", err)
	}
	peer := &kilo.Peer{
		TypeMeta:   metav1.TypeMeta{APIVersion: kilo.GroupName + "/v1alpha1", Kind: "Peer"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "meshlet-diagnose-"},
		// An address no mesh uses (the end of the shared address space).
		Spec: kilo.PeerSpec{AllowedIPs: []string{"100.127.255.254/32"}, PublicKey: key.PublicKey().String()},
	}
	derr := kc.Post().Resource("peers").Param("dryRun", metav1.DryRunAll).Body(peer).Do(ctx).Error()
	if ctx.Err() != nil {
		return nil, "", fmt.Errorf("dry-run Peer: %w", derr)
	}
	refused, skipped := classifyDryRun(derr)
	if !refused {
		if skipped != "" {
			return nil, skipped, nil
		}
		return &diagnose.PeerAdmission{}, "", nil
	}
	a := &diagnose.PeerAdmission{Err: derr.Error()}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return a, "", nil
	}
	list, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return a, "", nil // the evidence says none could be listed
	}
	for _, c := range list.Items {
		for _, w := range c.Webhooks {
			if matchesPeers(w.Rules) {
				a.Webhooks = append(a.Webhooks, c.Name+"/"+w.Name)
			}
		}
	}
	return a, "", nil
}

// classifyDryRun reads the dry run's answer: refused only when admission
// answered it — a webhook's denial (`admission webhook "name" denied the
// request`, any status), a webhook that could not be called under
// failurePolicy Fail (`failed calling webhook "name"`), or a
// ValidatingAdmissionPolicy's denial. Any other error (RBAC's 403, no CRD,
// a timeout, throttling, an API server in trouble) says nothing about
// admission: skipped says why, and the answer is not a finding.
func classifyDryRun(err error) (refused bool, skipped string) {
	if err == nil {
		return false, ""
	}
	switch msg := err.Error(); {
	case isAdmissionAnswer(msg):
		return true, ""
	case apierrors.IsForbidden(err):
		return false, "no permission to create Peers (a dry run needs create on peers.kilo.squat.ai)"
	case apierrors.IsNotFound(err):
		return false, "the Peer CRD is not installed"
	default:
		return false, "the dry run got no answer from admission: " + msg
	}
}

// isAdmissionAnswer reports whether an API error came from admission (the
// API server's own wording for webhooks and ValidatingAdmissionPolicies).
func isAdmissionAnswer(msg string) bool {
	return strings.Contains(msg, "admission webhook \"") || strings.Contains(msg, "failed calling webhook") ||
		strings.Contains(msg, "ValidatingAdmissionPolicy")
}

// matchesPeers reports whether a webhook's rules match creating Peers.
func matchesPeers(rules []admissionv1.RuleWithOperations) bool {
	for _, r := range rules {
		group := slices.Contains(r.APIGroups, kilo.GroupName) || slices.Contains(r.APIGroups, "*")
		res := slices.Contains(r.Resources, "peers") || slices.Contains(r.Resources, "*")
		op := slices.Contains(r.Operations, admissionv1.Create) || slices.Contains(r.Operations, admissionv1.OperationAll)
		if group && res && op {
			return true
		}
	}
	return false
}
