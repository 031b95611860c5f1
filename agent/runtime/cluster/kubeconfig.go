package cluster

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"
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
//
// Its refusals go to Events, the ClusterMesh status, /status and the logs,
// which more people read than the Secret: each is a message written here
// (the field, the check), never a library's text, which may quote the file
// (client-go's error for two users of one name prints both, tokens and
// keys included).

// MaxKubeconfigSize bounds what is parsed. A Secret holds up to 1 MiB, but
// parsing costs ~20 ms of CPU per MiB even in one scalar, and a real
// kubeconfig is large by its CA bundle only: all of Debian's roots (144
// certificates) are 293 KB as certificate-authority-data.
const MaxKubeconfigSize = 512 << 10

// MaxKubeconfigMarks bounds the line breaks and YAML/JSON indicators
// (, [ { - : ?) of a remote kubeconfig, and so the nodes its parser
// builds: parsing costs per node (1 MiB of `{a: b},` took 0.6–1.8 s of
// CPU). kubectl writes under 100 for one cluster, user and context, a JWT
// has one or two '-' per 100 bytes, a CA bundle wrapped in 64-column lines
// one per line (a 600 KB one fits).
const MaxKubeconfigMarks = 10_000

// KubeconfigPolicy says what a remote kubeconfig may carry beyond inline
// credentials.
type KubeconfigPolicy struct {
	// AllowExec lets a kubeconfig's exec credential plugin run (meshlet
	// run --insecure-kubeconfig-exec): the command then runs as root on
	// every segment leader. Paths stay refused.
	AllowExec bool
}

// KubeconfigError is a kubeconfig refused: Field names the offending entry
// as the file spells it (e.g. users["remote"].user.exec). Neither carries
// the kubeconfig's values, only its names (bounded: kubeconfigName).
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
	if err := checkYAMLCost(data); err != nil {
		return nil, err
	}
	kc, err := clientcmd.Load(data)
	if err != nil {
		return nil, whyNotKubeconfig(data) // err's text may quote credentials
	}
	if kc.CurrentContext == "" {
		return nil, &KubeconfigError{Field: "current-context", Reason: "missing: the kubeconfig must name the context to use"}
	}
	ctx, ok := kc.Contexts[kc.CurrentContext]
	if !ok || ctx == nil {
		return nil, &KubeconfigError{Field: "current-context", Reason: fmt.Sprintf("names context %s, which the kubeconfig does not define", kubeconfigName(kc.CurrentContext))}
	}
	ctxAt := fmt.Sprintf("contexts[%s].context", kubeconfigName(kc.CurrentContext))
	cl, ok := kc.Clusters[ctx.Cluster]
	if !ok || cl == nil {
		return nil, &KubeconfigError{Field: ctxAt + ".cluster", Reason: fmt.Sprintf("names cluster %s, which the kubeconfig does not define", kubeconfigName(ctx.Cluster))}
	}
	var user clientcmdapi.AuthInfo
	if ctx.AuthInfo != "" {
		u, ok := kc.AuthInfos[ctx.AuthInfo]
		if !ok || u == nil {
			return nil, &KubeconfigError{Field: ctxAt + ".user", Reason: fmt.Sprintf("names user %s, which the kubeconfig does not define", kubeconfigName(ctx.AuthInfo))}
		}
		user = *u
	}
	clusterAt := fmt.Sprintf("clusters[%s].cluster", kubeconfigName(ctx.Cluster))
	userAt := fmt.Sprintf("users[%s].user", kubeconfigName(ctx.AuthInfo))
	if err := checkCluster(clusterAt, cl); err != nil {
		return nil, err
	}
	if err := checkUser(userAt, &user, policy); err != nil {
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
	if err := checkTLS(clusterAt, userAt, cfg.TLSClientConfig); err != nil {
		return nil, err
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
	// The URLs are not quoted: a URL may carry a password.
	u, err := url.Parse(cl.Server)
	switch {
	case err != nil || u.Host == "":
		return refuse("server", "not an https:// URL with a host")
	case u.Scheme == "http":
		return refuse("server", "an http:// URL: credentials are never sent in the clear, use https://")
	case u.Scheme != "https":
		return refuse("server", "not an https:// URL")
	}
	if err := checkURLExtras(u); err != nil {
		return refuse("server", err.Error())
	}
	if cl.ProxyURL != "" {
		p, err := url.Parse(cl.ProxyURL)
		if err != nil || p.Host == "" || (p.Scheme != "http" && p.Scheme != "https" && p.Scheme != "socks5") {
			return refuse("proxy-url", "not an http://, https:// or socks5:// URL with a host")
		}
		if err := checkURLExtras(p); err != nil {
			return refuse("proxy-url", err.Error())
		}
	}
	return nil
}

// checkURLExtras refuses what a server or proxy URL does not need and a
// credential could hide in: user info (client-go would send it as basic
// auth and quote the URL in every request error), a query or a fragment
// (client-go drops the query; the fragment stays in the URLs its errors
// quote).
func checkURLExtras(u *url.URL) error {
	switch {
	case u.User != nil:
		return errors.New("carries a user name or password (user:password@): basic authentication is not supported, use a token or a client certificate")
	case u.RawQuery != "" || u.ForceQuery:
		return errors.New("has a query (?…), which a Kubernetes API server URL never needs")
	case u.Fragment != "":
		return errors.New("has a fragment (#…), which a Kubernetes API server URL never needs")
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
	case strings.ContainsFunc(u.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		// Sent as a header, which Go refuses: every request would fail.
		return refuse("token", "contains a space, a line break or a control character: a bearer token is one word")
	}
	return nil
}

// checkTLS builds the TLS configuration client-go will (rest.TLSConfigFor),
// so that bad certificate or key data is refused here, naming the field,
// rather than failing later with client-go's message.
func checkTLS(clusterAt, userAt string, tc rest.TLSClientConfig) error {
	if tc.Insecure && len(tc.CAData) > 0 {
		return &KubeconfigError{Field: clusterAt + ".insecure-skip-tls-verify",
			Reason: "set together with certificate-authority-data, which client-go refuses: keep one"}
	}
	ca := rest.TLSClientConfig{CAData: tc.CAData}
	if _, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: ca}); err != nil {
		return &KubeconfigError{Field: clusterAt + ".certificate-authority-data", Reason: "not PEM certificates (base64 of the PEM file)"}
	}
	if len(tc.CertData) == 0 {
		return nil
	}
	cert := rest.TLSClientConfig{CertData: tc.CertData, KeyData: tc.KeyData}
	if _, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: cert}); err != nil {
		return &KubeconfigError{Field: userAt + ".client-key-data",
			Reason: "client-certificate-data and client-key-data are not a PEM certificate and its private key (base64 of the PEM files)"}
	}
	return nil
}

