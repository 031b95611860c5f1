package status

import (
	"context"
	"net"
	"net/http"
	"time"
)

// SocketClient is an HTTP client of the agent's status socket (a unix
// socket, root only: `meshlet status`, the e2e harness, the runner's
// tests); the URL's host is ignored. Connections are not kept between
// requests (the agent may restart behind the same path).
func SocketClient(socket string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}
