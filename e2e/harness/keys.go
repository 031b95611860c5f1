package harness

import (
	"encoding/base64"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func publicFromPrivate(b []byte) string {
	if len(b) != 32 {
		return ""
	}
	k, err := wgtypes.NewKey(b)
	if err != nil {
		return ""
	}
	return k.PublicKey().String()
}

// NewKeyPair returns a fresh WireGuard key pair (base64), e.g. for a Peer
// object's device or a node that only exists in the API.
func NewKeyPair() (priv, pub string) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		panic(err)
	}
	return k.String(), k.PublicKey().String()
}

// HexKey converts a base64 key to the hex form of the UAPI.
func HexKey(b64 string) string {
	b, _ := base64.StdEncoding.DecodeString(b64)
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 64)
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
