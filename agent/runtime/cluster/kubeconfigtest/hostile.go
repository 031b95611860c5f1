// Package kubeconfigtest holds remote kubeconfigs that carry credentials
// and must be refused, or fail, without showing them: the shapes both
// cluster's unit tests (RemoteConfig) and the runner's test against real
// API servers (Events, ClusterMesh status, /status, logs, /metrics) feed in
// (docs/security.md#kubeconfig).
package kubeconfigtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// Hostile is one kubeconfig shape.
type Hostile struct {
	Name       string
	Kubeconfig []byte
	// Field is what RemoteConfig's refusal names (a substring of its
	// message); "" for a shape it accepts, whose requests then fail (the
	// server refuses the credentials).
	Field string
	// Secrets must appear in no message, status or log: the shape's marker
	// token and its private key's bytes in the encodings an error could
	// print them in (base64 of the PEM, the PEM's body, decimal, hex).
	Secrets []string
}

// credential is one shape's unique marker token and client key.
type credential struct {
	token           string
	keyPEM, certPEM []byte
	otherCertPEM    []byte // a certificate of another key
	keyB64, certB64 string
	badKeyPEMB64    string // an EC PRIVATE KEY block whose body is not a key
	keyAsCertPEMB64 string // a CERTIFICATE block whose body is the key
	secrets         []string
	numericToken    string
}

func newCredential(i int) (credential, error) {
	var c credential
	r := make([]byte, 8)
	if _, err := rand.Read(r); err != nil {
		return c, err
	}
	c.token = fmt.Sprintf("mrktok%02d%s", i, hex.EncodeToString(r))
	c.numericToken = fmt.Sprintf("9%02d%d", i, new(big.Int).SetBytes(r))
	key, der, err := newKey()
	if err != nil {
		return c, err
	}
	c.keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	if c.certPEM, err = selfSigned(key); err != nil {
		return c, err
	}
	other, _, err := newKey()
	if err != nil {
		return c, err
	}
	if c.otherCertPEM, err = selfSigned(other); err != nil {
		return c, err
	}
	c.keyB64, c.certB64 = b64(c.keyPEM), b64(c.certPEM)
	broken := append([]byte(nil), der...)
	broken[0] ^= 0xff
	c.badKeyPEMB64 = b64(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: broken}))
	c.keyAsCertPEMB64 = b64(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	body := base64.StdEncoding.EncodeToString(der)
	c.secrets = []string{c.token, c.numericToken,
		c.keyB64[60:100],                              // base64 of the PEM, inside the body
		body[20:60],                                   // the PEM's body (base64 of the DER)
		decimal(der[10:26]), decimal(c.keyPEM[40:56]), // Go's %v of the bytes
		hex.EncodeToString(der[10:26]), hex.EncodeToString(c.keyPEM[40:56]),
		string(c.keyPEM[40:80]), // the PEM as text
	}
	return c, nil
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	return key, der, err
}

