package webhook

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/meshlet/meshlet/agent/core/kilo"
)

// fuzzContentTypes are the Content-Types FuzzAdmissionReview sends: the
// API server's, and two the handler refuses.
var fuzzContentTypes = []string{"application/json", "application/json; charset=utf-8", "text/plain", ""}

// admissionCodecs decode as the API server does (apimachinery's JSON
// serializer: case-sensitive, the kind and version from the body).
var admissionCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := admissionv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s)
}()

// answer is what the handler answered one POST.
type answer struct {
	code     int
	review   *admissionv1.AdmissionReview // decoded by the API server's codec, on 200
	counted  string                       // "operation allowed|denied", or ""
	response []byte
}

// expectation is what the handler must answer a review the way it reads
// it (encoding/json: ValidatePeer on the Peer it decodes).
func expectation(review *admissionv1.AdmissionReview) (allowed bool, message string) {
	if review.Request.Operation == admissionv1.Delete {
		return true, ""
	}
	var peer kilo.Peer
	if err := json.Unmarshal(review.Request.Object.Raw, &peer); err != nil {
		return false, "the object is not a Peer"
	}
	rejs := kilo.ValidatePeer(&peer, "")
	var msgs []string
	for _, rj := range rejs {
		m := rj.Message
		if rj.Field != "" {
			m = rj.Field + ": " + m
		}
		msgs = append(msgs, m)
	}
	return len(rejs) == 0, strings.Join(msgs, "; ")
}

