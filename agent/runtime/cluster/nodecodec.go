package cluster

import (
	"bytes"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// Nodes are decoded for the informers keeping only what meshlet reads.
//
// A watch delivers the whole Node on every change, and a leader of ten
// remote clusters of 1,000 nodes receives ~330 heartbeats a second (each
// node's last-seen, every ~30 s): decoding a kubelet-sized Node — images,
// node info, capacity, conditions with their messages, managed fields —
// into a corev1.Node allocates tens of kilobytes that the transform
// (kilo.TransformNode) throws away at once. This codec reads the protobuf
// wire format and decodes only the metadata (every label and annotation:
// the reflector reads its bookmarks' annotations), spec.podCIDR(s), the
// ExternalIP addresses and the first Ready condition (type, status,
// reason): what TransformNode keeps. Anything else (other kinds, JSON) is
// decoded as usual.

// nodeRESTClient is a core/v1 REST client that speaks protobuf and decodes
// Nodes with nodeCodecs.
func nodeRESTClient(cfg *rest.Config) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = nodeCodecs{clientscheme.Codecs.WithoutConversion()}
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("creating a client for Nodes: %w", err)
	}
	return rc, nil
}

// nodeCodecs replaces the protobuf serializer's decoding of Node and
// NodeList.
type nodeCodecs struct{ runtime.NegotiatedSerializer }

func (c nodeCodecs) SupportedMediaTypes() []runtime.SerializerInfo {
	infos := append([]runtime.SerializerInfo(nil), c.NegotiatedSerializer.SupportedMediaTypes()...)
	for i := range infos {
		if infos[i].MediaType == runtime.ContentTypeProtobuf {
			infos[i].Serializer = nodeSerializer{infos[i].Serializer}
		}
	}
	return infos
}

type nodeSerializer struct{ runtime.Serializer }

// protobufMagic starts every object in Kubernetes' protobuf encoding; a
// runtime.Unknown (type meta, raw message) follows.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

func (s nodeSerializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	gvk, raw, ok := unknownEnvelope(data)
	if !ok || gvk.Group != "" || gvk.Version != "v1" || (gvk.Kind != "Node" && gvk.Kind != "NodeList") {
		return s.Serializer.Decode(data, defaults, into)
	}
	switch gvk.Kind {
	case "Node":
		n, ok := into.(*corev1.Node)
		if !ok || n == nil {
			n = &corev1.Node{}
		}
		*n = corev1.Node{}
		if err := decodeNode(raw, n); err != nil {
			return nil, &gvk, fmt.Errorf("decoding a Node: %w", err)
		}
		return n, &gvk, nil
	default:
		l, ok := into.(*corev1.NodeList)
		if !ok || l == nil {
			l = &corev1.NodeList{}
		}
		*l = corev1.NodeList{}
		if err := decodeNodeList(raw, l); err != nil {
			return nil, &gvk, fmt.Errorf("decoding a NodeList: %w", err)
		}
		return l, &gvk, nil
	}
}

// unknownEnvelope reads the type and the raw message of an object in
// Kubernetes' protobuf encoding.
func unknownEnvelope(data []byte) (gvk schema.GroupVersionKind, raw []byte, ok bool) {
	if !bytes.HasPrefix(data, protobufMagic) {
		return gvk, nil, false
	}
	var apiVersion string
	err := eachField(data[len(protobufMagic):], func(f field) error {
		switch f.num {
		case 1: // typeMeta
			return eachField(f.bytes, func(t field) error {
				switch t.num {
				case 1:
					apiVersion = string(t.bytes)
				case 2:
					gvk.Kind = string(t.bytes)
				}
				return nil
			})
		case 2: // raw
			raw = f.bytes
		case 3: // contentEncoding: none is ever used; decode as usual otherwise
			if len(f.bytes) > 0 {
				return errors.New("encoded content")
			}
		}
		return nil
	})
	if err != nil {
		return gvk, nil, false
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return gvk, nil, false
	}
	gvk.Group, gvk.Version = gv.Group, gv.Version
	return gvk, raw, true
}

// field is one field of a protobuf message: bytes for length-delimited
// fields (they point into the message: copy what is kept), varint for
// varints.
type field struct {
	num    protowire.Number
	typ    protowire.Type
	bytes  []byte
	varint uint64
}

