package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"

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
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, "", fmt.Errorf("a key for the dry-run Peer: %w", err)
	}
	peer := &kilo.Peer{
		TypeMeta:   metav1.TypeMeta{APIVersion: kilo.GroupName + "/v1alpha1", Kind: "Peer"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "meshlet-diagnose-"},
		// An address no mesh uses (the end of the shared address space).
		Spec: kilo.PeerSpec{AllowedIPs: []string{"100.127.255.254/32"}, PublicKey: base64.StdEncoding.EncodeToString(key)},
	}
	derr := kc.Post().Resource("peers").Param("dryRun", metav1.DryRunAll).Body(peer).Do(ctx).Error()
	switch {
	case derr == nil:
		return &diagnose.PeerAdmission{}, "", nil
	case apierrors.IsForbidden(derr) && !isAdmissionDenial(derr):
		return nil, "no permission to create Peers (a dry run needs create on peers.kilo.squat.ai)", nil
	case apierrors.IsNotFound(derr):
		return nil, "the Peer CRD is not installed", nil
	case ctx.Err() != nil:
		return nil, "", fmt.Errorf("dry-run Peer: %w", derr)
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

// isAdmissionDenial tells a webhook's denial (403 by default, with
// `admission webhook "name" denied the request`) from RBAC's 403
// ("User ... cannot create resource").
func isAdmissionDenial(err error) bool {
	return strings.Contains(err.Error(), "admission webhook")
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
