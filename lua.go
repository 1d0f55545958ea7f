// lua.go: the embedded Lua scripts (lua/*.lua), and the calls that send
// them: claimOnce, and write (EVALSHA with the EVAL fallback, in shared
// pipelines, or with WAIT for WithReplicas).

package idem

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/idem-go/idem/internal/pipeline"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/record.lua
	recordSrc string
	//go:embed lua/claim.lua
	claimSrc string
	//go:embed lua/complete.lua
	completeSrc string
	//go:embed lua/release.lua
	releaseSrc string
	//go:embed lua/renew.lua
	renewSrc string
	//go:embed lua/status.lua
	statusSrc string
	//go:embed lua/tombstone.lua
	tombstoneSrc string
	//go:embed lua/forget.lua
	forgetSrc string
	//go:embed lua/step.lua
	stepSrc string
	//go:embed lua/stepcheck.lua
	stepCheckSrc string
	//go:embed lua/retry.lua
	retrySrc string

	claimScript     = newScript(claimSrc)
	completeScript  = newScript(completeSrc)
	releaseScript   = newScript(releaseSrc)
	renewScript     = newScript(renewSrc)
	statusScript    = newScript(statusSrc)
	forgetScript    = newScript(forgetSrc)
	stepScript      = newScript(stepSrc)
	stepCheckScript = newScript(stepCheckSrc)
	retryScript     = newScript(retrySrc)
)

// newScript inserts the helpers of lua/record.lua into a script where it
// says --[[lua/record.lua]], or else at its top.
func newScript(src string) pipeline.Script {
	src = strings.ReplaceAll(src, tombstoneMarker, tombstoneSrc)
	if strings.Contains(src, recordMarker) {
		src = strings.Replace(src, recordMarker, recordSrc, 1)
	} else {
		src = recordSrc + "\n" + src
	}
	return pipeline.NewScript(src)
}

const (
	recordMarker    = "--[[lua/record.lua]]"
	tombstoneMarker = "--[[lua/tombstone.lua]]"
)

// claimOnce runs lua/claim.lua once for the call: its claimKeys, the
// record's and its steps' checkpoints', and its claimArgs (see claim). The
// first of those, the record that a claim of a new key writes
// (claimRecord of attempt 1), also tells the script the call's
// fingerprint, owner token and lease. A registered operation's call
// (cl.op: Op.Do, or a recovery) stores its input beside the record and
// indexes it, in the same script.
func (cl *call) claimOnce(ctx context.Context) (claimReply, error) {
	c, keys, fp, op := cl.c, cl.claimKeys, cl.fp, cl.op
	first := cl.claimCmd[5]
	var v any
	var err error
	// The steps' checkpoints ride along: a takeover resets their TTL with
	// the record's (see lua/claim.lua).
	if op != nil {
		ks := []string{keys[0], keys[1]}
		var tk, tf any = "", ""
		if c.tomb.on {
			ks = append(ks, c.tomb.base(c.cfg.prefix, keys[0]))
			tk, tf = tombstoneField(keys[0]), fp[:min(len(fp), 8)]
		}
		ks = append(ks, keys[0]+inputSuffix, c.pendingKey(keys[0]))
		var max any = ""
		if op.recovery {
			max = c.maxRecoveries
		}
		v, err = c.write(ctx, claimScript, ks, first, c.retentionMs, c.ages, tk, tf, op.input,
			op.key, c.dueMs, max).Result()
	} else if c.tomb.on {
		tkeys := []string{keys[0], keys[1], c.tomb.base(c.cfg.prefix, keys[0])}
		v, err = c.write(ctx, claimScript, tkeys, first, c.retentionMs, c.ages,
			tombstoneField(keys[0]), fp[:min(len(fp), 8)]).Result()
	} else {
		// ARGV[3] only when observers want ages: claim.lua reads a
		// missing one as not wanted, and every argument costs a parse.
		a := cl.claimCmd[:7]
		if c.ages != "" {
			a = cl.claimCmd[:8]
		}
		v, err = c.writeArgs(ctx, claimScript, keys, a).Result()
	}
	if err != nil {
		return claimReply{}, err
	}
	return claimResult(v, fp, c.cfg.lease, c.cfg.retention)
}

// write runs a script that changes a record: alone, or in one pipeline with
// concurrent calls' scripts (see internal/pipeline). With WithReplicas, the script
// goes alone: it and a WAIT go in one pipeline, on one connection to the record's primary,
// and a shortfall of replicas is an error wrapping ErrNotReplicated (the
// script's reply is kept in the returned command all the same).
func (c *Client) write(ctx context.Context, s pipeline.Script, keys []string, args ...any) *redis.Cmd {
	if c.cfg.replicas == 0 {
		return c.scripts.Run(ctx, s, keys, args...)
	}
	return c.writeReplicated(ctx, s, keys, args)
}

// writeArgs is write with the script's command laid out as
// pipeline.RunArgs takes it, keys included (a must not change until the
// command is done).
func (c *Client) writeArgs(ctx context.Context, s pipeline.Script, keys []string, a []any) *redis.Cmd {
	if c.cfg.replicas == 0 {
		return c.scripts.RunArgs(ctx, s, a)
	}
	return c.writeReplicated(ctx, s, keys, a[3+len(keys):])
}

// writeReplicated runs s and a WAIT in one pipeline (see write).
func (c *Client) writeReplicated(ctx context.Context, s pipeline.Script, keys []string, args []any) *redis.Cmd {
	var node redis.Cmdable = c.rdb
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return pipeline.ErrCmd(ctx, err)
		}
		node = m
	}
	send := func(sha bool) (*redis.Cmd, *redis.Cmd) {
		pipe := node.Pipeline()
		var cmd *redis.Cmd
		if sha {
			cmd = pipe.EvalSha(ctx, s.Hash(), keys, args...)
		} else {
			cmd = pipe.Eval(ctx, s.Src, keys, args...)
		}
		w := pipe.Do(ctx, "WAIT", c.cfg.replicas, c.cfg.replicaWait.Milliseconds())
		_, _ = pipe.Exec(ctx)
		return cmd, w
	}
	cmd, w := send(true)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd, w = send(false)
	}
	if cmd.Err() != nil {
		return cmd
	}
	if err := w.Err(); err != nil {
		cmd.SetErr(fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err))
	} else if got, _ := w.Val().(int64); got < int64(c.cfg.replicas) {
		cmd.SetErr(fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, got, c.cfg.replicas, c.cfg.replicaWait))
	}
	return cmd
}
