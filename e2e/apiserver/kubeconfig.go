package apiserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig renders cfg (one of this package's token configs) as a
// kubeconfig document, e.g. the content of a remote cluster's kubeconfig
// Secret. Only the fields these configs use are carried: server, CA, token
// and impersonation.
func Kubeconfig(cfg *rest.Config, name string) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		Token:             cfg.BearerToken,
		Impersonate:       cfg.Impersonate.UserName,
		ImpersonateGroups: cfg.Impersonate.Groups,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return clientcmd.Write(*kc)
}

// WriteKubeconfig writes Kubeconfig(cfg) to path (mode 0600) for processes
// such as meshlet or kubectl.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	b, err := Kubeconfig(cfg, "test")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// WriteKubeconfig writes a kubeconfig for cfg into the server's directory
// and returns its path.
func (s *Server) WriteKubeconfig(name string, cfg *rest.Config) string {
	s.t.Helper()
	p := s.path(name + ".kubeconfig")
	if err := WriteKubeconfig(p, cfg); err != nil {
		s.t.Fatalf("apiserver: %v", err)
	}
	return p
}

// KubectlPath is the kubectl binary built with the server (same version).
func (s *Server) KubectlPath() string { return s.bins.kubectl }

// ServiceAccountToken creates the namespace and ServiceAccount if missing and
// returns a token for it from the TokenRequest API: the same kind of
// credential a user puts into a remote cluster's kubeconfig Secret. The
// ServiceAccount's identity is system:serviceaccount:<ns>:<name>.
func (s *Server) ServiceAccountToken(ctx context.Context, namespace, name string) (string, error) {
	cs, err := kubernetes.NewForConfig(s.AdminConfig())
	if err != nil {
		return "", err
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	_, err = cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	exp := int64(24 * 3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// ServiceAccountConfig is TokenConfig(ServiceAccountToken(...)); it fails the
// test on error.
func (s *Server) ServiceAccountConfig(ctx context.Context, namespace, name string) *rest.Config {
	s.t.Helper()
	tok, err := s.ServiceAccountToken(ctx, namespace, name)
	if err != nil {
		s.t.Fatalf("apiserver: %v", err)
	}
	return s.TokenConfig(tok)
}
