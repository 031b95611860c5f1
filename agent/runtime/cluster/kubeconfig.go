package cluster

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// A remote cluster's kubeconfig comes from a Secret: whoever can write that
// Secret, or hands over the remote cluster's credentials, must not be able
// to run a command on the leaders or make them read a local file (the
// node's WireGuard key, a service account token) and send it away. So the
// kubeconfig is data: RemoteConfig takes only inline credentials from the
// entries its current context uses and builds the client configuration
// itself, never through client-go's kubeconfig loader, which would run
// exec plugins and auth providers and read every path the file names
// (docs/security.md#kubeconfig).

// MaxKubeconfigSize bounds what is parsed (a Secret holds at most 1 MiB).
const MaxKubeconfigSize = 1 << 20

// KubeconfigPolicy says what a remote kubeconfig may carry beyond inline
// credentials.
type KubeconfigPolicy struct {
	// AllowExec lets a kubeconfig's exec credential plugin run (meshlet
	// run --insecure-kubeconfig-exec): the command then runs as root on
	// every segment leader. Paths stay refused.
	AllowExec bool
}

// KubeconfigError is a kubeconfig refused: Field names the offending entry
// as the file spells it (e.g. users["remote"].user.exec).
type KubeconfigError struct {
	Field  string
	Reason string
}

