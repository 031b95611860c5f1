package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/meshlet/meshlet/agent/runtime/webhook"
)

// newWebhookCmd is `meshlet webhook` (kg's `webhook`): the Peer validation
// webhook of Kilo's peer-validation manifest, with kg's flags.
func newWebhookCmd() *cobra.Command {
	var cert, key, listen, metricsAddr, logLevel string
	c := &cobra.Command{
		Use:   "webhook",
		Short: "Serve the admission webhook that validates Kilo Peers (kg's webhook)",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if cert == "" || key == "" {
				return usage(errors.New("--cert-file and --key-file are required (the webhook serves HTTPS)"))
			}
			log := newLogger(logLevel)
			reg := prometheus.NewRegistry()
			reviews := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "admission_requests_total",
				Help: "Admission reviews answered, by operation and response (kg's series)."}, []string{"operation", "response"})
			reg.MustRegister(reviews)
			h := &webhook.Handler{Log: log, Reviewed: func(op, resp string) { reviews.WithLabelValues(op, resp).Inc() }}
			mux := http.NewServeMux()
			mux.Handle("/validate", h)
			srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			mm := http.NewServeMux()
			mm.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			msrv := &http.Server{Addr: metricsAddr, Handler: mm, ReadHeaderTimeout: 10 * time.Second}
			errc := make(chan error, 2)
			go func() { errc <- srv.ListenAndServeTLS(cert, key) }()
			go func() { errc <- msrv.ListenAndServe() }()
			log.Info("serving the Peer validation webhook", "listen", listen, "metrics", metricsAddr)
			select {
			case err := <-errc:
				return fmt.Errorf("webhook: %w", err)
			case <-c.Context().Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			_ = msrv.Shutdown(sctx)
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&cert, "cert-file", "", "TLS certificate file")
	fs.StringVar(&key, "key-file", "", "TLS key file")
	fs.StringVar(&listen, "listen", ":8443", "address of the webhook (HTTPS, path /validate)")
	fs.StringVar(&metricsAddr, "listen-metrics", ":1107", "address of /metrics")
	fs.StringVar(&logLevel, "log-level", "info", "all, debug, info, warn, error or none")
	return c
}
