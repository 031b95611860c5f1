package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"

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
// the reflector reads its bookmarks' annotations), spec.podCIDR(s) and
// spec.unschedulable, the
// InternalIP and ExternalIP addresses and the first Ready condition (type, status,
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

// The wire format is read exactly as the full decoder (the code generated
// for k8s.io/api) reads it, so that whatever it takes the codec takes too
// (FuzzNodeCodec): a varint of up to ten bytes whose bits past the 64th
// are dropped, a field number truncated to 32 bits, groups skipped by
// depth without matching their numbers. protowire is stricter on all
// three.
var (
	errVarintOverflow = errors.New("proto: integer overflow")
	errEndGroup       = errors.New("proto: end group for non-group")
)

// varint reads a varint at the start of b and says how long it was.
func varint(b []byte) (v uint64, n int, err error) {
	for shift := uint(0); ; shift += 7 {
		if shift >= 64 {
			return 0, 0, errVarintOverflow
		}
		if n >= len(b) {
			return 0, 0, io.ErrUnexpectedEOF
		}
		c := b[n]
		n++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, n, nil
		}
	}
}

// skipField is the length of the field whose tag starts b, for a field
// eachField does not read: fixed-size values and groups (skipGenerated of
// the generated code).
func skipField(b []byte) (int, error) {
	i, depth := 0, 0
	for i < len(b) {
		wire, n, err := varint(b[i:])
		if err != nil {
			return 0, err
		}
		i += n
		switch protowire.Type(wire & 7) {
		case protowire.VarintType:
			_, n, err := varint(b[i:])
			if err != nil {
				return 0, err
			}
			i += n
		case protowire.Fixed64Type:
			i += 8
		case protowire.BytesType:
			l, n, err := varint(b[i:])
			if err != nil {
				return 0, err
			}
			if int(l) < 0 || i+n+int(l) < 0 {
				return 0, errors.New("proto: negative length")
			}
			i += n + int(l)
		case protowire.StartGroupType:
			depth++
		case protowire.EndGroupType:
			if depth == 0 {
				return 0, errors.New("proto: unexpected end of group")
			}
			depth--
		case protowire.Fixed32Type:
			i += 4
		default:
			return 0, fmt.Errorf("proto: illegal wire type %d", wire&7)
		}
		if depth == 0 {
			if i > len(b) {
				return 0, io.ErrUnexpectedEOF
			}
			return i, nil
		}
	}
	return 0, io.ErrUnexpectedEOF
}

func eachField(b []byte, fn func(field) error) error {
	for len(b) > 0 {
		wire, n, err := varint(b)
		if err != nil {
			return err
		}
		f := field{num: protowire.Number(int32(wire >> 3)), typ: protowire.Type(wire & 7)}
		switch {
		case f.typ == protowire.EndGroupType:
			return errEndGroup
		case f.num <= 0:
			return fmt.Errorf("proto: illegal tag %d", f.num)
		}
		switch f.typ {
		case protowire.BytesType:
			l, m, err := varint(b[n:])
			if err != nil {
				return err
			}
			if l > uint64(len(b)-n-m) {
				return io.ErrUnexpectedEOF
			}
			// The capacity reaches the end of the enclosing message,
			// for mapEntry.
			f.bytes = b[n+m : n+m+int(l) : len(b)]
			n += m + int(l)
		case protowire.VarintType:
			v, m, err := varint(b[n:])
			if err != nil {
				return err
			}
			f.varint = v
			n += m
		default:
			if n, err = skipField(b); err != nil {
				return err
			}
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
			// As metav1.Time decodes it: no bytes is the zero time, and
			// only the seconds count (the nanoseconds are dropped).
			var sec int64
			if err := eachField(f.bytes, func(t field) error {
				if t.num == 1 {
					sec = int64(t.varint)
				}
				return nil
			}); err != nil {
				return err
			}
			ts := metav1.Time{}
			if len(f.bytes) > 0 {
				ts = metav1.Unix(sec, 0)
			}
			if f.num == 8 {
				m.CreationTimestamp = ts
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

// mapEntry reads a map entry as the generated code does: its key (1) and
// value (2) are strings whatever their wire type says, and may run past
// the entry up to the end of the enclosing message (the entry's capacity:
// eachField); other fields are skipped within the entry.
func mapEntry(e []byte) (k, v string, err error) {
	msg, end := e[:cap(e)], len(e)
	for i := 0; i < end; {
		wire, n, err := varint(msg[i:])
		if err != nil {
			return "", "", err
		}
		switch num := int32(wire >> 3); num {
		case 1, 2:
			l, m, err := varint(msg[i+n:])
			if err != nil {
				return "", "", err
			}
			start := i + n + m
			if int(l) < 0 || start+int(l) < 0 {
				return "", "", errors.New("proto: negative length")
			}
			if start+int(l) > len(msg) {
				return "", "", io.ErrUnexpectedEOF
			}
			if num == 1 {
				k = string(msg[start : start+int(l)])
			} else {
				v = string(msg[start : start+int(l)])
			}
			i = start + int(l)
		default:
			skip, err := skipField(msg[i:])
			if err != nil {
				return "", "", err
			}
			if i+skip > end {
				return "", "", io.ErrUnexpectedEOF
			}
			i += skip
		}
	}
	return k, v, nil
}

func decodeNodeSpec(b []byte, s *corev1.NodeSpec) error {
	return eachField(b, func(f field) error {
		switch f.num {
		case 1:
			s.PodCIDR = string(f.bytes)
		case 4:
			s.Unschedulable = f.varint != 0
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
		case 5: // addresses: InternalIP and ExternalIP ones
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
			if t := corev1.NodeAddressType(typ); t == corev1.NodeExternalIP || t == corev1.NodeInternalIP {
				s.Addresses = append(s.Addresses, corev1.NodeAddress{Type: t, Address: string(addr)})
			}
		}
		return nil
	})
}