func (e *KubeconfigError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// allowedKubeconfigFields is what RemoteConfig uses, for the messages.
const allowedKubeconfigFields = "server, certificate-authority-data, tls-server-name, insecure-skip-tls-verify, proxy-url, " +
	"token, client-certificate-data, client-key-data"

// RemoteConfig turns a remote cluster's kubeconfig into a client
// configuration from its current context's cluster and user, or refuses
// it with a *KubeconfigError naming the field.
func RemoteConfig(data []byte, policy KubeconfigPolicy) (*rest.Config, error) {
	if len(data) > MaxKubeconfigSize {
		return nil, &KubeconfigError{Reason: fmt.Sprintf("%d bytes: larger than %d", len(data), MaxKubeconfigSize)}
	}
	kc, err := clientcmd.Load(data)
	if err != nil {
		return nil, &KubeconfigError{Reason: "not a kubeconfig: " + firstLine(err.Error())}
	}
	if kc.CurrentContext == "" {
		return nil, &KubeconfigError{Field: "current-context", Reason: "missing: the kubeconfig must name the context to use"}
	}
	ctx, ok := kc.Contexts[kc.CurrentContext]
	if !ok || ctx == nil {
		return nil, &KubeconfigError{Field: "current-context", Reason: fmt.Sprintf("names context %q, which the kubeconfig does not define", kc.CurrentContext)}
	}
	cl, ok := kc.Clusters[ctx.Cluster]
	if !ok || cl == nil {
		return nil, &KubeconfigError{Field: fmt.Sprintf("contexts[%q].context.cluster", kc.CurrentContext), Reason: fmt.Sprintf("names cluster %q, which the kubeconfig does not define", ctx.Cluster)}
	}
	var user clientcmdapi.AuthInfo
	if ctx.AuthInfo != "" {
		u, ok := kc.AuthInfos[ctx.AuthInfo]
		if !ok || u == nil {
			return nil, &KubeconfigError{Field: fmt.Sprintf("contexts[%q].context.user", kc.CurrentContext), Reason: fmt.Sprintf("names user %q, which the kubeconfig does not define", ctx.AuthInfo)}
		}
		user = *u
	}
	if err := checkCluster(fmt.Sprintf("clusters[%q].cluster", ctx.Cluster), cl); err != nil {
		return nil, err
	}
	if err := checkUser(fmt.Sprintf("users[%q].user", ctx.AuthInfo), &user, policy); err != nil {
		return nil, err
	}
	cfg := &rest.Config{
		Host:               cl.Server,
		BearerToken:        user.Token,
		DisableCompression: cl.DisableCompression,
		TLSClientConfig: rest.TLSClientConfig{
			Insecure:   cl.InsecureSkipTLSVerify,
			ServerName: cl.TLSServerName,
			CAData:     cl.CertificateAuthorityData,
			CertData:   user.ClientCertificateData,
			KeyData:    user.ClientKeyData,
		},
	}
	if cl.ProxyURL != "" {
		u, _ := url.Parse(cl.ProxyURL) // checked by checkCluster
		cfg.Proxy = http.ProxyURL(u)
	}
	if user.Exec != nil {
		exec := *user.Exec
		exec.Args = append([]string(nil), exec.Args...)
		exec.Env = append([]clientcmdapi.ExecEnvVar(nil), exec.Env...)
		exec.StdinUnavailable = true
		exec.StdinUnavailableMessage = "meshlet runs exec credential plugins without a terminal"
		if exec.InteractiveMode == "" {
			exec.InteractiveMode = clientcmdapi.NeverExecInteractiveMode
		}
		cfg.ExecProvider = &exec
	}
	return cfg, nil
}

func checkCluster(at string, cl *clientcmdapi.Cluster) error {
	refuse := func(field, reason string) error { return &KubeconfigError{Field: at + "." + field, Reason: reason} }
	if cl.CertificateAuthority != "" {
		return refuse("certificate-authority", pathRefused("certificate-authority-data"))
	}
	if cl.Server == "" {
		return refuse("server", "missing")
	}
	u, err := url.Parse(cl.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return refuse("server", fmt.Sprintf("%q is not an https:// URL (credentials are never sent in the clear)", cl.Server))
	}
	if cl.ProxyURL != "" {
		p, err := url.Parse(cl.ProxyURL)
		if err != nil || p.Host == "" || (p.Scheme != "http" && p.Scheme != "https" && p.Scheme != "socks5") {
			return refuse("proxy-url", fmt.Sprintf("%q is not an http://, https:// or socks5:// URL", cl.ProxyURL))
		}
	}
	return nil
}

func checkUser(at string, u *clientcmdapi.AuthInfo, policy KubeconfigPolicy) error {
	refuse := func(field, reason string) error { return &KubeconfigError{Field: at + "." + field, Reason: reason} }
	switch {
	case u.ClientCertificate != "":
		return refuse("client-certificate", pathRefused("client-certificate-data"))
	case u.ClientKey != "":
		return refuse("client-key", pathRefused("client-key-data"))
	case u.TokenFile != "":
		return refuse("tokenFile", pathRefused("token"))
	case u.AuthProvider != nil:
		return refuse("auth-provider", "auth provider plugins are not allowed in a remote kubeconfig: use a token or a client certificate ("+allowedKubeconfigFields+")")
	case u.Exec != nil && !policy.AllowExec:
		return refuse("exec", "exec credential plugins would run a command on every segment leader: not allowed unless meshlet runs with --insecure-kubeconfig-exec; use a token or a client certificate ("+allowedKubeconfigFields+")")
	case u.Username != "" || u.Password != "":
		return refuse("username", "basic authentication is not supported: use a token or a client certificate")
	case u.Impersonate != "" || u.ImpersonateUID != "" || len(u.ImpersonateGroups) > 0 || len(u.ImpersonateUserExtra) > 0:
		return refuse("as", "impersonation is not supported: give the remote cluster's read-only credentials themselves")
	case len(u.ClientCertificateData) > 0 != (len(u.ClientKeyData) > 0):
		return refuse("client-key-data", "a client certificate needs both client-certificate-data and client-key-data")
	}
	return nil
}

func pathRefused(inline string) string {
	return "a file path, not allowed in a remote kubeconfig (it would read a file of the node and could send it to the server): inline the content as " + inline
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// AsKubeconfigError returns err's *KubeconfigError, if any.
func AsKubeconfigError(err error) (*KubeconfigError, bool) {
	var ke *KubeconfigError
	ok := errors.As(err, &ke)
	return ke, ok
}
