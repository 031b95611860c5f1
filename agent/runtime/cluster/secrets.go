package cluster

import (
	"context"
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
)

// SecretSource gives the remote watchers the kubeconfig Secrets' data.
type SecretSource interface {
	// Want names the Secrets needed now; the source reads those only.
	Want(names []string)
	// Data returns one key of a Secret: synced is false until the
	// Secret's watch has listed once, ok whether the key exists.
	Data(name, key string) (data []byte, synced, ok bool)
}

// SecretFunc is a SecretSource of fixed data (tests, dumps).
type SecretFunc func(name, key string) ([]byte, bool)

// Want implements SecretSource.
func (SecretFunc) Want([]string) {}

// Data implements SecretSource.
func (f SecretFunc) Data(name, key string) ([]byte, bool, bool) {
	d, ok := f(name, key)
	return d, true, ok
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

	mu      sync.Mutex
	ctx     context.Context
	watches map[string]*secretWatch
}

type secretWatch struct {
	inf    cache.SharedIndexInformer
	cancel context.CancelFunc
}

// NewSecretWatch watches Secrets of namespace through cfg (protobuf).
func NewSecretWatch(cfg *rest.Config, namespace string, notify func(time.Time), log *slog.Logger) (*SecretWatch, error) {
	c, err := watchClient(cfg)
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
		lw := cache.NewListWatchFromClient(s.Client.CoreV1().RESTClient(), "secrets", s.Namespace,
			fields.OneTermEqualSelector("metadata.name", name))
		inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
		_ = inf.SetTransform(transformSecret)
		_, _ = inf.AddEventHandler(handler(func(interface{}, bool) {
			if s.Notify != nil {
				s.Notify(time.Now())
			}
		}))
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			s.log().Debug("secret watch failed", "secret", s.Namespace+"/"+name, "error", err)
		})
		ctx, cancel := context.WithCancel(s.ctx)
		s.watches[name] = &secretWatch{inf: inf, cancel: cancel}
		go inf.Run(ctx.Done())
	}
}

// Data implements SecretSource.
func (s *SecretWatch) Data(name, key string) ([]byte, bool, bool) {
	s.mu.Lock()
	w, ok := s.watches[name]
	s.mu.Unlock()
	if !ok || !w.inf.HasSynced() {
		return nil, false, false
	}
	obj, exists, err := w.inf.GetStore().GetByKey(s.Namespace + "/" + name)
	if err != nil || !exists {
		return nil, true, false
	}
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return nil, true, false
	}
	d, ok := sec.Data[key]
	return d, true, ok
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
