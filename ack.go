// ack.go: Ack, the rule that tells a message consumer when a message may
// be acknowledged to its broker.

package idem

// Ack reports whether a message whose handler ran through Do, which
// returned err, may be acknowledged to its broker (XACK, a Kafka offset
// commit, a JetStream Ack, an SQS DeleteMessage): true when the key's
// outcome is stored, so a redelivery would only replay it. That is a
// success (nil), a permanent failure (Permanent, a replayed *StoredError,
// a result over WithMaxResultSize), a conflict (ErrConflict), a retry
// after the retention that a tombstone refused (ErrLateRetry: the key's
// operation ran), and a stored result that no longer decodes into Do's
// type (ErrDecode).
//
// It is false when nothing is stored yet and a redelivery must try again:
// a transient error of fn, ErrInProgress, ErrNotRecorded, ErrLeaseLost,
// Redis unreachable or failing, ErrClosed, a cancelled context. It is false
// too for errors no redelivery cures (ErrInvalidKey, ErrCorrupt, a type
// that Do[T] refuses): send those messages to a dead-letter queue rather
// than acknowledge them, or they are lost.
//
// Ack is VerdictOf(err).Settled(); VerdictOf(err).DeadLetter() tells the
// dead letters.
func Ack(err error) bool { return VerdictOf(err).Settled() }
