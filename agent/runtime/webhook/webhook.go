// Package webhook is kg's Peer validation webhook (`kg webhook`, Kilo's
// peer-validation manifest): an HTTPS admission endpoint that refuses a
// Peer meshlet would reject, with the rejections as the message, so a
// manifest of Kilo's that runs kg's image for it runs meshlet's unchanged.
package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshlet/meshlet/agent/core/kilo"
)

// MaxBody bounds an AdmissionReview (the API server sends at most 3 MiB).
const MaxBody = 3 << 20

// Handler validates Peers in AdmissionReview requests.
type Handler struct {
	Log *slog.Logger
	// Reviewed counts the answers by operation and allowed/denied.
	Reviewed func(operation, response string)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		http.Error(w, fmt.Sprintf("Content-Type %q, want application/json", ct), http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil || len(body) > MaxBody {
		http.Error(w, "request body unreadable or too large", http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "not an AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		http.Error(w, "only admission.k8s.io/v1 AdmissionReview is supported", http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	var peer kilo.Peer
	switch {
	case review.Request.Operation == admissionv1.Delete:
		// Deleting a Peer is always fine.
	case json.Unmarshal(review.Request.Object.Raw, &peer) != nil:
		resp.Allowed, resp.Result = false, &metav1.Status{Message: "the object is not a Peer"}
	default:
		if rejs := kilo.ValidatePeer(&peer, ""); len(rejs) > 0 {
			var msgs []string
			for _, rj := range rejs {
				m := rj.Message
				if rj.Field != "" {
					m = rj.Field + ": " + m
				}
				msgs = append(msgs, m)
			}
			resp.Allowed, resp.Result = false, &metav1.Status{Message: strings.Join(msgs, "; ")}
		}
	}
	result := "allowed"
	if !resp.Allowed {
		result = "denied"
	}
	if h.Reviewed != nil {
		h.Reviewed(string(review.Request.Operation), result)
	}
	if h.Log != nil {
		h.Log.Debug("reviewed a Peer", "peer", review.Request.Name, "operation", review.Request.Operation, "response", result)
	}
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