func selfSigned(key *ecdsa.PrivateKey) ([]byte, error) {
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meshlet-hostile"},
		NotBefore: time.Unix(1_700_000_000, 0), NotAfter: time.Unix(2_000_000_000, 0),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func decimal(b []byte) string { return strings.Trim(fmt.Sprint(b), "[]") }

// doc renders a kubeconfig whose current context "remote" names cluster
// and user "remote"; clusters, users and contexts are the lists' YAML
// (each line indented by the caller), extra goes at the end.
func doc(clusters, users, contexts, extra string) []byte {
	if contexts == "" {
		contexts = "- name: remote\n  context: {cluster: remote, user: remote}\n"
	}
	return []byte("apiVersion: v1\nkind: Config\ncurrent-context: remote\nclusters:\n" + clusters + "users:\n" + users +
		"contexts:\n" + contexts + extra)
}

// Hostiles returns every shape for an API server at server (https) with
// the CA caPEM: the shapes RemoteConfig accepts reach it, and it refuses
// their credentials.
func Hostiles(server string, caPEM []byte) ([]Hostile, error) {
	host := strings.TrimPrefix(server, "https://")
	ca := b64(caPEM)
	cluster := func(lines ...string) string {
		return "- name: remote\n  cluster:\n    " + strings.Join(lines, "\n    ") + "\n"
	}
	user := func(lines ...string) string {
		return "- name: remote\n  user:\n    " + strings.Join(lines, "\n    ") + "\n"
	}
	goodCluster := cluster("server: "+server, "certificate-authority-data: "+ca)
	type shape struct {
		name, field string
		kc          func(c credential) []byte
	}
	shapes := []shape{
		{"duplicate users", `users["remote"]`, func(c credential) []byte {
			u := user("token: "+c.token, "client-certificate-data: "+c.certB64, "client-key-data: "+c.keyB64)
			return doc(goodCluster, u+u, "", "")
		}},
		{"duplicate clusters", `clusters["remote"]`, func(c credential) []byte {
			return doc(goodCluster+cluster("server: https://meshlet:"+c.token+"@"+host, "certificate-authority-data: "+c.keyB64),
				user("token: "+c.token), "", "")
		}},
		{"duplicate contexts", `contexts["remote"]`, func(c credential) []byte {
			ctx := "- name: remote\n  context: {cluster: remote, user: remote}\n"
			return doc(goodCluster, user("token: "+c.token, "client-key-data: "+c.keyB64, "client-certificate-data: "+c.certB64), ctx+ctx, "")
		}},
		{"duplicate extensions", `users["remote"].user.extensions["x"]`, func(c credential) []byte {
			ext := "- name: x\n      extension: {token: " + c.token + ", key: " + c.keyB64 + "}"
			return doc(goodCluster, user("token: "+c.token, "extensions:\n    "+ext+"\n    "+ext), "", "")
		}},
		{"duplicate users in JSON", `users["remote"]`, func(c credential) []byte {
			u := fmt.Sprintf(`{"name":"remote","user":{"token":%q,"client-key-data":%q,"client-certificate-data":%q}}`, c.token, c.keyB64, c.certB64)
			return []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Config","current-context":"remote","clusters":[{"name":"remote","cluster":{"server":%q,"certificate-authority-data":%q}}],"users":[%s,%s],"contexts":[{"name":"remote","context":{"cluster":"remote","user":"remote"}}]}`,
				server, ca, u, u))
		}},
		{"userinfo in server", `clusters["remote"].cluster.server`, func(c credential) []byte {
			return doc(cluster("server: https://meshlet:"+c.token+"@"+host, "certificate-authority-data: "+ca), user("token: "+c.token), "", "")
		}},
		{"token as the user of server", `clusters["remote"].cluster.server`, func(c credential) []byte {
			return doc(cluster("server: https://"+c.token+"@"+host, "certificate-authority-data: "+ca), user("client-certificate-data: "+c.certB64, "client-key-data: "+c.keyB64), "", "")
		}},
		{"userinfo in http server", `clusters["remote"].cluster.server`, func(c credential) []byte {
			return doc(cluster("server: http://meshlet:"+c.token+"@"+host), user("token: "+c.token), "", "")
		}},
		{"token in the query of server", `clusters["remote"].cluster.server`, func(c credential) []byte {
			return doc(cluster("server: "+server+"/?access_token="+c.token, "certificate-authority-data: "+ca), user("token: "+c.token), "", "")
		}},
		{"token in the fragment of server", `clusters["remote"].cluster.server`, func(c credential) []byte {
			return doc(cluster("server: "+server+"/#"+c.token, "certificate-authority-data: "+ca), user("token: "+c.token), "", "")
		}},
		{"server that does not parse", `clusters["remote"].cluster.server`, func(c credential) []byte {
			return doc(cluster("server: \"https://meshlet:"+c.token+"@host:port\\x7f\"", "certificate-authority-data: "+ca), user("token: "+c.token), "", "")
		}},
		{"userinfo in proxy-url", `clusters["remote"].cluster.proxy-url`, func(c credential) []byte {
			return doc(cluster("server: "+server, "certificate-authority-data: "+ca, "proxy-url: http://meshlet:"+c.token+"@127.0.0.1:3128"),
				user("token: "+c.token), "", "")
		}},
		{"proxy-url that does not parse", `clusters["remote"].cluster.proxy-url`, func(c credential) []byte {
			return doc(cluster("server: "+server, "certificate-authority-data: "+ca, "proxy-url: \"http://[meshlet:"+c.token+"\""),
				user("token: "+c.token), "", "")
		}},
		{"token on a malformed YAML line", "line 13", func(c credential) []byte {
			return doc(goodCluster, user("client-key-data: "+c.keyB64, "token: "+c.token+": "+c.keyB64), "", "")
		}},
		{"token in an unclosed flow mapping", "line 11", func(c credential) []byte {
			return doc(goodCluster, "- name: remote\n  user: {token: "+c.token+", client-key-data: "+c.keyB64+"\n", "", "")
		}},
		{"token in a tab-indented line", "line 13", func(c credential) []byte {
			return doc(goodCluster, user("client-key-data: "+c.keyB64)+"\t  token: "+c.token+"\n", "", "")
		}},
		{"token of the wrong type", "users.user.token", func(c credential) []byte {
			return doc(goodCluster, user("token: ["+c.token+", "+c.keyB64+"]"), "", "")
		}},
		{"token as a number", "users.user.token", func(c credential) []byte {
			return doc(goodCluster, user("token: "+c.numericToken), "", "")
		}},
		{"token in nested lists", "users.user.token", func(c credential) []byte {
			return doc(goodCluster, user("token: "+strings.Repeat("[", 500)+c.token+strings.Repeat("]", 500)), "", "")
		}},
		{"client key as a mapping", "users.user.client-key-data", func(c credential) []byte {
			return doc(goodCluster, user("token: "+c.token, "client-key-data: {key: "+c.keyB64+"}"), "", "")
		}},
		{"client key not base64", `users["remote"].user.client-key-data`, func(c credential) []byte {
			return doc(goodCluster, user("client-certificate-data: "+c.certB64, "client-key-data: \""+string(c.keyPEM[:80])+c.token+"\""), "", "")
		}},
		{"certificate authority not base64", `clusters["remote"].cluster.certificate-authority-data`, func(c credential) []byte {
			return doc(cluster("server: "+server, "certificate-authority-data: "+c.token+"%%"), user("token: "+c.token, "client-key-data: "+c.keyB64, "client-certificate-data: "+c.certB64), "", "")
		}},
		{"client key not PEM", `users["remote"].user.client-key-data`, func(c credential) []byte {
			return doc(goodCluster, user("client-certificate-data: "+c.certB64, "client-key-data: "+b64([]byte(c.token+string(c.keyPEM[31:])))), "", "")
		}},
		{"client key PEM that does not parse", `users["remote"].user.client-key-data`, func(c credential) []byte {
			return doc(goodCluster, user("token: "+c.token, "client-certificate-data: "+c.certB64, "client-key-data: "+c.badKeyPEMB64), "", "")
		}},
		{"client key of another certificate", `users["remote"].user.client-key-data`, func(c credential) []byte {
			return doc(goodCluster, user("token: "+c.token, "client-certificate-data: "+b64(c.otherCertPEM), "client-key-data: "+c.keyB64), "", "")
		}},
		{"client key as the client certificate", `users["remote"].user.client-key-data`, func(c credential) []byte {
			return doc(goodCluster, user("token: "+c.token, "client-certificate-data: "+c.keyB64, "client-key-data: "+c.keyB64), "", "")
		}},
		{"client key as the certificate authority", `clusters["remote"].cluster.certificate-authority-data`, func(c credential) []byte {
			return doc(cluster("server: "+server, "certificate-authority-data: "+c.keyB64), user("token: "+c.token), "", "")
		}},
		{"certificate authority PEM that does not parse", `clusters["remote"].cluster.certificate-authority-data`, func(c credential) []byte {
			return doc(cluster("server: "+server, "certificate-authority-data: "+c.keyAsCertPEMB64), user("token: "+c.token), "", "")
		}},
		{"insecure with a certificate authority", `clusters["remote"].cluster.insecure-skip-tls-verify`, func(c credential) []byte {
			return doc(cluster("server: "+server, "certificate-authority-data: "+ca, "insecure-skip-tls-verify: true"),
				user("token: "+c.token, "client-certificate-data: "+c.certB64, "client-key-data: "+c.keyB64), "", "")
		}},
		{"token with a line break", `users["remote"].user.token`, func(c credential) []byte {
			return doc(goodCluster, user("token: \""+c.token+"\\nX-Leak: "+c.token+"\""), "", "")
		}},
		{"basic auth", `users["remote"].user.username`, func(c credential) []byte {
			return doc(goodCluster, user("username: "+c.token+"u", "password: "+c.token), "", "")
		}},
		{"exec with the token in its environment", `users["remote"].user.exec`, func(c credential) []byte {
			return doc(goodCluster, user("exec:", "  apiVersion: client.authentication.k8s.io/v1", "  command: /bin/echo",
				"  args: ["+c.token+"]", "  env: [{name: TOKEN, value: "+c.token+"}]"), "", "")
		}},
		{"auth-provider with a token", `users["remote"].user.auth-provider`, func(c credential) []byte {
			return doc(goodCluster, user("auth-provider:", "  name: oidc", "  config: {id-token: "+c.token+", refresh-token: "+c.keyB64+"}"), "", "")
		}},
		{"kind carrying the token", "kind", func(c credential) []byte {
			return []byte(strings.Replace(string(doc(goodCluster, user("token: "+c.token), "", "")), "kind: Config", "kind: "+c.token, 1))
		}},
		{"apiVersion carrying the token", "apiVersion", func(c credential) []byte {
			return []byte(strings.Replace(string(doc(goodCluster, user("token: "+c.token), "", "")), "apiVersion: v1", "apiVersion: "+c.token, 1))
		}},
		{"alias of the token", "YAML alias", func(c credential) []byte {
			return doc(goodCluster, user("token: &t "+c.token, "client-key-data: "+c.keyB64, "username: *t"), "", "")
		}},
		{"billion laughs", "YAML alias", func(c credential) []byte {
			var b strings.Builder
			b.WriteString("laughs:\n  l0: &l0 [" + c.token + ", " + c.token + "]\n")
			for i := 1; i < 30; i++ {
				fmt.Fprintf(&b, "  l%d: &l%d [*l%d, *l%d, *l%d, *l%d]\n", i, i, i-1, i-1, i-1, i-1)
			}
			return doc(goodCluster, user("token: "+c.token, "client-key-data: "+c.keyB64, "client-certificate-data: "+c.certB64), "", b.String())
		}},
		{"too many indicators", "YAML/JSON indicators", func(c credential) []byte {
			return doc(goodCluster, user("token: "+c.token, "client-key-data: "+c.keyB64, "client-certificate-data: "+c.certB64), "",
				"x: ["+strings.Repeat("{a: "+c.token+"},", 5_000)+"{}]\n")
		}},
		{"oversized", "larger than", func(c credential) []byte {
			// Over RemoteConfig's 512 KiB, under a Secret's 1 MiB.
			pad := strings.Repeat(c.keyB64, 600<<10/len(c.keyB64))
			return doc(goodCluster, user("token: "+c.token, "client-key-data: "+c.keyB64, "client-certificate-data: "+c.certB64), "", "# "+pad+"\n")
		}},
		// Accepted: each request then fails, and says so without the
		// credentials.
		{"token the server refuses", "", func(c credential) []byte {
			return doc(goodCluster, user("token: "+c.token), "", "")
		}},
		{"client certificate the server does not trust", "", func(c credential) []byte {
			return doc(goodCluster, user("client-certificate-data: "+c.certB64, "client-key-data: "+c.keyB64), "", "")
		}},
	}
	out := make([]Hostile, 0, len(shapes))
	for i, s := range shapes {
		c, err := newCredential(i)
		if err != nil {
			return nil, err
		}
		out = append(out, Hostile{Name: s.name, Kubeconfig: s.kc(c), Field: s.field, Secrets: c.secrets})
	}
	return out, nil
}

// Leaks returns the secrets of hs that text contains, each with the shape
// it belongs to.
func Leaks(hs []Hostile, text string) []string {
	var out []string
	for _, h := range hs {
		for _, s := range h.Secrets {
			if strings.Contains(text, s) {
				out = append(out, fmt.Sprintf("%s: %q", h.Name, s))
			}
		}
	}
	return out
}
