package cluster

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// hostileServer is a TLS API server stand-in that records the
// Authorization header of every request.
type hostileServer struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newHostileServer(t *testing.T) *hostileServer {
	s := &hostileServer{}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.auths = append(s.auths, r.Header.Get("Authorization"))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[]}`))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *hostileServer) caData() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}))
}

func (s *hostileServer) sawAuth(sub string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.auths {
		if strings.Contains(a, sub) {
			return true
		}
	}
	return false
}

// kubeconfigWith renders a one-context kubeconfig whose user has the
// given YAML lines (indented under user:).
func kubeconfigWith(server, ca string, cluster, user []string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Config\ncurrent-context: remote\nclusters:\n- name: remote\n  cluster:\n    server: %s\n", server)
	if ca != "" {
		fmt.Fprintf(&b, "    certificate-authority-data: %s\n", b64(ca))
	}
	for _, l := range cluster {
		b.WriteString("    " + l + "\n")
	}
	b.WriteString("users:\n- name: remote\n  user:\n")
	for _, l := range user {
		b.WriteString("    " + l + "\n")
	}
	b.WriteString("contexts:\n- name: remote\n  context:\n    cluster: remote\n    user: remote\n")
	return []byte(b.String())
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestRemoteConfigRefusesCodeAndPaths: every kubeconfig entry that would
// run a command or read a file is refused with the field named, and
// nothing runs, nothing is read; the control (client-go's own loader on
// the same bytes) shows each hostile entry does what it says, so the test
// can fail.
func TestRemoteConfigRefusesCodeAndPaths(t *testing.T) {
	srv := newHostileServer(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	const secret = "c2VjcmV0LXdpcmVndWFyZC1rZXktbWF0ZXJpYWw=" // stands for a node's private key
	if err := os.WriteFile(key, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "marker")
	exec := []string{"exec:", "  apiVersion: client.authentication.k8s.io/v1", "  command: /bin/sh",
		"  args: [\"-c\", \"touch " + marker + "; echo '{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{\\\"token\\\":\\\"from-exec\\\"}}'\"]",
		"  interactiveMode: Never"}
	cases := []struct {
		name    string
		cluster []string
		user    []string
		field   string
		// leaks: what client-go's own loader sends or does with this
		// kubeconfig (the control); "" for entries it only reads.
		leaks func() bool
	}{
		{name: "exec", user: exec, field: `users["remote"].user.exec`,
			leaks: func() bool { _, err := os.Stat(marker); return err == nil }},
		{name: "tokenFile", user: []string{"tokenFile: " + key}, field: `users["remote"].user.tokenFile`,
			leaks: func() bool { return srv.sawAuth(secret) }},
		{name: "client-certificate path", user: []string{"client-certificate: " + key, "client-key: " + key}, field: `users["remote"].user.client-certificate`},
		{name: "client-key path", user: []string{"client-certificate-data: " + b64("x"), "client-key: " + key}, field: `users["remote"].user.client-key`},
		{name: "certificate-authority path", cluster: []string{"certificate-authority: " + key}, user: []string{"token: t"}, field: `clusters["remote"].cluster.certificate-authority`},
		{name: "auth-provider", user: []string{"auth-provider:", "  name: oidc", "  config: {idp-issuer-url: https://example.invalid}"}, field: `users["remote"].user.auth-provider`},
		{name: "basic auth", user: []string{"username: u", "password: p"}, field: `users["remote"].user.username`},
		{name: "impersonation", user: []string{"token: t", "as: system:admin"}, field: `users["remote"].user.as`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ca := srv.caData()
			if len(c.cluster) > 0 {
				ca = ""
			}
			kc := kubeconfigWith(srv.URL, ca, c.cluster, c.user)
			cfg, err := RemoteConfig(kc, KubeconfigPolicy{})
			ke, ok := AsKubeconfigError(err)
			if !ok || ke.Field != c.field {
				t.Fatalf("RemoteConfig = %v, %v; want a refusal naming %s", cfg, err, c.field)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the refusal quotes the file's content: %v", err)
			}
			if c.leaks == nil {
				return
			}
			if c.leaks() {
				t.Fatal("the hostile entry took effect before the control")
			}
			// The control: client-go's loader on the same bytes.
			raw, err := clientcmd.RESTConfigFromKubeConfig(kc)
			if err != nil {
				t.Fatalf("control: %v", err)
			}
			cs, err := kubernetes.NewForConfig(raw)
			if err != nil {
				t.Fatalf("control: %v", err)
			}
			_, _ = cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
			if !c.leaks() {
				t.Fatal("control: client-go's loader did not run or send it, so this case proves nothing")
			}
			_ = os.Remove(marker)
		})
	}
}

// TestRemoteConfigInline: inline credentials work, and with the opt-in an
// exec plugin runs (and still no path is read).
func TestRemoteConfigInline(t *testing.T) {
	srv := newHostileServer(t)
	marker := filepath.Join(t.TempDir(), "marker")
	cases := []struct {
		name     string
		cluster  []string
		user     []string
		policy   KubeconfigPolicy
		wantAuth string
		wantErr  string
		noGzip   bool // the client asks for no compression
	}{
		{name: "token", user: []string{"token: tok-123"}, wantAuth: "Bearer tok-123"},
		{name: "disable-compression", cluster: []string{"disable-compression: true"}, user: []string{"token: tok-3"}, wantAuth: "Bearer tok-3", noGzip: true},
		{name: "tls-server-name", cluster: []string{"tls-server-name: example.com"}, user: []string{"token: tok-2"}, wantAuth: "Bearer tok-2"},
		{name: "exec with opt-in", policy: KubeconfigPolicy{AllowExec: true}, wantAuth: "Bearer from-exec",
			user: []string{"exec:", "  apiVersion: client.authentication.k8s.io/v1", "  command: /bin/sh",
				"  args: [\"-c\", \"touch " + marker + "; echo '{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{\\\"token\\\":\\\"from-exec\\\"}}'\"]",
				"  interactiveMode: Never"}},
		{name: "http server", wantErr: `clusters["remote"].cluster.server`},
		{name: "bad proxy", cluster: []string{"proxy-url: file:///etc/passwd"}, user: []string{"token: t"}, wantErr: `clusters["remote"].cluster.proxy-url`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			server := srv.URL
			if c.name == "http server" {
				server = strings.Replace(server, "https://", "http://", 1)
			}
			cfg, err := RemoteConfig(kubeconfigWith(server, srv.caData(), c.cluster, c.user), c.policy)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %s", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.DisableCompression != c.noGzip {
				t.Errorf("DisableCompression %v, want %v", cfg.DisableCompression, c.noGzip)
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
			if !srv.sawAuth(c.wantAuth) {
				t.Fatalf("server saw %v, want %q", srv.auths, c.wantAuth)
			}
		})
	}
}

// TestRemoteConfigMalformed: what is not a kubeconfig, or names entries it
// lacks, is refused with a message, never a panic.
func TestRemoteConfigMalformed(t *testing.T) {
	for name, in := range map[string]string{
		"empty":           "",
		"garbage":         "\x00\x01not yaml: [",
		"no context":      "apiVersion: v1\nkind: Config\nclusters: []\n",
		"missing context": "apiVersion: v1\nkind: Config\ncurrent-context: x\n",
		"missing cluster": "apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n",
		"too large":       strings.Repeat("#", MaxKubeconfigSize+1),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := RemoteConfig([]byte(in), KubeconfigPolicy{}); err == nil {
				t.Fatal("accepted")
			} else if _, ok := AsKubeconfigError(err); !ok {
				t.Fatalf("%v is not a KubeconfigError", err)
			}
		})
	}
}
