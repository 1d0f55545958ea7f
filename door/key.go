package door

import (
	"errors"
	"fmt"
	"strconv"
)

// Key returns the key that a door gives idem for the key a caller sent
// under the principal scope ("" when the door has no scope): the scope's
// length in decimal, ':', the scope and the key. The length says where
// the scope ends, so no two (scope, key) pairs give one key, and doors
// that use Key with one scope name one record for one key: a POST with
// Idempotency-Key order-1 through httpidem without a scope, a gRPC call
// with key order-1 through grpcidem without a scope, and a stream entry
// with key order-1 through idemstream with WithScope("") all reach the
// record that idem.Client.Status(ctx, door.Key("", "order-1")) reads.
func Key(scope, key string) string {
	return strconv.Itoa(len(scope)) + ":" + scope + key
}

// KeyOverhead is how many bytes Key adds to a key besides the scope: the
// length prefix of the scope and ':' (2 for a scope of under 10 bytes).
func KeyOverhead(scope string) int { return len(strconv.Itoa(len(scope))) + 1 }

// CheckKey checks a key as a caller sent it (one value of a header or of
// metadata): one value, of 1 to maxLen visible ASCII characters (0x21 to
// 0x7E). Its error says what is wrong, for the caller, in words that
// follow the key's name: "is empty", "is sent more than once".
func CheckKey(values []string, maxLen int) (string, error) {
	switch {
	case len(values) == 0:
		return "", errors.New("is missing")
	case len(values) > 1:
		return "", errors.New("is sent more than once")
	}
	v := values[0]
	switch {
	case v == "":
		return "", errors.New("is empty")
	case len(v) > maxLen:
		return "", fmt.Errorf("is longer than %d bytes", maxLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7E {
			return "", errors.New("has a character that is not visible ASCII")
		}
	}
	return v, nil
}