func pathRefused(inline string) string {
	return "a file path, not allowed in a remote kubeconfig (it would read a file of the node and could send it to the server): inline the content as " + inline
}

// kubeconfigName quotes a cluster, user or context name for a message,
// shortened: names are not credentials, but a message (an Event, a status)
// must stay short.
func kubeconfigName(name string) string {
	const max = 64
	if len(name) > max {
		return strconv.Quote(name[:max]) + "…"
	}
	return strconv.Quote(name)
}

// checkYAMLCost refuses, before parsing, what would make the YAML parser
// build more nodes than a kubeconfig has (MaxKubeconfigMarks), and YAML
// aliases, whose expansion multiplies them (a '*' opening a word: a word of
// a quoted string is refused too, and can be written without the space).
// The count is of bytes, a bound on the nodes: one node each at most, or a
// few (a key, its value and their mapping for one ':').
func checkYAMLCost(data []byte) error {
	marks, line := 0, 1
	prev := byte('\n')
	for _, c := range data {
		switch c {
		case '\n':
			line++
			marks++
		case '\r', 0x85, 0xa8, 0xa9, ',', '[', '{', '-', ':', '?':
			// 0x85, 0xa8, 0xa9 end the UTF-8 of NEL, LS and PS, line
			// breaks in YAML 1.1 (and bytes of other characters: more
			// counted, never fewer).
			marks++
		case '*':
			switch prev {
			case '\n', '\r', ' ', '\t', '[', '{', ',':
				return &KubeconfigError{Reason: fmt.Sprintf("a YAML alias (*name) at line %d: not allowed in a remote kubeconfig (write the value out)", line)}
			}
		}
		prev = c
	}
	if marks > MaxKubeconfigMarks {
		return &KubeconfigError{Reason: fmt.Sprintf("more than %d line breaks and YAML/JSON indicators (, [ { - : ?): "+
			"not parsed, a remote kubeconfig needs one cluster, one user and one context", MaxKubeconfigMarks)}
	}
	return nil
}

// yamlLine is the line number in a YAML parser's error, the only part of
// its text a message may use: the rest can quote the input.
var yamlLine = regexp.MustCompile(`yaml: line ([0-9]{1,7}):`)

// whyNotKubeconfig says why clientcmd.Load refused data, without its
// message: it decodes data as Load does (YAML to JSON, then into the
// kubeconfig's v1 types) up to the step that fails, and names it.
func whyNotKubeconfig(data []byte) *KubeconfigError {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		at := ""
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			at = " (line " + m[1] + ")"
		}
		return &KubeconfigError{Reason: "not a kubeconfig: not YAML or JSON" + at}
	}
	var v1 clientcmdv1.Config
	if err := utiljson.Unmarshal(j, &v1); err != nil {
		var te *json.UnmarshalTypeError
		var be base64.CorruptInputError
		switch {
		case errors.As(err, &te):
			return &KubeconfigError{Field: jsonPath(te.Field), Reason: "not " + jsonKind(te.Type)}
		case errors.As(err, &be):
			return &KubeconfigError{Field: badBase64(j), Reason: "not base64"}
		}
		return &KubeconfigError{Reason: "not a kubeconfig: not a JSON object"}
	}
	if f := duplicateName(&v1); f != "" {
		return &KubeconfigError{Field: f, Reason: "two entries of this name: the kubeconfig is ambiguous"}
	}
	if v1.APIVersion != "" && v1.APIVersion != "v1" {
		return &KubeconfigError{Field: "apiVersion", Reason: "not v1"}
	}
	if v1.Kind != "" && v1.Kind != "Config" {
		return &KubeconfigError{Field: "kind", Reason: "not Config"}
	}
	return &KubeconfigError{Reason: "not a kubeconfig client-go loads (its message is not shown: it may quote credentials)"}
}

