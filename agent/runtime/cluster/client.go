// Package cluster holds meshlet's watchers: the local cluster's Nodes,
// Peers, ClusterMeshes and their Secrets, and, on segment leaders, the Nodes
// and Peers of every remote cluster. Objects are converted for the planner
// when they change (not at every reconcile), and informers store only the
// stripped objects (agent/core/kilo transforms).
package cluster

import (
	"fmt"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
)

// scheme knows meshlet's own API types (Peer, ClusterMesh).
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := kilo.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := clustermesh.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// KiloClient is a REST client for kilo.squat.ai/v1alpha1 over the Peer
// and ClusterMesh types' scheme (client-go's typed machinery; no generated
// clientset for two types meshlet reads).
func KiloClient(cfg *rest.Config) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	gv := schema.GroupVersion{Group: kilo.GroupName, Version: "v1alpha1"}
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = "meshlet"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("creating kilo.squat.ai client: %w", err)
	}
	return rc, nil
}

// WatchClient is a clientset for the informers of core objects other than
// Nodes (nodecodec.go) and what they write, in protobuf: cheaper to encode
// and decode than JSON (a location's Lease, renewed every second, is read
// by every node of the location).
func WatchClient(cfg *rest.Config) (kubernetes.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("creating a kubernetes client: %w", err)
	}
	return cs, nil
}

// informerFor watches one resource through a REST client: kilo.squat.ai's,
// or Nodes through nodeRESTClient.
func informerFor(rc rest.Interface, resource, namespace string, obj runtime.Object, transform cache.TransformFunc) cache.SharedIndexInformer {
	lw := cache.NewListWatchFromClient(rc, resource, namespace, fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	if transform != nil {
		_ = inf.SetTransform(transform) // only fails once started
	}
	return inf
}

// handler adapts add/update/delete to one callback with the object (or the
// last known state for deletes).
func handler(fn func(obj interface{}, deleted bool)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { fn(obj, false) },
		UpdateFunc: func(_, obj interface{}) { fn(obj, false) },
		DeleteFunc: func(obj interface{}) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			fn(obj, true)
		},
	}
}

// orReal is c, or the real clock when c is nil (tests that need no clock).
func orReal(c clock.WithTicker) clock.WithTicker {
	if c == nil {
		return clock.RealClock{}
	}
	return c
}
