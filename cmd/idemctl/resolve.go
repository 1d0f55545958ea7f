package main

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// resolve settles the parked checked step o.step of arg's operation:
// not applied (c.ResolveNotApplied), or applied with o.value (JSON, as
// idem.Resolve stores it).
func resolve(ctx context.Context, o options, rdb redis.UniversalClient, arg string, out *printer) error {
	c := client(o, rdb)
	defer c.Close()
	key := o.key(arg)
	if o.notApplied {
		if err := c.ResolveNotApplied(ctx, key, o.step); err != nil {
			return err
		}
		out.printf("resolved step %q of key %q as not applied: the next call with the key runs the step's act again\n", o.step, key)
		return out.object(map[string]any{"key": key, "step": o.step, "resolved": "not_applied"})
	}
	if err := resolveValue(ctx, c, key, o.step, o.value); err != nil {
		return err
	}
	out.printf("resolved step %q of key %q as applied, with %s: the next call with the key resumes with it, without acting\n", o.step, key, o.value)
	return out.object(map[string]any{"key": key, "step": o.step, "resolved": "applied", "value": json.RawMessage(o.value)})
}

// resolveValue stores s, one JSON string, number or boolean, as the
// value of the step: a string as a Go string, a whole number as an int64,
// another number as a float64, a boolean as a bool, each of which decodes
// into the step's type when it is that kind (any integer type takes an
// int64). A value of a struct type needs idem.Resolve in Go.
func resolveValue(ctx context.Context, c *idem.Client, key, step, s string) error {
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return usagef("-value %q: not JSON: %v", s, err)
	}
	if d.More() {
		return usagef("-value %q: more than one JSON value", s)
	}
	switch v := v.(type) {
	case string:
		return idem.Resolve(ctx, c, key, step, v)
	case bool:
		return idem.Resolve(ctx, c, key, step, v)
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return idem.Resolve(ctx, c, key, step, i)
		}
		f, err := v.Float64()
		if err != nil {
			return usagef("-value %q: %v", s, err)
		}
		return idem.Resolve(ctx, c, key, step, f)
	}
	return usagef("-value %s: a JSON string, number or boolean; a step value of another type needs idem.Resolve in Go", s)
}

// retry un-parks arg's registered operation, parked after its recoveries
// did not finish it (idem's Client.Retry).
func retry(ctx context.Context, o options, rdb redis.UniversalClient, arg string, out *printer) error {
	c := client(o, rdb)
	defer c.Close()
	key := o.key(arg)
	if err := c.Retry(ctx, key); err != nil {
		return err
	}
	out.printf("retried key %q: its operation is no longer parked; the next Recover sweep where it is registered, or the next call with the key, runs it again\n", key)
	return out.object(map[string]any{"key": key, "retried": true})
}
