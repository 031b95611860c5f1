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
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/meshlet/meshlet/agent/runtime/cluster/kubeconfigtest"
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
func seedCA(tb testing.TB) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meshlet-e2e-ca"},
		NotBefore: time.Unix(1_700_000_000, 0), NotAfter: time.Unix(2_000_000_000, 0), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// FuzzRemoteConfig: a remote kubeconfig Secret's content is refused with a
// *KubeconfigError whose message quotes none of the kubeconfig's values
// (credentialValues), or turned into a client configuration that carries
// inline credentials only (no exec plugin unless allowed, no auth
// provider, no file path, no user info in a URL) for an https server; and
// client-go's own loader, given the same bytes, would talk to the same
// server with the same credentials (RemoteConfig does not read a different
// entry than the kubeconfig means).
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
		{[]string{"proxy-url: http://u:secret-in-proxy@10.0.0.1:3128"}, []string{"token: t"}, false},
		{nil, []string{"token: \"two words\""}, false},
	} {
		f.Add(kubeconfigWith("https://10.0.0.1:6443", ca, s.cluster, s.user), s.exec)
	}
	f.Add(kubeconfigWith("http://10.0.0.1:6443", "", nil, []string{"token: t"}), false)
	f.Add(kubeconfigWith("https://admin:secret-in-server@10.0.0.1:6443", ca, nil, []string{"token: t"}), false)
	f.Add(kubeconfigWith("https://10.0.0.1:6443/?token=secret-in-query", ca, nil, []string{"token: t"}), false)
	// Hostile shapes (kubeconfigtest.Hostiles: two users of one name with
	// inline credentials, aliases, malformed YAML, bad base64 and PEM).
	hs, err := kubeconfigtest.Hostiles("https://10.0.0.1:6443", []byte(ca))
	if err != nil {
		f.Fatal(err)
	}
	for _, h := range hs {
		if len(h.Kubeconfig) < 64<<10 {
			f.Add(h.Kubeconfig, false)
		}
	}
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
			for _, v := range credentialValues(data) {
				if strings.Contains(err.Error(), v) {
					t.Fatalf("refusal %q quotes the kubeconfig's value %q", err, v)
				}
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
		} else if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			t.Fatalf("host %q has user info, a query or a fragment", cfg.Host)
		}
		if cfg.Proxy != nil {
			p, err := cfg.Proxy(&http.Request{URL: &url.URL{Scheme: "https", Host: "x"}})
			if err != nil || p == nil || p.User != nil {
				t.Fatalf("proxy %v (%v): want one without user info", p, err)
			}
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

// credentialValues are the scalar values of data (as YAML) that a refusal
// must not quote: every string that looks like a credential or a URL (12
// bytes or more, letters and digits, no space: no run of a message's own
// text does) and is not also a name (names are quoted, to say which entry
// is refused); none if data is not YAML.
func credentialValues(data []byte) []string {
	var doc any
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	names := map[string]bool{}
	var values []string
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(k, x)
			}
		case []any:
			for _, x := range v {
				walk(key, x)
			}
		case string:
			switch key {
			case "name", "cluster", "user", "current-context":
				names[v] = true
			default:
				values = append(values, v)
			}
		}
	}
	walk("", doc)
	var out []string
	for _, v := range values {
		if len(v) >= 12 && !names[v] && !strings.ContainsAny(v, " \t\r\n") &&
			strings.ContainsAny(v, "0123456789") && strings.ContainsFunc(v, unicode.IsLetter) {
			out = append(out, v)
		}
	}
	return out
}
