// outbox.go: Publish, an event row written in the business change's
// transaction, and the ids that make a re-run of fn publish the same ones.

package idempgx

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/jackc/pgx/v5"
)

// EventIDField is the field of every stream entry that Relay adds: the
// event's id, which Publish returned. A consumer deduplicates by it. It is
// idemsql.EventIDField.
const EventIDField = idemsql.EventIDField

// Publish writes an event for stream, with fields, into the ledger's
// outbox table, in tx: the event exists if and only if tx commits. Relay
// later adds it to the Redis Stream called stream, as an entry with fields
// and EventIDField set to the returned id.
//
// The id is unique per row. Inside an idem call, it is derived from the
// call's key (and step's name, in a Step) and the ordinal of this Publish
// among tx's: a re-run of fn after a failed attempt, which publishes in the
// same order in a new tx, publishes the same ids, and the consumer tells
// the re-run's events from new ones. The ordinal is counted by the server,
// per transaction (savepoints included: a Publish rolled back to a
// savepoint gives its ordinal back). Publish in the transaction that
// Commit commits; publishing from two transactions of one attempt gives
// their events the same ids (the second is refused by the outbox's unique
// key while the first is unrelayed). Outside an idem call, the id is
// random.
//
// The ids, the rows and the entries are idemsql.Publish's, byte for byte:
// an event published through either driver is relayed by either, and the
// same key and ordinal give the same id. Field values are strings, []byte
// or numbers (of any integer or float kind, named types included); other
// values are refused, and so is the field EventIDField. Fields are stored
// with their keys sorted, and numbers in their shortest decimal form. The
// ledger is the idem call's, or the one NewContext put in ctx.
func Publish(ctx context.Context, tx pgx.Tx, stream string, fields map[string]any) (id string, err error) {
	if tx == nil {
		return "", errors.New("idempgx: Publish with a nil tx")
	}
	if stream == "" {
		return "", errors.New("idempgx: Publish: the stream's name is empty")
	}
	l, err := ledgerOf(ctx, "Publish")
	if err != nil {
		return "", err
	}
	enc, err := encodeFields(fields)
	if err != nil {
		return "", err
	}
	prefix, derived := eventIDPrefix(ctx)
	if !derived {
		if _, err := tx.Exec(ctx, l.sql.publish, []byte(prefix), []byte(stream), enc); err != nil {
			return "", l.explainTable("publish to "+stream, "_outbox", err)
		}
		return prefix, nil
	}
	var b []byte
	if err := tx.QueryRow(ctx, l.sql.publishDerived, prefix, []byte(stream), enc).Scan(&b); err != nil {
		return "", l.explainTable("publish to "+stream, "_outbox", err)
	}
	return string(b), nil
}

// eventIDPrefix returns the id of the next event outside an idem call
// (random, and false), or inside one the part before its ordinal: from the
// call's key and step, as idemsql derives it.
func eventIDPrefix(ctx context.Context) (string, bool) {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // never fails (crypto/rand documents it)
		return hex.EncodeToString(b), false
	}
	h := sha256.New()
	h.Write([]byte(a.Key))
	if step, ok := idem.StepFrom(ctx); ok {
		h.Write([]byte{0})
		h.Write([]byte(step))
	}
	// A hex digest and "-n": never the form of a random id.
	return hex.EncodeToString(h.Sum(nil)[:16]) + "-", true
}

// ordinalSetting is the transaction-local setting that counts a
// transaction's derived Publishes: the server forgets it when the
// transaction ends, and a ROLLBACK TO SAVEPOINT restores it.
const ordinalSetting = "idem.publish_ordinal"

// encodeFields returns fields as bytes, keys sorted: for each field, its
// key's length (uvarint), key, value's length and value. It is idemsql's
// encoding (a test compares the rows).
func encodeFields(fields map[string]any) ([]byte, error) {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		if k == EventIDField {
			return nil, fmt.Errorf("idempgx: Publish: the field %s is Relay's: name yours otherwise", EventIDField)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b := []byte{} // not NULL, for no fields
	for _, k := range keys {
		v, err := fieldValue(fields[k])
		if err != nil {
			return nil, fmt.Errorf("idempgx: Publish: field %q: %w", k, err)
		}
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return b, nil
}

// fieldValue returns v as a stream entry holds it.
func fieldValue(v any) ([]byte, error) {
	switch v := v.(type) {
	case string:
		return []byte(v), nil
	case []byte:
		return v, nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String:
		return []byte(rv.String()), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.AppendInt(nil, rv.Int(), 10), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return strconv.AppendUint(nil, rv.Uint(), 10), nil
	case reflect.Float32:
		return strconv.AppendFloat(nil, rv.Float(), 'g', -1, 32), nil
	case reflect.Float64:
		return strconv.AppendFloat(nil, rv.Float(), 'g', -1, 64), nil
	case reflect.Slice:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return rv.Bytes(), nil
		}
	}
	return nil, fmt.Errorf("a %T: give a string, []byte or number (format other values yourself: strconv.FormatBool, json.Marshal)", v)
}

// decodeFields is the inverse of encodeFields: key, value, key, value.
func decodeFields(b []byte) ([]any, error) {
	var out []any
	for len(b) > 0 {
		for range 2 {
			n, w := binary.Uvarint(b)
			if w <= 0 || uint64(len(b)-w) < n {
				return nil, errors.New("the fields are cut short or corrupt")
			}
			out = append(out, string(b[w:w+int(n)]))
			b = b[w+int(n):]
		}
	}
	return out, nil
}
