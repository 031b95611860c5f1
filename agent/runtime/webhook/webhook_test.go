package webhook

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

func review(op, object string) string {
	return `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","operation":"` + op +
		`","name":"p","object":` + object + `}}`
}

func TestHandler(t *testing.T) {
	const good = `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},
"spec":{"allowedIPs":["10.5.0.1/32"],"publicKey":"GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=","persistentKeepalive":25}}`
	for _, tc := range []struct {
		name, contentType, body string
		code                    int
		allowed                 bool
		message                 string
	}{
		{"valid Peer", "application/json", review("CREATE", good), 200, true, ""},
		{"bad key", "application/json", review("UPDATE", strings.Replace(good, "GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=", "nope", 1)), 200, false, "publicKey"},
		{"no allowed IPs", "application/json", review("CREATE", strings.Replace(good, `"allowedIPs":["10.5.0.1/32"],`, "", 1)), 200, false, "allowedIPs"},
		{"delete", "application/json", review("DELETE", "null"), 200, true, ""},
		{"not a Peer", "application/json", review("CREATE", `"x"`), 200, false, "not a Peer"},
		{"wrong content type", "text/plain", review("CREATE", good), http.StatusUnsupportedMediaType, false, ""},
		{"not a review", "application/json", `{"kind":"Pod"}`, http.StatusBadRequest, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var counted string
			h := &Handler{Reviewed: func(op, resp string) { counted = op + " " + resp }}
			req := httptest.NewRequest(http.MethodPost, "/validate", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.contentType)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.code, rec.Body)
			}
			if tc.code != 200 {
				return
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || out.Response.UID != "u-1" {
				t.Fatalf("answer %s: %v", rec.Body, err)
			}
			if out.Response.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", out.Response.Allowed, tc.allowed, out.Response.Result)
			}
			if tc.message != "" && (out.Response.Result == nil || !strings.Contains(out.Response.Result.Message, tc.message)) {
				t.Errorf("message %+v lacks %q", out.Response.Result, tc.message)
			}
			if counted == "" {
				t.Error("not counted")
			}
		})
	}
}