// jsonPath is a decoding error's field path (e.g. users.user.token), if it
// is made of field names only.
var jsonPathRE = regexp.MustCompile(`^[A-Za-z0-9.-]{1,128}$`)

func jsonPath(p string) string {
	if !jsonPathRE.MatchString(p) {
		return "" // a map key of the input, or none
	}
	return p
}

// jsonKind names what a field of type t is written as.
func jsonKind(t reflect.Type) string {
	switch {
	case t == nil:
		return "the right type"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return "a string of base64"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Slice:
		return "a list"
	case t.Kind() == reflect.Struct || t.Kind() == reflect.Map || t.Kind() == reflect.Pointer:
		return "a mapping"
	}
	return "a " + t.Kind().String()
}

// badBase64 names the first *-data field of j that is not base64.
func badBase64(j []byte) string {
	var raw struct {
		Clusters []struct {
			Name    string `json:"name"`
			Cluster struct {
				CA string `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			Name string `json:"name"`
			User struct {
				Cert string `json:"client-certificate-data"`
				Key  string `json:"client-key-data"`
			} `json:"user"`
		} `json:"users"`
	}
	if utiljson.Unmarshal(j, &raw) != nil {
		return ""
	}
	bad := func(s string) bool { _, err := base64.StdEncoding.DecodeString(s); return err != nil }
	for _, c := range raw.Clusters {
		if bad(c.Cluster.CA) {
			return fmt.Sprintf("clusters[%s].cluster.certificate-authority-data", kubeconfigName(c.Name))
		}
	}
	for _, u := range raw.Users {
		switch {
		case bad(u.User.Cert):
			return fmt.Sprintf("users[%s].user.client-certificate-data", kubeconfigName(u.Name))
		case bad(u.User.Key):
			return fmt.Sprintf("users[%s].user.client-key-data", kubeconfigName(u.Name))
		}
	}
	return ""
}

// duplicateName names the first list with two entries of one name, which
// clientcmd.Load refuses.
func duplicateName(c *clientcmdv1.Config) string {
	dup := func(list string, names []string) string {
		seen := map[string]bool{}
		for _, n := range names {
			if seen[n] {
				return fmt.Sprintf("%s[%s]", list, kubeconfigName(n))
			}
			seen[n] = true
		}
		return ""
	}
	exts := func(at string, es []clientcmdv1.NamedExtension) string {
		names := make([]string, len(es))
		for i, e := range es {
			names[i] = e.Name
		}
		return dup(at+"extensions", names)
	}
	var clusters, users, contexts []string
	for _, x := range c.Clusters {
		clusters = append(clusters, x.Name)
		if f := exts(fmt.Sprintf("clusters[%s].cluster.", kubeconfigName(x.Name)), x.Cluster.Extensions); f != "" {
			return f
		}
	}
	for _, x := range c.AuthInfos {
		users = append(users, x.Name)
		if f := exts(fmt.Sprintf("users[%s].user.", kubeconfigName(x.Name)), x.AuthInfo.Extensions); f != "" {
			return f
		}
	}
	for _, x := range c.Contexts {
		contexts = append(contexts, x.Name)
		if f := exts(fmt.Sprintf("contexts[%s].context.", kubeconfigName(x.Name)), x.Context.Extensions); f != "" {
			return f
		}
	}
	for _, f := range []string{dup("clusters", clusters), dup("users", users), dup("contexts", contexts),
		exts("", c.Extensions), exts("preferences.", c.Preferences.Extensions)} {
		if f != "" {
			return f
		}
	}
	return ""
}

// clientBuildError is err, a failure to build clients from a configuration
// RemoteConfig accepted, without client-go's text, which may quote the
// configuration's TLS data (RemoteConfig checks what client-go builds
// from it: this is not expected).
func clientBuildError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := AsKubeconfigError(err); ok {
		return err
	}
	return &KubeconfigError{Reason: "client-go cannot build a client from it (its message is not shown: it may quote credentials)"}
}

// AsKubeconfigError returns err's *KubeconfigError, if any.
func AsKubeconfigError(err error) (*KubeconfigError, bool) {
	var ke *KubeconfigError
	ok := errors.As(err, &ke)
	return ke, ok
}
