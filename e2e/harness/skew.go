package harness

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// SkewedView serves cluster c's API to the other clusters as if c's clocks
// ran offset from this machine's: every Node's kilo.squat.ai/last-seen is
// shifted by offset in what the API returns (gets, lists, watch events).
// It fakes the input, not a clock: c's own agents and their last-seen are
// untouched, only what another cluster reads of them. It returns a
// kubeconfig with c's read-only remote credentials that goes through the
// view; the view is reachable at the same address inside every node.
func (c *Cluster) SkewedView(ctx context.Context, offset time.Duration) ([]byte, error) {
	e := c.env
	remote, err := clientcmd.RESTConfigFromKubeConfig(c.RemoteKubeconfig)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(c.Server.URL())
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.Server.CAData())
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			// JSON, uncompressed: the view rewrites it.
			pr.Out.Header.Set("Accept", "application/json")
			pr.Out.Header.Set("Accept-Encoding", "identity")
		},
		Transport:      &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: false, DisableCompression: true},
		FlushInterval:  -1,
		ModifyResponse: func(r *http.Response) error { return shiftLastSeen(r, offset) },
	}
	caPEM, cert, err := selfSignedServing()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}}
	go func() { _ = srv.Serve(tls.NewListener(l, srv.TLSConfig)) }()
	e.onClose(func() { _ = srv.Close() })
	addr := l.Addr().String()
	for _, n := range e.Nodes() {
		if err := e.forwardInto(n.NS, addr); err != nil {
			return nil, err
		}
	}
	cfg := &rest.Config{Host: "https://" + addr, BearerToken: remote.BearerToken, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}}
	return apiserver.Kubeconfig(cfg, c.Name)
}

// shiftLastSeen rewrites the Nodes in a response: one Node, a NodeList, or
// a watch stream of events.
func shiftLastSeen(r *http.Response, offset time.Duration) error {
	if !strings.HasPrefix(r.Request.URL.Path, "/api/v1/nodes") || !strings.Contains(r.Header.Get("Content-Type"), "json") {
		return nil
	}
	q := r.Request.URL.Query()
	if w := q.Get("watch"); w == "true" || w == "1" {
		in := r.Body
		pr, pw := io.Pipe()
		go func() {
			dec := json.NewDecoder(in)
			enc := json.NewEncoder(pw)
			for {
				var ev map[string]any
				if err := dec.Decode(&ev); err != nil {
					in.Close()
					pw.CloseWithError(err)
					return
				}
				if o, ok := ev["object"].(map[string]any); ok {
					shiftNode(o, offset)
				}
				if err := enc.Encode(ev); err != nil {
					in.Close()
					return
				}
			}
		}()
		r.Body = pr
		r.Header.Del("Content-Length")
		r.ContentLength = -1
		return nil
	}
	b, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return err
	}
	var o map[string]any
	if json.Unmarshal(b, &o) == nil {
		switch o["kind"] {
		case "Node":
			shiftNode(o, offset)
		case "NodeList":
			items, _ := o["items"].([]any)
			for _, it := range items {
				if n, ok := it.(map[string]any); ok {
					shiftNode(n, offset)
				}
			}
		}
		if nb, err := json.Marshal(o); err == nil {
			b = nb
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return nil
}

func shiftNode(o map[string]any, offset time.Duration) {
	md, _ := o["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	s, _ := ann[topology.AnnotationLastSeen].(string)
	if sec, err := strconv.ParseInt(s, 10, 64); err == nil {
		ann[topology.AnnotationLastSeen] = strconv.FormatInt(sec+int64(offset/time.Second), 10)
	}
}

// selfSignedServing makes a CA and a serving certificate for 127.0.0.1.
func selfSignedServing() ([]byte, tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "meshlet-e2e-skewed-view"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	if err != nil {
		return nil, tls.Certificate{}, errors.Join(errors.New("serving certificate"), err)
	}
	return certPEM, cert, nil
}

// SetKubeconfigSecret replaces the kubeconfig Secret of remote cluster
// name in c (meshlet reloads it live).
func (c *Cluster) SetKubeconfigSecret(ctx context.Context, name string, kubeconfig []byte) error {
	s, err := c.Admin.CoreV1().Secrets(Namespace).Get(ctx, SecretName(name), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	s.Data = map[string][]byte{"kubeconfig": kubeconfig}
	if _, err := c.Admin.CoreV1().Secrets(Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	return nil
}