// FuzzAdmissionReview: the webhook's request body, POSTed over HTTPS to the
// handler as `meshlet webhook` serves it (whoever reaches the webhook's
// Service chooses the bytes; the API server sends an AdmissionReview).
// A body the handler reads as a v1 AdmissionReview with a request is
// answered 200 with a valid AdmissionReview (decoded by the API server's
// codec: the same apiVersion and kind, no request, the request's UID),
// allowed exactly when the operation is a DELETE or ValidatePeer finds
// nothing wrong with the object, denied with every rejection in the
// message, and counted once; any other body gets a 4xx and is not counted.
// The same review as the API server encodes it (its codec's reading of the
// body, re-encoded) gets the same answer.
//
//	go test -run='^$' -fuzz='^FuzzAdmissionReview$' -parallel=1 ./agent/runtime/webhook/
func FuzzAdmissionReview(f *testing.F) {
	const good = `{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":"laptop"},` +
		`"spec":{"allowedIPs":["10.5.0.1/32"],"publicKey":"GY5aT1N9dTR/nJnT1N2f4ClZWVj0jOAld0r8ysWLyjg=","persistentKeepalive":25}}`
	for _, b := range []string{
		review("CREATE", good),
		review("UPDATE", strings.Replace(good, `"persistentKeepalive":25`, `"persistentKeepalive":-1,"presharedKey":"x"`, 1)),
		review("DELETE", "null"),
		review("CREATE", `"x"`),
		`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}`,
		`{"kind":"Pod"}`,
	} {
		f.Add([]byte(b), uint8(0))
	}
	f.Add([]byte(review("CREATE", good)), uint8(2))

	var mu sync.Mutex
	var counted string
	h := &Handler{Reviewed: func(op, resp string) {
		mu.Lock()
		defer mu.Unlock()
		counted = op + " " + resp
	}}
	mux := http.NewServeMux()
	mux.Handle("/validate", h)
	srv := httptest.NewTLSServer(mux)
	defer srv.Close()
	client := srv.Client()
	post := func(t *testing.T, body []byte, contentType string) answer {
		t.Helper()
		mu.Lock()
		counted = ""
		mu.Unlock()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/validate", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		a := answer{code: resp.StatusCode, response: out}
		mu.Lock()
		a.counted = counted
		mu.Unlock()
		if a.code != http.StatusOK {
			return a
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("answered with Content-Type %q", ct)
		}
		obj, gvk, err := admissionCodecs.UniversalDeserializer().Decode(out, nil, nil)
		if err != nil {
			t.Fatalf("the answer %s is no AdmissionReview the API server reads: %v", out, err)
		}
		rev, ok := obj.(*admissionv1.AdmissionReview)
		if !ok || *gvk != admissionv1.SchemeGroupVersion.WithKind("AdmissionReview") {
			t.Fatalf("the answer is a %v %T", gvk, obj)
		}
		if rev.Request != nil || rev.Response == nil {
			t.Fatalf("the answer has a request or no response: %s", out)
		}
		a.review = rev
		return a
	}
	// check compares an answer with what the handler must answer the
	// review (nil: a body it cannot read as one).
	check := func(t *testing.T, a answer, review *admissionv1.AdmissionReview, contentType string) {
		t.Helper()
		switch {
		case !strings.HasPrefix(contentType, "application/json"):
			if a.code != http.StatusUnsupportedMediaType {
				t.Fatalf("Content-Type %q answered %d: %s", contentType, a.code, a.response)
			}
		case review == nil:
			if a.code != http.StatusBadRequest {
				t.Fatalf("a body that is no v1 AdmissionReview with a request answered %d: %s", a.code, a.response)
			}
		default:
			if a.code != http.StatusOK {
				t.Fatalf("a v1 AdmissionReview answered %d: %s", a.code, a.response)
			}
			resp := a.review.Response
			if resp.UID != review.Request.UID {
				t.Fatalf("answered UID %q, the request's is %q", resp.UID, review.Request.UID)
			}
			allowed, message := expectation(review)
			if resp.Allowed != allowed {
				t.Fatalf("allowed = %v, ValidatePeer says %v (%q): %s", resp.Allowed, allowed, message, a.response)
			}
			if !allowed && (resp.Result == nil || resp.Result.Message != message || message == "") {
				t.Fatalf("denied with %+v, want the message %q", resp.Result, message)
			}
			if allowed && resp.Result != nil {
				t.Fatalf("allowed with a result %+v", resp.Result)
			}
			verdict := map[bool]string{true: "allowed", false: "denied"}[allowed]
			if want := string(review.Request.Operation) + " " + verdict; a.counted != want {
				t.Fatalf("counted %q, want %q", a.counted, want)
			}
			return
		}
		if a.counted != "" {
			t.Fatalf("a refused body was counted: %q", a.counted)
		}
	}

	f.Fuzz(func(t *testing.T, body []byte, ct uint8) {
		contentType := fuzzContentTypes[int(ct)%len(fuzzContentTypes)]
		// The handler's reading: encoding/json, a request, v1.
		var review *admissionv1.AdmissionReview
		var r admissionv1.AdmissionReview
		if json.Unmarshal(body, &r) == nil && r.Request != nil &&
			r.APIVersion == admissionv1.SchemeGroupVersion.String() && r.Kind == "AdmissionReview" {
			review = &r
		}
		check(t, post(t, body, contentType), review, contentType)

		// The API server's reading of the same bytes, encoded as it sends
		// a review (the Peer in it too): the same answer, its UID.
		obj, gvk, err := admissionCodecs.UniversalDeserializer().Decode(body, nil, nil)
		canon, ok := obj.(*admissionv1.AdmissionReview)
		if err != nil || !ok || canon.Request == nil || *gvk != admissionv1.SchemeGroupVersion.WithKind("AdmissionReview") {
			return
		}
		// The kind and version as the codec read them (its decoding of the
		// fields themselves is case-sensitive: "ApiVersion" is not one).
		canon.SetGroupVersionKind(*gvk)
		var peer kilo.Peer
		if canon.Request.Object.Raw != nil && json.Unmarshal(canon.Request.Object.Raw, &peer) == nil {
			if canon.Request.Object.Raw, err = json.Marshal(&peer); err != nil {
				return // e.g. invalid UTF-8 the API server never stores
			}
		}
		sent, err := json.Marshal(canon)
		if err != nil {
			return
		}
		check(t, post(t, sent, "application/json"), canon, "application/json")
	})
}
