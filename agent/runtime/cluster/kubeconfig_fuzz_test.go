package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshlet/meshlet/e2e/apiserver"
)

// Fuzz targets for the parsers of what a remote cluster hands over. Their
// seed corpus runs in plain `go test`; explore further with (one at a time)
//
//	go test -run='^$' -fuzz='^FuzzRemoteConfig$' -parallel=1 ./agent/runtime/cluster/
//
// (docs/security.md#fuzzing has each target's command and figures).

// seedCA is a self-signed CA certificate in PEM, like the e2e API
// servers' certificate-authority-data.
func seedCA(f *testing.F) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meshlet-e2e-ca"},
		NotBefore: time.Unix(1_700_000_000, 0), NotAfter: time.Unix(2_000_000_000, 0), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		f.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// FuzzRemoteConfig: a remote kubeconfig Secret's content is refused with a
// *KubeconfigError or turned into a client configuration that carries
// inline credentials only (no exec plugin unless allowed, no auth
// provider, no file path) for an https server; and client-go's own loader,
// given the same bytes, would talk to the same server with the same
// credentials (RemoteConfig does not read a different entry than the
// kubeconfig means).
func FuzzRemoteConfig(f *testing.F) {
	ca := string(seedCA(f))
	// The remote kubeconfig Secrets of the e2e runs (e2e/harness/cluster.go:
	// a ServiceAccount token for https://127.0.0.1:<port> and the CA).
	for _, name := range []string{"cluster-a", "cluster-b"} {
		kc, err := apiserver.Kubeconfig(&rest.Config{Host: "https://127.0.0.1:36443",
			BearerToken:     "eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a2lsby1zeXN0ZW06bWVzaGxldC1yZW1vdGUifQ.c2ln",
			TLSClientConfig: rest.TLSClientConfig{CAData: []byte(ca)}}, name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(kc, false)
	}
	// The shapes the unit tests use: each allowed field, each refused one.
	for _, s := range []struct {
		cluster, user []string
		exec          bool
	}{
		{nil, []string{"token: tok-123"}, false},
		{[]string{"tls-server-name: example.com", "proxy-url: socks5://10.0.0.1:1080", "insecure-skip-tls-verify: true"}, []string{"token: t"}, false},
		{nil, []string{"client-certificate-data: " + b64(ca), "client-key-data: " + b64("key")}, false},
		{nil, []string{"exec:", "  apiVersion: client.authentication.k8s.io/v1", "  command: /bin/true", "  args: [\"x\"]"}, true},
		{nil, []string{"exec:", "  apiVersion: client.authentication.k8s.io/v1", "  command: /bin/true"}, false},
		{nil, []string{"auth-provider:", "  name: oidc", "  config: {idp-issuer-url: https://x}"}, false},
		{nil, []string{"tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"}, false},
		{nil, []string{"client-certificate: /etc/kilo/key", "client-key: /etc/kilo/key"}, false},
		{[]string{"certificate-authority: /etc/kubernetes/pki/ca.crt"}, []string{"token: t"}, false},
		{nil, []string{"username: u", "password: p"}, false},
		{nil, []string{"as: admin", "as-groups: [system:masters]"}, false},
		{[]string{"proxy-url: file:///etc/passwd"}, []string{"token: t"}, false},
	} {
		f.Add(kubeconfigWith("https://10.0.0.1:6443", ca, s.cluster, s.user), s.exec)
	}
	f.Add(kubeconfigWith("http://10.0.0.1:6443", "", nil, []string{"token: t"}), false)
	f.Add([]byte(`{"apiVersion":"v1","kind":"Config","current-context":"c","contexts":[{"name":"c","context":{"cluster":"k","user":"u"}}],`+
		`"clusters":[{"name":"k","cluster":{"server":"https://h"}}],"users":[{"name":"u","user":{"token":"t"}}]}`), false)
	f.Add([]byte("apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: 'https://[::1]:1'}\n"), false)
	f.Fuzz(func(t *testing.T, data []byte, allowExec bool) {
		policy := KubeconfigPolicy{AllowExec: allowExec}
		cfg, err := RemoteConfig(data, policy)
		if err != nil {
			var ke *KubeconfigError
			if !errors.As(err, &ke) || cfg != nil || ke.Reason == "" || ke.Error() == "" {
				t.Fatalf("refusal %T %v with config %v", err, err, cfg)
			}
			return
		}
		if cfg.ExecProvider != nil && !allowExec {
			t.Fatal("exec plugin accepted without the policy")
		}
		if cfg.AuthProvider != nil || cfg.BearerTokenFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" || cfg.CAFile != "" {
			t.Fatalf("accepted a provider or a path: %+v", cfg)
		}
		if cfg.Username != "" || cfg.Password != "" || cfg.Impersonate.UserName != "" || len(cfg.Impersonate.Groups) > 0 {
			t.Fatalf("accepted basic auth or impersonation: %+v", cfg)
		}
		if u, err := url.Parse(cfg.Host); err != nil || u.Scheme != "https" || u.Host == "" {
			t.Fatalf("host %q is not https", cfg.Host)
		}
		if len(cfg.CertData) > 0 != (len(cfg.KeyData) > 0) {
			t.Fatal("a client certificate without its key")
		}
		// client-go's loader on the same bytes (it does not run an exec
		// plugin before a request; the accepted config names no file).
		kc, err := clientcmd.Load(data)
		if err != nil {
			t.Fatalf("accepted what clientcmd cannot load: %v", err)
		}
		want, err := clientcmd.NewDefaultClientConfig(*kc, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			// The loader is stricter in places (e.g. it validates the
			// exec plugin's apiVersion): RemoteConfig may accept more, never
			// a different server or credential.
			return
		}
		if want.Host != cfg.Host && "https://"+want.Host != cfg.Host && want.Host != cfg.Host+"/" {
			t.Fatalf("host %q, client-go's loader %q", cfg.Host, want.Host)
		}
		if want.BearerToken != cfg.BearerToken || string(want.CAData) != string(cfg.CAData) || string(want.CertData) != string(cfg.CertData) ||
			string(want.KeyData) != string(cfg.KeyData) || want.ServerName != cfg.ServerName || want.Insecure != cfg.Insecure {
			t.Fatalf("credentials differ from client-go's loader:\n ours %+v\n   cg %+v", cfg, want)
		}
		if want.BearerTokenFile != "" || want.CAFile != "" || want.CertFile != "" || want.KeyFile != "" || want.AuthProvider != nil {
			t.Fatalf("client-go's loader reads a file or plugin RemoteConfig did not see: %+v", want)
		}
		if (want.ExecProvider != nil) != (cfg.ExecProvider != nil) {
			t.Fatalf("exec plugin: ours %v, client-go's loader %v", cfg.ExecProvider, want.ExecProvider)
		}
	})
}
