// outbox.go: Publish, an event row written in the business change's
// transaction, and the ids that make a re-run of fn publish the same ones.

package idemsql

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"weak"

	"github.com/idem-go/idem"
)

// EventIDField is the field of every stream entry that Relay adds: the
// event's id, which Publish returned. A consumer deduplicates by it.
const EventIDField = "idem_event_id"

// Publish writes an event for stream, with fields, into the ledger's
// outbox table, in tx: the event exists if and only if tx commits. Relay
// later adds it to the Redis Stream called stream, as an entry with fields
// and EventIDField set to the returned id.
//
// The id is unique per row. Inside an idem call, it is derived from the
// call's key (and step's name, in a Step) and the ordinal of this Publish
// among tx's: a re-run of fn after a failed attempt, which publishes in the
// same order in a new tx, publishes the same ids, and the consumer tells
// the re-run's events from new ones. Publish in the transaction that
// Commit commits; publishing from two transactions of one attempt gives
// their events the same ids (the second is refused by the outbox's unique
// key while the first is unrelayed). Outside an idem call, the id is
// random.
//
// Field values are strings, []byte or numbers (of any integer or float
// kind, named types included); other values are refused, and so is the
// field EventIDField. Fields are stored with their keys sorted, and
// numbers in their shortest decimal form. The ledger is the idem call's,
// or the one NewContext put in ctx.
func Publish(ctx context.Context, tx *sql.Tx, stream string, fields map[string]any) (id string, err error) {
	if tx == nil {
		return "", errors.New("idemsql: Publish with a nil tx")
	}
	if stream == "" {
		return "", errors.New("idemsql: Publish: the stream's name is empty")
	}
	l, err := ledgerOf(ctx, "Publish")
	if err != nil {
		return "", err
	}
	enc, err := EncodeFields(fields)
	if err != nil {
		return "", fmt.Errorf("idemsql: Publish: %w", err)
	}
	id = eventID(ctx, tx)
	if _, err := tx.ExecContext(ctx, l.outboxStatements().insert, []byte(id), []byte(stream), enc); err != nil {
		return "", l.explain("publish to "+stream, err)
	}
	return id, nil
}

// eventID returns the id of tx's next event: from the idem call's key and
// the event's ordinal in tx, or random outside a call.
func eventID(ctx context.Context, tx *sql.Tx) string {
	prefix, derived := EventIDPrefix(ctx)
	if !derived {
		return prefix
	}
	return prefix + strconv.FormatInt(ordinals.next(tx), 10)
}

// EventIDPrefix returns, outside an idem call, a random event id and
// false; inside one, the part of the call's event ids before their
// ordinal (from the call's key and step) and true: the id of a
// transaction's n-th Publish is the prefix followed by n, from 1. It is
// for drivers of their own, such as idempgx, whose ids must be Publish's.
func EventIDPrefix(ctx context.Context) (prefix string, derived bool) {
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

// ordinals counts each transaction's Publishes. The root's call state has
// no counter for us, so the count is kept here, per *sql.Tx; the map
// holds the transactions weakly, and a transaction's count goes when the
// transaction is collected.
var ordinals = ordinalMap{m: map[weak.Pointer[sql.Tx]]int64{}}

type ordinalMap struct {
	mu sync.Mutex // guards m
	m  map[weak.Pointer[sql.Tx]]int64
}

// next returns tx's next ordinal, from 1.
func (o *ordinalMap) next(tx *sql.Tx) int64 {
	wp := weak.Make(tx)
	o.mu.Lock()
	defer o.mu.Unlock()
	n, seen := o.m[wp]
	if !seen {
		runtime.AddCleanup(tx, o.forget, wp)
	}
	o.m[wp] = n + 1
	return n + 1
}

func (o *ordinalMap) forget(wp weak.Pointer[sql.Tx]) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, wp)
}

// EncodeFields returns fields as an outbox row holds them, keys sorted:
// for each field, its key's length (uvarint), key, value's length and
// value. Values are as Publish takes them; an error names the field at
// fault. It is for drivers of their own, such as idempgx, whose rows must
// be Publish's.
func EncodeFields(fields map[string]any) ([]byte, error) {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		if k == EventIDField {
			return nil, fmt.Errorf("the field %s is Relay's: name yours otherwise", EventIDField)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b := []byte{} // not NULL, for no fields
	for _, k := range keys {
		v, err := fieldValue(fields[k])
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", k, err)
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

// DecodeFields is the inverse of EncodeFields: key, value, key, value,
// as XADD takes them. It is for drivers of their own, such as idempgx.
func DecodeFields(b []byte) ([]any, error) {
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

// outboxStatements is the SQL of the ledger's _outbox table.
type outboxStatements struct {
	create string // the table
	insert string // an event: $1 id, $2 stream, $3 fields
	claim  string // the oldest rows (%d: how many), locked, skipping rows locked by others
	lag    string // the age of the oldest row, in microseconds
}

func (l *Ledger) outboxStatements() outboxStatements {
	d := l.dialect
	t := l.table + "_outbox"
	var seq string
	switch d.name {
	case "postgres":
		seq = "seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
	case "mysql":
		seq = "seq bigint NOT NULL AUTO_INCREMENT PRIMARY KEY"
	default:
		// AUTOINCREMENT: a seq is never reused, even after the rows above
		// it were deleted.
		seq = "seq INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	st := outboxStatements{
		create: "CREATE TABLE IF NOT EXISTS " + t + " (\n" +
			"\t" + seq + ",\n" +
			"\tevent_id " + d.key + " NOT NULL UNIQUE,\n" +
			"\tstream " + d.blob + " NOT NULL,\n" +
			"\tfields " + d.blob + " NOT NULL,\n" +
			"\trecorded_at " + d.timestamp + " NOT NULL\n)",
		insert: "INSERT INTO " + t + " (event_id, stream, fields, recorded_at) VALUES (" +
			d.placeholder(1, d.blob) + ", " + d.placeholder(2, d.blob) + ", " + d.placeholder(3, d.blob) + ", " + d.clock + ")",
		claim: "SELECT seq, event_id, stream, fields FROM " + t + " ORDER BY seq LIMIT %d",
		lag:   "SELECT " + d.ageMicros + " FROM " + t + " ORDER BY seq LIMIT 1",
	}
	if d.name != "sqlite" {
		st.claim += " FOR UPDATE SKIP LOCKED"
	}
	return st
}

// deleteStatement deletes n rows by seq.
func (l *Ledger) deleteStatement(n int) string {
	d := l.dialect
	b := []byte("DELETE FROM " + l.table + "_outbox WHERE seq IN (")
	for i := range n {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, d.placeholder(i+1, d.integer)...)
	}
	return string(append(b, ')'))
}
