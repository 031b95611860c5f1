package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// SecretSource gives the remote watchers the kubeconfig Secrets' data.
type SecretSource interface {
	// Want names the Secrets needed now; the source reads those only.
	Want(names []string)
	// Data returns one key of a Secret: synced is false until the
	// Secret's watch has listed once, ok whether the key exists; err says
	// why it cannot be read (the agent lacks the grant).
	Data(name, key string) (data []byte, synced, ok bool, err error)
}

// SecretFunc is a SecretSource of fixed data (tests, dumps).
type SecretFunc func(name, key string) ([]byte, bool)

// Want implements SecretSource.
func (SecretFunc) Want([]string) {}

// Data implements SecretSource.
func (f SecretFunc) Data(name, key string) ([]byte, bool, bool, error) {
	d, ok := f(name, key)
	return d, true, ok, nil
}

// SecretWatch watches, in one namespace, exactly the Secrets it is told to
// want, each with a watch selected by its name, so the agent needs no read
// access to any other Secret (RBAC resourceNames suffice: docs/security.md)
// and holds no other Secret in memory. Only segment leaders want any.
type SecretWatch struct {
	Client    kubernetes.Interface
	Namespace string
	Notify    func(seen time.Time)
	Log       *slog.Logger
	// Allowed asks whether the agent may watch the Secret called name
	// (nil: assume so). A Secret it may not read is not watched, so the
	// API server sees no refused request, and is asked about again every
	// DeniedRecheck.
	Allowed func(ctx context.Context, name string) (bool, error)
	// Clock stamps changes and times the rechecks (nil: the real clock).
	Clock clock.WithTicker

	mu      sync.Mutex
	ctx     context.Context
	watches map[string]*secretWatch
}

// DeniedRecheck is how often a Secret the agent may not read is asked
// about again.
const DeniedRecheck = time.Minute

type secretWatch struct {
	inf    cache.SharedIndexInformer // nil until access is known
	denied error
	cancel context.CancelFunc
}

// NewSecretWatch watches Secrets of namespace through cfg (protobuf).
func NewSecretWatch(cfg *rest.Config, namespace string, notify func(time.Time), log *slog.Logger) (*SecretWatch, error) {
	c, err := WatchClient(cfg)
	if err != nil {
		return nil, err
	}
	return &SecretWatch{Client: c, Namespace: namespace, Notify: notify, Log: log}, nil
}

// Start sets the context that bounds every watch.
func (s *SecretWatch) Start(ctx context.Context) {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
}

// Want implements SecretSource: it starts a watch for every new name and
// stops those no longer named.
func (s *SecretWatch) Want(names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil {
		return
	}
	if s.watches == nil {
		s.watches = map[string]*secretWatch{}
	}
	for name, w := range s.watches {
		if !slices.Contains(names, name) {
			w.cancel()
			delete(s.watches, name)
		}
	}
	for _, name := range names {
		if _, ok := s.watches[name]; ok || name == "" {
			continue
		}
		ctx, cancel := context.WithCancel(s.ctx)
		w := &secretWatch{cancel: cancel}
		s.watches[name] = w
		go s.run(ctx, name, w)
	}
}

// run waits until the agent may read the Secret, then watches it.
func (s *SecretWatch) run(ctx context.Context, name string, w *secretWatch) {
	for s.Allowed != nil {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		ok, err := s.Allowed(actx, name)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil || ok {
			break // could not ask: try; a refusal then says it
		}
		s.mu.Lock()
		first := w.denied == nil
		w.denied = fmt.Errorf("the agent may not read Secret %s/%s: grant list and watch on secrets (resourceNames: [%s]) in %s (docs/security.md#least-privilege)",
			s.Namespace, name, name, s.Namespace)
		s.mu.Unlock()
		if first {
			s.log().Warn("kubeconfig secret not readable", "secret", s.Namespace+"/"+name, "error", w.denied)
			s.notify()
		}
		select {
		case <-ctx.Done():
			return
		case <-orReal(s.Clock).After(DeniedRecheck):
		}
	}
	lw := cache.NewListWatchFromClient(s.Client.CoreV1().RESTClient(), "secrets", s.Namespace,
		fields.OneTermEqualSelector("metadata.name", name))
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
	_ = inf.SetTransform(transformSecret)
	_, _ = inf.AddEventHandler(handler(func(interface{}, bool) { s.notify() }))
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.log().Debug("secret watch failed", "secret", s.Namespace+"/"+name, "error", err)
	})
	s.mu.Lock()
	w.inf, w.denied = inf, nil
	s.mu.Unlock()
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			s.notify()
		}
	}()
	inf.Run(ctx.Done())
}

func (s *SecretWatch) notify() {
	if s.Notify != nil {
		s.Notify(orReal(s.Clock).Now())
	}
}

// Data implements SecretSource.
func (s *SecretWatch) Data(name, key string) ([]byte, bool, bool, error) {
	s.mu.Lock()
	w, ok := s.watches[name]
	var inf cache.SharedIndexInformer
	var denied error
	if ok {
		inf, denied = w.inf, w.denied
	}
	s.mu.Unlock()
	if denied != nil {
		return nil, true, false, denied
	}
	if inf == nil || !inf.HasSynced() {
		return nil, false, false, nil
	}
	obj, exists, err := inf.GetStore().GetByKey(s.Namespace + "/" + name)
	if err != nil || !exists {
		return nil, true, false, nil
	}
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return nil, true, false, nil
	}
	d, ok := sec.Data[key]
	return d, true, ok, nil
}

func (s *SecretWatch) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// transformSecret keeps only a Secret's name and data: the kubeconfigs.
func transformSecret(obj interface{}) (interface{}, error) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, ResourceVersion: s.ResourceVersion}, Data: s.Data}, nil
}
