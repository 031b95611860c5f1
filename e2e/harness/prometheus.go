package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// Prometheus is a real Prometheus server (Debian's prometheus package) on
// the host, scraping meshlet on nodes in one job (meshlet, as meshlet's
// PodMonitor names it, or kilo, as the drop-in's does) and evaluating rule
// files.
type Prometheus struct {
	URL string
	API promv1.API
	Log string // its log file
}

// PrometheusOptions configures StartPrometheus.
type PrometheusOptions struct {
	// Rules are rule files to evaluate (absolute paths).
	Rules []string
	// Interval is the scrape and rule evaluation interval (default 1 s).
	Interval time.Duration
	// Job is the scrape job's name (default meshlet).
	Job string
	// Labels are a node's target labels besides node (nil: none), such as
	// the namespace, pod and container labels a PodMonitor or a VMPodScrape
	// gives, or the cluster label VMAgent's externalLabels add to every
	// series at the scrape (meshlet's own cluster label then becomes
	// exported_cluster, as there).
	Labels func(*Node) map[string]string
}

// StartPrometheus starts Prometheus scraping every node's metrics listener
// (forwarded from inside the node's namespace to the host's loopback, as
// the demo does), each target labelled node=<name> as the shipped
// PodMonitor labels it, plus o.Labels. It waits until Prometheus is ready;
// it is stopped at Close. Several may run at once, each in its own
// directory.
func (e *Env) StartPrometheus(ctx context.Context, o PrometheusOptions, nodes ...*Node) (*Prometheus, error) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		return nil, fmt.Errorf("prometheus not installed (apt-get install prometheus): %w", err)
	}
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.Job == "" {
		o.Job = "meshlet"
	}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(e.dir, "prometheus-"+o.Job+"-")
	if err != nil {
		return nil, err
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n", o.Interval, o.Interval, o.Interval)
	cfg.WriteString("rule_files:\n")
	for _, r := range o.Rules {
		fmt.Fprintf(&cfg, "  - %q\n", r)
	}
	fmt.Fprintf(&cfg, "scrape_configs:\n  - job_name: %q\n    static_configs:\n", o.Job)
	for _, n := range nodes {
		addr, stop, err := ForwardIntoNetns("127.0.0.1:0", n.NS, MetricsAddr)
		if err != nil {
			return nil, fmt.Errorf("forwarding %s's metrics: %w", n.Name, err)
		}
		e.onClose(stop)
		labels := map[string]string{"node": n.Name}
		if o.Labels != nil {
			for k, v := range o.Labels(n) {
				labels[k] = v
			}
		}
		b, err := json.Marshal(labels)
		if err != nil {
			return nil, err
		}
		// JSON is YAML: the labels as a flow mapping.
		fmt.Fprintf(&cfg, "      - targets: [%q]\n        labels: %s\n", addr, b)
	}
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(cfg.String()), 0o644); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &Prometheus{URL: "http://" + port, Log: filepath.Join(dir, "prometheus.log")}
	log, err := os.Create(p.Log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+port, "--storage.tsdb.retention.time=1h")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting prometheus: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(done)
	}()
	e.onClose(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	c, err := promapi.NewClient(promapi.Config{Address: p.URL})
	if err != nil {
		return nil, err
	}
	p.API = promv1.NewAPI(c)
	err = Poll(ctx, 30*time.Second, 100*time.Millisecond, "prometheus ready", func() (bool, error) {
		select {
		case <-done:
			b, _ := os.ReadFile(p.Log)
			return false, errors.New("prometheus exited: " + string(b))
		default:
		}
		resp, err := http.Get(p.URL + "/-/ready")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("/-/ready: %s", resp.Status)
	})
	if err != nil {
		return nil, err
	}
	e.Logf("prometheus %s (config %s, log %s)", p.URL, conf, p.Log)
	return p, nil
}

// freePort returns a loopback address with a port free right now (for a
// process that takes its address as a flag).
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Query evaluates expr now and returns the instant vector (an error for
// any other result type).
func (p *Prometheus) Query(ctx context.Context, expr string) (model.Vector, error) {
	v, _, _, err := p.API.Query(ctx, expr, time.Now())
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %q: %s, not a vector", expr, v.Type())
	}
	return vec, nil
}

// Value evaluates expr now and returns the value of its only sample, and
// false when the result is empty.
func (p *Prometheus) Value(ctx context.Context, expr string) (float64, bool, error) {
	vec, err := p.Query(ctx, expr)
	if err != nil || len(vec) == 0 {
		return 0, false, err
	}
	if len(vec) > 1 {
		return 0, false, fmt.Errorf("query %q: %d samples, want one", expr, len(vec))
	}
	return float64(vec[0].Value), true, nil
}

// Alert returns the active alert (pending or firing) named name whose
// labels include every given label (pairs: k, v, ...), or nil.
func (p *Prometheus) Alert(ctx context.Context, name string, labels ...string) (*promv1.Alert, error) {
	res, err := p.API.Alerts(ctx)
	if err != nil {
		return nil, err
	}
next:
	for i, a := range res.Alerts {
		if string(a.Labels["alertname"]) != name {
			continue
		}
		for j := 0; j+1 < len(labels); j += 2 {
			if string(a.Labels[model.LabelName(labels[j])]) != labels[j+1] {
				continue next
			}
		}
		return &res.Alerts[i], nil
	}
	return nil, nil
}