func eachField(b []byte, fn func(field) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		f := field{num: num, typ: typ}
		switch typ {
		case protowire.BytesType:
			f.bytes, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			f.varint, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

func decodeNodeList(b []byte, l *corev1.NodeList) error {
	return eachField(b, func(f field) error {
		switch f.num {
		case 1: // metadata
			return eachField(f.bytes, func(m field) error {
				switch m.num {
				case 2:
					l.ResourceVersion = string(m.bytes)
				case 3:
					l.Continue = string(m.bytes)
				case 4:
					v := int64(m.varint)
					l.RemainingItemCount = &v
				}
				return nil
			})
		case 2: // items
			l.Items = append(l.Items, corev1.Node{})
			return decodeNode(f.bytes, &l.Items[len(l.Items)-1])
		}
		return nil
	})
}

func decodeNode(b []byte, n *corev1.Node) error {
	return eachField(b, func(f field) error {
		switch f.num {
		case 1:
			return decodeObjectMeta(f.bytes, &n.ObjectMeta)
		case 2:
			return decodeNodeSpec(f.bytes, &n.Spec)
		case 3:
			return decodeNodeStatus(f.bytes, &n.Status)
		}
		return nil
	})
}

func decodeObjectMeta(b []byte, m *metav1.ObjectMeta) error {
	return eachField(b, func(f field) error {
		switch f.num {
		case 1:
			m.Name = string(f.bytes)
		case 3:
			m.Namespace = string(f.bytes)
		case 5:
			m.UID = types.UID(f.bytes)
		case 6:
			m.ResourceVersion = string(f.bytes)
		case 7:
			m.Generation = int64(f.varint)
		case 8, 9: // creationTimestamp, deletionTimestamp
			var sec, nsec int64
			if err := eachField(f.bytes, func(t field) error {
				switch t.num {
				case 1:
					sec = int64(t.varint)
				case 2:
					nsec = int64(int32(t.varint))
				}
				return nil
			}); err != nil {
				return err
			}
			ts := metav1.Unix(sec, nsec)
			if f.num == 8 {
				if len(f.bytes) > 0 { // empty is the zero time (metav1.Time.Unmarshal)
					m.CreationTimestamp = ts
				}
			} else {
				m.DeletionTimestamp = &ts
			}
		case 11, 12:
			k, v, err := mapEntry(f.bytes)
			if err != nil {
				return err
			}
			target := &m.Labels
			if f.num == 12 {
				target = &m.Annotations
			}
			if *target == nil {
				*target = map[string]string{}
			}
			(*target)[k] = v
		}
		return nil
	})
}

func mapEntry(b []byte) (k, v string, err error) {
	err = eachField(b, func(f field) error {
		switch f.num {
		case 1:
			k = string(f.bytes)
		case 2:
			v = string(f.bytes)
		}
		return nil
	})
	return k, v, err
}

func decodeNodeSpec(b []byte, s *corev1.NodeSpec) error {
	return eachField(b, func(f field) error {
		switch f.num {
		case 1:
			s.PodCIDR = string(f.bytes)
		case 7:
			s.PodCIDRs = append(s.PodCIDRs, string(f.bytes))
		}
		return nil
	})
}

func decodeNodeStatus(b []byte, s *corev1.NodeStatus) error {
	return eachField(b, func(f field) error {
		switch f.num {
		case 4: // conditions: the first Ready one
			var typ, status, reason []byte
			if err := eachField(f.bytes, func(c field) error {
				switch c.num {
				case 1:
					typ = c.bytes
				case 2:
					status = c.bytes
				case 5:
					reason = c.bytes
				}
				return nil
			}); err != nil {
				return err
			}
			if string(typ) == string(corev1.NodeReady) && len(s.Conditions) == 0 {
				s.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady,
					Status: corev1.ConditionStatus(status), Reason: string(reason)}}
			}
		case 5: // addresses: ExternalIP ones
			var typ, addr []byte
			if err := eachField(f.bytes, func(a field) error {
				switch a.num {
				case 1:
					typ = a.bytes
				case 2:
					addr = a.bytes
				}
				return nil
			}); err != nil {
				return err
			}
			if string(typ) == string(corev1.NodeExternalIP) {
				s.Addresses = append(s.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: string(addr)})
			}
		}
		return nil
	})
}
