/*
 * idem.pml: idem's protocol (the scripts claim, renew, complete and release
 * on one Redis record, the owner path that keeps a local lease deadline,
 * waiters woken by notifications, step checkpoints and tombstones), as a
 * Promela model checked by spin. model/README.md says how to run it, its
 * configurations and bounds, its mutants and its reachability witnesses.
 *
 * One key, NC callers. Each caller is one Do call with its own owner token
 * (token = caller number + 1). A discrete global clock (process Clock)
 * ticks: the server's time. Every duration is a count of ticks kept
 * relative to the present (time left, time since, capped where more makes
 * no difference), so the state space is finite without a time horizon and
 * runs may last for ever. The absolute time, `clock`, is hidden: printed in
 * trails, not part of the state.
 *
 * Each Lua script is one atomic step (d_step), run "by the server" in the
 * process of the caller that sent it. A request runs when it is sent, or
 * never (lost before the server saw it); its reply is received in a later
 * step, and the clock may tick any number of times in between: a reply
 * delayed, longer than a lease included. (A request that runs later than
 * it was sent is the same as one sent later by a caller that counts its
 * lease from the earlier send: only safer; see model/README.md.) A reply
 * lost and the request re-sent by go-redis is a second run of the same
 * request, any number of ticks later; the caller gets the last run's reply
 * and counts from the first send. A caller may pause for any number of
 * ticks (it takes no step while the clock ticks); a crash is a pause that
 * never ends (no caller is ever forced to take a step). The record expires
 * once its TTL has passed; Forget deletes it at any time. A caller's clock
 * may run slow (DRIFT): it loses up to DRIFT ticks in any LEASE ticks.
 *
 * Configurations (below): the default (main), RENEWALS, FINE, CHECKED (a
 * checked step and its provider), RECOVER (a recoverer) and LIVE.
 * Other switches: M1..M20, ML1, MC1..MC5 and MR1..MR4 (known-bad variants: the
 * mutants), WIT=n (reachability witness Wn), NOFORGET (no Forget: the
 * mutants' runs, so that their counterexamples need no operator's action),
 * ONLY=n (check property Pn alone: a mutant must be refuted by the
 * property it breaks, not by another), NOWAITERS, NOSTEPS, NOTOMB.
 */

/* ---- Configurations ---------------------------------------------------- */
/* The default (main): 3 callers, lease 3 ticks, margin 0, exact clocks,
 * one renewal in flight at a time, waiters and tombstones. RENEWALS: 2
 * callers, lease 3 ticks, two renewals in flight, steps and tombstones.
 * FINE: 2 callers, lease 6 ticks, margin 1, clocks that drift, one renewal
 * in flight. CHECKED: 2 callers, lease 3 ticks, one renewal in flight, fn's
 * one step a checked step (no waiters, tombstones or Forget). RECOVER: 2
 * callers and a recoverer, lease 3 ticks, one renewal in flight (no steps,
 * waiters, tombstones or Forget). LIVE: the restricted run for P6. Every
 * configuration but LIVE has every fault above. */
#if defined(LIVE)
#define NC_     3
#define LEASE_  6       /* a lease of 6 ticks, so that replies may come a tick late */
#define MARGIN_ 0
#define DRIFT   0
#define MAXR_   1
#define RET_    12
#elif defined(FINE)
#define NC_     2
#define LEASE_  6       /* a third is 2 ticks: "renew first" fires at 1 tick left too */
#define MARGIN_ 1       /* the owner's margin, for its clock's drift */
#define DRIFT   1       /* a caller's clock loses up to 1 tick in any LEASE ticks */
#define MAXR_   1
#define RET_    8
#elif defined(CHECKED)
#define NC_     2
#define LEASE_  3
#define MARGIN_ 0
#define DRIFT   0
#define MAXR_   1
#define RET_    6
#define CHK             /* fn's step is a checked step (StepChecked), with a provider */
#elif defined(RECOVER)
#define NC_     3
#define LEASE_  3
#define MARGIN_ 0
#define DRIFT   0
#define MAXR_   1
#define RET_    6
#define REC             /* the last caller is a recoverer (Recover), that sweeps twice */
#elif defined(RENEWALS)
#define NC_     2
#define LEASE_  3
#define MARGIN_ 0
#define DRIFT   0
#define MAXR_   2       /* two renewals in flight (the code's maxPendingRenewals) */
#define RET_    6
#ifndef NOSTEPS
#define STEPS           /* fn checkpoints a step */
#endif
#ifndef NOTOMB
#define TOMB            /* completion leaves a tombstone */
#endif
#else
#define NC_     3
#define LEASE_  3
#define MARGIN_ 0       /* exact clocks: no margin needed (FINE has both) */
#define DRIFT   0
#define MAXR_   1
#define RET_    6
#ifndef NOWAITERS
#define WAITERS         /* a waiter takes an outcome from a notification */
#endif
#ifndef NOTOMB
#define TOMB            /* completion leaves a tombstone */
#endif
#endif

#ifndef NC
#define NC      NC_     /* callers */
#endif
#if NC == 3
#define AND_C2(e) && (e)
#define SEQ_C2(s) ; s
#else
#define AND_C2(e)
#define SEQ_C2(s)
#endif
#ifndef LEASE
#define LEASE   LEASE_  /* lease, in ticks */
#endif
#define THIRD   (LEASE / 3) /* the renewal period, and the least lease left to start fn */
#ifndef MARGIN
#define MARGIN  MARGIN_ /* the owner's margin (the code: lease/32), taken off its deadline */
#endif
#ifndef RET
#define RET     RET_    /* retention: the TTL of a finished record, in ticks */
#endif
#ifndef MAXN
#define MAXN    4       /* bound: at most MAXN attempts per record lifetime */
#endif
#ifndef MAXXC
#define MAXXC   2       /* bound: a claim runs at most twice (sent; reply lost, re-sent) */
#endif
#ifndef MAXXK
#define MAXXK   2       /* bound: a completion runs at most twice */
#endif
#ifdef LIVE
#define FNMAX   (LEASE + 1) /* LIVE: fn returns within FNMAX ticks (> LEASE: it needs renewals) */
#define DMAX    1       /* LIVE: a reply comes within DMAX ticks of its request's first send (< LEASE/3) */
#endif

/* Property names: hidden constants (not in the state) that make pan's
 * "assertion violated" message name the property. */
hidden byte P1_at_most_one_live_fn = 1;
hidden byte P2_done_never_overwritten = 1;
hidden byte P3_stale_completion_fenced = 1;
hidden byte P4_attempt_numbers_unique = 1;
hidden byte P5_acked_outcome_replayed = 1;
hidden byte P7_cancelled_context_stays_cancelled = 1;
hidden byte P8_waiter_outcome_from_named_owner = 1;
hidden byte P9_step_checkpoint_once_by_owner = 1;
hidden byte P10_no_grant_over_tombstone = 1;
hidden byte P11_act_again_only_after_settled_not_applied = 1;
hidden byte P12_effect_at_most_once = 1;
hidden byte P13_parked_never_runs = 1;
hidden byte P14_one_outcome_for_every_caller = 1;
hidden byte WITNESS_reached = 1;

/* ONLY=n: property Pn alone is checked (a mutant's run). */
#ifdef ONLY
#define ON(n) (ONLY == n)
#else
#define ON(n) 1
#endif

/* ---- The record (one key) ---------------------------------------------- */
#define ABS 0   /* absent */
#define P   1   /* in progress: owner token, attempt, lease */
#define R   2   /* released: token, attempt */
#define D   3   /* finished: done or failed (every script treats "d" and "f" alike) */
byte rst;       /* state */
byte rown;      /* owner token (1..NC); 0 when absent */
byte rn;        /* attempt number, the fencing token */
byte rlease;    /* P: lease left, in ticks (0 = ended) */
byte rttl;      /* D: TTL left, in ticks; the record expires when it reaches 0 */
/* The TTL of P and R records. The code keeps the lease end as a mark on
 * the TTL (lua/record.lua): claim and renew set the TTL to the retention
 * and the lease to LEASE together, release keeps both. So an in-progress
 * record outlives its lease, and the model lets it expire at any time once
 * its lease has ended (the real expiry, RET - LEASE ticks later, is one of
 * those times); a released record at any time. */
/* M9 (renew does not reset the TTL) keeps the TTL of P records exactly:
 * rttl is then set by claims, and counted down for P records too. */
#ifdef ML1
bit  rremark;   /* ML1: renew rewrote the record's bytes */
#endif
#ifdef WAITERS
byte rout;      /* D: whose fn produced the outcome stored (the header's token, rown, unless M3) */
#endif
#ifdef STEPS
byte ck;        /* the operation's step checkpoint: 0 none, else the token that wrote it.
                 * It lives in the key's slot as long as the record (expiry and Forget
                 * take both); a finished record's checkpoints are never read */
#ifdef M20
bit  ckk;       /* M20: the checkpoints' TTL is at least the record's (set by the step
                 * script; a renewal or a takeover resets the record's TTL alone) */
#endif
#endif
#ifdef TOMB
#define TOMBSTONE rtomb
bit  rtomb;      /* a tombstone: the operation completed; it outlives the record */
#else
#define TOMBSTONE 0
#endif

#if defined(CHK) || defined(REC)
bit  pk;         /* the operation is parked (lua/record.lua, PARKED, in the checkpoints'
                  * hash): a claim that would take it over answers parked */
#endif
#ifdef CHK
/* The checked step's field in the checkpoints' hash (lua/stepcheck.lua). */
#define CF_NONE 0
#define CF_INT  1   /* "i": an intent of token cfo (act may have acted) */
#define CF_PARK 2   /* "u": parked (its outcome could not be settled) */
#define CF_DONE 3   /* a checkpoint: act's value, or check's */
byte cf;
byte cfo;        /* CF_INT: the token of the attempt that stored the intent */
bit  stl;        /* CF_INT: the intent is settled: SettleAfter has passed since it was
                  * stored, and every request sent under it has landed or been dropped
                  * (the provider's side of SettleAfter; model/README.md) */
/* The provider, without idempotency keys: it applies every request it receives. */
byte pend;       /* requests received, not yet applied nor dropped */
byte eff;        /* requests applied: the step's effect, this many times */
#endif
#ifdef REC
byte rc;         /* recoveries of the record that did not finish (WithMaxRecoveries) */
#ifndef MAXREC
#define MAXREC  1   /* WithMaxRecoveries in the model */
#endif
#endif

/* Checking aids (not part of the protocol). */
byte used;          /* P4: attempt numbers handed out while the record lives (bit n) */
bit  ackok[NC];     /* P5: the last run of c's completion answered 1 on a record that still lives */
bit  acked[NC];     /* P5: c received 1 for its completion, and that record still lives */
bit  fgt[NC];       /* P1: c's claim was of a record that Forget deleted (exempt from P1) */
#ifdef STEPS
bit  ckw;           /* P9: a checkpoint was written in this operation (this life of the record) */
#endif
#ifdef LIVE
bit  completed;     /* P6: some completion was stored */
#endif
#ifdef CHK
bit  sent1;         /* P11: act sent a request in this life of the record */
bit  rearmd;        /* P11: since, a check said not applied of a settled intent (or an operator did) */
#endif
#ifdef REC
byte ret1;          /* P14: the token whose outcome a Do returned first in this life of the record */
#endif
hidden byte clock;      /* absolute time, for trails */
hidden byte fnage[NC];  /* W10: ticks since fn started */
hidden byte attempt[NC];/* trails: the attempt a caller claimed */

/* ---- The callers ------------------------------------------------------- */
#define IDLE    0   /* about to send a claim (a new Do call, or again after "busy": waiting) */
#define CLAIMW  1   /* claim sent (and run), waiting for its reply */
#define PRERENW 2   /* claimed with < LEASE/3 left: one renewal sent before fn */
#define FN      3   /* fn started (its context live, or cancelled) */
#define COMPW   4   /* fn returned; completion sent (and run), waiting for its reply */
#define END     5   /* Do returned */

#define K_BUSY   1  /* claim replies */
#define K_DONE   2  /* a finished record: its outcome is replayed */
#define K_FRESH  3  /* "claimed n": the whole lease */
#define K_BEFORE 4  /* "claimed before, n, lease left": a re-sent claim */
#define K_LATE   5  /* no record but a tombstone: ErrLateRetry (or ErrConflict) */

byte pc[NC];
byte el[NC];      /* CLAIMW: ticks since the claim was sent, while it may run again (capped at LEASE) */
byte nx[NC];      /* runs of the claim or completion in flight */
byte rk[NC];      /* its last run's reply: claim K_*, completion 0/1 */
byte cdl[NC];     /* claim reply K_FRESH or K_BEFORE: the local deadline it gives,
                   * in ticks left, counted from when the claim was sent:
                   * LEASE - MARGIN, or the lease left - MARGIN */
byte dl[NC];      /* the owner's local deadline, in ticks left (0 = passed) */
bit  live[NC];    /* fn's context is live: fn runs and its context is not cancelled */
bit  relp[NC];    /* a release was sent in the background and has not run yet */

/* Renewals in flight: up to two per caller (the code's maxPendingRenewals),
 * in slots S0(c) and S1(c), the older in S0. */
#define S0(c) (2 * (c))
#define S1(c) (2 * (c) + 1)
#define RV_FREE 0   /* no renewal in this slot */
#define RV_RAN0 1   /* it ran and answered 0 (not ours); the reply is on its way */
#define RV_RAN1 2   /* it ran and answered 1 (renewed); the reply is on its way */
#define RV_LOST 3   /* lost before the server saw it: its reply will be an error */
byte rv[2 * NC];
byte rel[2 * NC]; /* ticks since that renewal was sent (counted while it may move the deadline; capped at LEASE) */
#ifdef M15
bit  rsec[2 * NC];/* M15: it was sent while another was in flight */
#endif
#ifdef M16
byte ls[NC];      /* M16: ticks since the latest renewal was sent (one shared lastSent) */
#endif

#ifndef MAXR
#define MAXR    MAXR_   /* bound: renewals in flight at once (the code: maxPendingRenewals = 2) */
#endif

#ifdef LIVE
byte fnt[NC];     /* LIVE: ticks since fn started (capped at FNMAX) */
#endif

#if DRIFT > 0
/* A slow clock: the caller's local counters (el, cdl, dl, rel) skip a
 * tick. At most DRIFT = 1 skipped tick in any LEASE ticks: sk counts the
 * ticks since the last one. Only the ticks after a send count for the
 * deadline that the send dates, so sk restarts (at LEASE: free to skip)
 * while the caller keeps no time. */
bit  slip[NC];    /* c's clock loses the next tick */
byte sk[NC];      /* ticks since c's clock last lost one (capped at LEASE) */
#endif

#ifdef WAITERS
/* One caller, WATCHER (the last; the others poll: callers are alike), is a
 * waiter: told busy with owner token wown, it watches the key's channel
 * until it owns or returns. The channel is lossy and reorders: every
 * completion publishes (owner token, outcome) to each watcher's mailbox,
 * which holds one message: a message published while it is full is lost
 * (so an older message may be taken after a newer one was published), and
 * any message may be lost before it is taken. */
#define WATCHER (NC - 1)
byte wown;        /* the owner token that the watcher's last busy reply named; 0 = not watching */
byte mb;          /* its mailbox: 0, or MSG(header token, whose outcome) */
#define MSG(h, o) ((h) * 4 + (o))
#define MSG_HDR(m) ((m) / 4)
#define MSG_OUT(m) ((m) % 4)
byte bo;          /* the owner token in the watcher's last busy reply */
#endif

#ifdef STEPS
byte sp[NC];      /* fn's step: 0 not reached, 1 ran (its checkpoint to write), 2 done */
#endif

#ifdef CHK
/* fn's checked step (StepChecked in stepchecked.go), its phase: */
#define CS_NO   0   /* not reached */
#define CS_BEGW 1   /* "begin" sent (and run): its reply cr is on its way */
#define CS_ACT  2   /* act runs: it sent its request to the provider (ra), or not */
#define CS_REC  3   /* reconciling: check is called */
#define CS_RARW 4   /* check said not applied: "rearm" sent (and run), its reply cr on its way */
#define CS_DONE 5   /* the step's value is known (checkpointed, or read): fn goes on */
byte cs[NC];
byte cr[NC];      /* the reply of "begin" or "rearm" in flight: */
#define CR_OK   1   /* begin: the intent is stored ("");  rearm: renewed, act runs again ({1, 0}) */
#define CR_INT  2   /* begin: an intent found: reconcile first;  rearm: too early ({2, ms}) */
#define CR_DONE 3   /* begin: a checkpoint found: the step's value */
#define CR_PARK 4   /* begin: parked (the step's marker "u") */
#define CR_NO   5   /* not the owner (0), or rearm: no intent ({3, 0}) */
bit  ra[NC];      /* act sent its request */
bit  old[NC];     /* its step began in an earlier life of the record, now gone */
/* act will send under the current intent: begin or rearm answered CR_OK. */
#define ARMED(c) ((cs[c] == CS_BEGW || cs[c] == CS_RARW) && cr[c] == CR_OK)
/* ... in this life of the record. */
#define ARMED_NOW(c) (ARMED(c) && !old[c])
#endif

#ifdef REC
/* The last caller is a recoverer (Client.Recover): it sweeps the index of
 * unfinished operations and takes one over by the same fenced claim as a
 * caller, but never creates a record; after one recovery it may sweep
 * again, with a new token (gen). */
#define RECOVERER (NC - 1)
#define ISREC(c) ((c) == RECOVERER)
byte gen[NC];     /* a recoverer's recovery: 0 the first, 1 the second */
#else
#define ISREC(c) 0
#endif

#ifdef REC
#define TOK(c)  ((c) + 1 + NC * gen[c]) /* a recoverer's second recovery has a token of its own */
#else
#define TOK(c)  ((c) + 1)
#endif
#define IDX(t)  (((t) - 1) % NC)        /* the caller that token t is of */
#define NAME(c) ('A' + (c))

/* ---- Witnesses ---------------------------------------------------------- */
/* Witnesses: with WIT=n, an assertion fails where event Wn is reached, and
 * the trail shows how. */
#ifdef WIT
#define WITNESS(n, cond) assert(WITNESS_reached && !(WIT == n && (cond)))
#else
#define WITNESS(n, cond) skip
#endif

/* ---- Properties -------------------------------------------------------- */
#define NOT_LIVE(k, c) (k == c || !live[k] || fgt[k])
#define ACK_OK(c) (!acked[c] || (rst == D && rown == TOK(c)))

/* P1, when fn starts (a context only becomes live there, and once
 * cancelled it stays cancelled: P7): no other caller's fn context is live. */
#define NOT_LIVE_AT_ALL(k, c) (k == c || !live[k])
inline check_P1(c) {
	assert(P1_at_most_one_live_fn && (!ON(1) || fgt[c] || (NOT_LIVE(0, c) && NOT_LIVE(1, c) AND_C2(NOT_LIVE(2, c)))));
	WITNESS(13, !(NOT_LIVE_AT_ALL(0, c) && NOT_LIVE_AT_ALL(1, c) AND_C2(NOT_LIVE_AT_ALL(2, c))))
}
/* P2, at every write: the record replaced is not finished (expiry and
 * Forget make it absent first). */
inline check_P2() {
	assert(P2_done_never_overwritten && (!ON(2) || rst != D))
}
/* P3, when a completion is stored: it replaces the completing caller's own
 * claim (a newer owner's claim has another token and a higher attempt). */
inline check_P3(c) {
	assert(P3_stale_completion_fenced && (!ON(3) || (rst == P && rown == TOK(c))))
}
/* P4, when a claim hands out attempt n: n was not handed out before while
 * the record lives. */
inline check_P4(n) {
	assert(P4_attempt_numbers_unique && (!ON(4) || (used & (1 << (n))) == 0));
	used = used | (1 << (n))
}
/* P5, at every run of a claim: every caller whose completion was
 * acknowledged finds its outcome stored, unless the record expired or was
 * forgotten since. */
inline check_P5() {
	assert(P5_acked_outcome_replayed && (!ON(5) || (ACK_OK(0) && ACK_OK(1) AND_C2(ACK_OK(2)))))
}
/* P7, wherever a context is made live: it is not a context of this fn that
 * was cancelled (in FN, not live means cancelled). Go's contract, which
 * fn relies on: once Done is closed, it stays closed. */
inline make_live(c) {
	assert(P7_cancelled_context_stays_cancelled && (!ON(7) || !(pc[c] == FN && !live[c])));
	live[c] = 1
}
#ifdef WAITERS
/* P8, when a waiter returns an outcome that a notification carried: it is
 * the outcome stored by the owner whose token the waiter's busy reply
 * named (its fn produced it), not another attempt's or operation's. */
inline check_P8(out) {
	assert(P8_waiter_outcome_from_named_owner && (!ON(8) || out == wown))
}
#endif
#ifdef STEPS
/* P9, when a step's checkpoint is written: none was written before in this
 * operation (this life of the record), and the writer owns the record's
 * claim (not a stale owner). */
inline check_P9(c) {
	assert(P9_step_checkpoint_once_by_owner && (!ON(9) || (!ckw && rst == P && rown == TOK(c))));
	ckw = 1
}
#endif
/* P10, when a claim grants: no tombstone lives (a completed operation's
 * key is never claimed again until its tombstone ends or is forgotten). */
inline check_P10() {
#ifdef TOMB
	assert(P10_no_grant_over_tombstone && (!ON(10) || !rtomb))
#else
	skip
#endif
}

#ifdef CHK
/* P11, when act sends its request: it sent none before in this life of
 * the record, or since the last, a check said "not applied" of a settled
 * intent (rearm), or an operator did (ResolveNotApplied). */
inline check_P11() {
	assert(P11_act_again_only_after_settled_not_applied && (!ON(11) || !sent1 || rearmd));
	sent1 = 1; rearmd = 0
}
/* P12, when the provider applies a request: the step's effect had not
 * happened in this life of the record. */
inline check_P12() {
	assert(P12_effect_at_most_once && (!ON(12) || eff == 0))
}
#endif
#if defined(CHK) || defined(REC)
/* P13, when fn starts and when a checked step's act is let run (begin or
 * rearm stores an intent): the operation is not parked. */
inline check_P13() {
	assert(P13_parked_never_runs && (!ON(13) || !pk))
}
#endif
#ifdef REC
/* P14, when a caller's Do gets an outcome (its own, acknowledged; or a
 * replay, when its claim runs): every Do of this life of the record got
 * this one. */
inline check_P14(o) {
	assert(P14_one_outcome_for_every_caller && (!ON(14) || ret1 == 0 || ret1 == (o)));
	ret1 = (o)
}
#endif

/* The record is gone (retention expiry, Forget): what was stored is lost by
 * design, and P4 and P5 start again. */
inline record_gone() {
	WITNESS(14, acked[0] || acked[1] AND_C2(acked[2]));
	rst = ABS; rown = 0; rn = 0; rlease = 0; rttl = 0;
#ifdef ML1
	rremark = 0;
#endif
#ifdef WAITERS
	rout = 0;
#endif
#ifdef STEPS
	ck = 0; ckw = 0;
#endif
#ifdef M20
	ckk = 0;
#endif
#if defined(CHK) || defined(REC)
	pk = 0;
#endif
#ifdef CHK
	/* The provider's requests of this life count no more (P11, P12 are
	 * per life: a new record's step runs act afresh, by design). */
	cf = CF_NONE; cfo = 0; stl = 0; pend = 0; eff = 0; sent1 = 0; rearmd = 0;
	old[0] = (cs[0] != CS_NO); old[1] = (cs[1] != CS_NO);
#endif
#ifdef REC
	rc = 0; ret1 = 0;
#endif
	used = 0;
	ackok[0] = 0; ackok[1] = 0 SEQ_C2(ackok[2] = 0);
	acked[0] = 0; acked[1] = 0 SEQ_C2(acked[2] = 0)
}

/* ---- The scripts (lua/*.lua), each one atomic step -------------------- */

/* A live lease has more than LIVE_ABOVE ticks left. */
#ifdef M12
#define LIVE_ABOVE 1 /* M12: a claim takes over with one tick of lease left */
#else
#define LIVE_ABOVE 0
#endif
/* The claim would take the record over: released, or a lease that ended. */
#define TAKES_OVER(c) ((rst == P && rown != TOK(c) && rlease <= LIVE_ABOVE) || rst == R)
/* Bound MAXN: a takeover past it is not explored (the claim is not sent). */
#ifdef M7
#define CLAIM_RUNNABLE(c) 1
#else
#define CLAIM_RUNNABLE(c) (!TAKES_OVER(c) || rn < MAXN)
#endif
#if defined(TOMB) && !defined(M19)
#define LATE (rst == ABS && rtomb)
#else
#define LATE 0 /* M19: a claim grants over a tombstone */
#endif

#define K_PARKED 6  /* (CHK, REC) a takeover finds the operation parked: ErrParked, fn not run */
#define K_NONE   7  /* (REC) a recovery finds no record, or a finished one: nothing to recover */

/* What refuses a takeover of a parked operation (lua/claim.lua, PARKED). */
#if defined(MC4)
#define PARKED_REFUSES(c) 0               /* MC4: a claim takes a parked operation over */
#elif defined(MR2)
#define PARKED_REFUSES(c) (pk && !ISREC(c)) /* MR2: a recoverer runs a parked operation */
#else
#define PARKED_REFUSES(c) pk
#endif
#ifdef MR1
#define REC_FENCED(c) (!ISREC(c))  /* MR1: a recoverer takes over any unfinished record, a live lease included */
#else
#define REC_FENCED(c) 1
#endif
#ifdef MR3
#define REC_TAKES_DONE(c) ISREC(c) /* MR3: a recoverer takes over a finished record (a stale index entry) */
#else
#define REC_TAKES_DONE(c) 0
#endif

/* A takeover: the next attempt, with the whole lease. */
inline take_over(c) {
	check_P2();
	check_P10();
	WITNESS(4, rst == P && pc[IDX(rown)] == FN);
#ifndef M7
	rn = rn + 1;
#endif
	/* M7: a takeover keeps the attempt number */
	check_P4(rn);
	rst = P; rown = TOK(c); rlease = LEASE;
#ifdef M20
	ckk = 0;
#endif
#ifdef M9
	rttl = RET;
#endif
#ifdef ML1
	rremark = 0;
#endif
	rk[c] = K_FRESH; cdl[c] = (LEASE > MARGIN + el[c] -> LEASE - MARGIN - el[c] : 0)
}

/* Model: step Claim (lua/claim.lua), run el[c] ticks after it was sent. A
 * recoverer's claim (REC) is the same script: it only takes records over,
 * and counts the recoveries; past MAXREC it parks the record instead. */
inline claim_script(c) {
	check_P5();
	if
	:: LATE ->
		WITNESS(24, 1);
		rk[c] = K_LATE; cdl[c] = 0
	:: rst == ABS && !LATE && !ISREC(c) ->
		check_P10();
		check_P4(1);
		rst = P; rown = TOK(c); rn = 1; rlease = LEASE;
#ifdef M9
		rttl = RET;
#endif
		rk[c] = K_FRESH; cdl[c] = (LEASE > MARGIN + el[c] -> LEASE - MARGIN - el[c] : 0)
#ifdef REC
	:: rst == ABS && !LATE && ISREC(c) ->
		rk[c] = K_NONE; cdl[c] = 0
	:: rst == D && ISREC(c) && !REC_TAKES_DONE(c) ->
		rk[c] = K_NONE; cdl[c] = 0
	:: rst == D && !ISREC(c) ->
		/* The outcome this reply carries, the one Do returns (P14). */
		WITNESS(36, IDX(rown) == RECOVERER);
		check_P14(rown);
		rk[c] = K_DONE; cdl[c] = 0
#else
	:: rst == D ->
		rk[c] = K_DONE; cdl[c] = 0
#endif
	:: rst == P && rown == TOK(c) ->
		WITNESS(2, rlease == 0);
		rk[c] = K_BEFORE;
		if
		:: rlease > MARGIN + el[c] -> cdl[c] = rlease - MARGIN - el[c]
		:: else -> cdl[c] = 0
		fi
	:: rst == P && rown != TOK(c) && rlease > LIVE_ABOVE && REC_FENCED(c) ->
		rk[c] = K_BUSY; cdl[c] = 0
#ifdef WAITERS
		; if
		:: c == WATCHER -> bo = rown
		:: else
		fi
#endif
	:: else -> /* TAKES_OVER(c) */
#if defined(CHK) || defined(REC)
		if
		:: PARKED_REFUSES(c) ->
			WITNESS(32, 1);
			rk[c] = K_PARKED; cdl[c] = 0
#ifdef REC
		:: !PARKED_REFUSES(c) && !pk && ISREC(c) && rc >= MAXREC ->
			/* WithMaxRecoveries: parked, and the lease taken away (the
			 * record released), so that its old owner can neither renew
			 * nor complete it (MR4: not taken away). */
			check_P2();
			WITNESS(34, 1);
#ifndef MR4
			rst = R; rlease = 0;
#endif
			pk = 1;
			rk[c] = K_PARKED; cdl[c] = 0
		:: else ->
			if
			:: ISREC(c) -> rc++; WITNESS(35, rst == P)
			:: else
			fi;
			take_over(c)
#else
		:: else -> take_over(c)
#endif
		fi
#else
		take_over(c)
#endif
	fi;
	attempt[c] = rn
}

/* Model: step Renew (lua/renew.lua), the renewal in slot s. */
inline renew_script(c, s) {
	if
	:: rst == P && rown == TOK(c) ->
		WITNESS(3, rlease == 0);
		rlease = LEASE;
		/* M9: the lease is extended, the TTL is not reset */
#ifdef M20
		ckk = 0; /* the record's TTL is reset; the checkpoints' is not */
#endif
#ifdef ML1
		rremark = 1;
#endif
		rv[s] = RV_RAN1
	:: else -> rv[s] = RV_RAN0
	fi
}

/* Model: step Complete (lua/complete.lua): compare-and-set on the claim.
 * The code compares the owner token (its fast path the whole claimed
 * record, token and attempt included); a token claims one attempt at a
 * time, so in the model the token decides. */
#if defined(M10)
/* M10: a finished record is stored over again instead of answered */
#define COMPLETE_CAS(c) ((rst == P && rown == TOK(c)) || rst == D)
#elif defined(M3)
/* M3: no compare-and-set on the owner token: any claim in progress */
#define COMPLETE_CAS(c) (rst == P)
#elif defined(ML1)
/* ML1: the compare-and-set compares the whole record, which renew rewrote */
#define COMPLETE_CAS(c) (rst == P && rown == TOK(c) && !rremark)
#else
#define COMPLETE_CAS(c) (rst == P && rown == TOK(c))
#endif
#ifdef M8
/* M8: a repeat answers 1 for any finished record, not only the caller's own */
#define COMPLETE_REPEAT(c) (rst == D)
#else
#define COMPLETE_REPEAT(c) (rst == D && rown == TOK(c))
#endif

#ifdef WAITERS
/* complete.lua publishes the finished record, its header's token (the
 * record's owner) and the outcome, into the watcher's mailbox; lost when
 * the mailbox is full. */
inline publish() {
	if
	:: wown != 0 && mb == 0 -> mb = MSG(rown, rout)
	:: wown != 0 && mb != 0 -> WITNESS(19, 1)
	:: else
	fi
}
#endif

inline complete_script(c) {
	if
	:: COMPLETE_CAS(c) ->
		check_P2();
		check_P3(c);
		rst = D; rlease = 0; rttl = RET; /* the header (token, attempt) stays */
#ifdef LIVE
		completed = 1;
#endif
#ifdef STEPS
		ck = 0; ckw = 0;
#endif
#if defined(CHK) || defined(REC)
		pk = 0; /* a finished record's checkpoints (and marker) are never read */
#endif
#ifdef CHK
		cf = CF_NONE; cfo = 0; stl = 0;
#endif
#ifdef REC
		rc = 0;
#endif
#ifdef M20
		ckk = 0;
#endif
#ifdef TOMB
		rtomb = 1;
#endif
#ifdef WAITERS
		rout = TOK(c);
		publish();
#endif
		rk[c] = 1; ackok[c] = 1
	:: else ->
		if
		:: COMPLETE_REPEAT(c) ->
			WITNESS(8, nx[c] == 2);
			rk[c] = 1; ackok[c] = 1
		:: else ->
			WITNESS(9, rst == P && rown != TOK(c));
			rk[c] = 0; ackok[c] = 0
		fi
	fi
}

/* Model: step Release (lua/release.lua). */
#ifdef M5
/* M5: release without the token check */
#define RELEASE_OWN(c) (rst == P)
#else
#define RELEASE_OWN(c) (rst == P && rown == TOK(c))
#endif
inline release_script(c) {
	WITNESS(11, rst == P && rown != TOK(c));
	if
	:: RELEASE_OWN(c) ->
		check_P2();
		rst = R; rlease = 0 /* the TTL is kept; a released record's lease is never read */
#ifdef M11
	/* M11: a release deletes a finished record (not an expiry: what was
	 * acknowledged is lost) */
	:: rst == D ->
		check_P2();
		rst = ABS; rown = 0; rn = 0; rttl = 0; used = 0
#ifdef WAITERS
		; rout = 0
#endif
#endif
	:: else
	fi
}

#ifdef STEPS
/* Model: step Step (lua/step.lua, a write): compare-and-set on the owner's
 * claim, in progress; a checkpoint once stored is never replaced. */
#ifdef M18
#define STEP_CAS(c) (rst == P && ck == 0) /* M18: no compare-and-set on the owner token */
#else
#define STEP_CAS(c) (rst == P && rown == TOK(c) && ck == 0)
#endif
inline checkpoint_script(c) {
	if
	:: STEP_CAS(c) ->
		check_P9(c);
		ck = TOK(c);
#ifdef M20
		ckk = 1;
#endif
		printf("t=%d %c: step checkpoint written\n", clock, NAME(c))
	:: else ->
		WITNESS(23, rst == P && rown != TOK(c));
		printf("t=%d %c: step checkpoint refused (not the owner, or one is stored): ErrLeaseLost\n", clock, NAME(c))
	fi
}
#endif

#ifdef CHK
/* Model: step Checked (lua/stepcheck.lua): every operation but the
 * operator's "resolve" is a compare-and-set on the owner's claim, in
 * progress, as in lua/step.lua. */
#ifdef MC3
#define CHK_FENCE(c) 1 /* MC3: begin and rearm write without the compare-and-set on the owner token */
#else
#define CHK_FENCE(c) (rst == P && rown == TOK(c))
#endif
#define CHK_OWNS(c) (rst == P && rown == TOK(c))
#ifdef MC1
#define BEGIN_MINE(c) (cf == CF_INT) /* MC1: begin stores its intent over any intent: act first on a takeover */
#else
#define BEGIN_MINE(c) (cf == CF_INT && cfo == TOK(c))
#endif
#ifdef MC2
#define REARM_SETTLED 1 /* MC2: check's "not applied" is honoured before SettleAfter */
#else
#define REARM_SETTLED stl
#endif
/* "begin": before act runs. */
inline begin_script(c) {
	if
	:: !CHK_FENCE(c) ->
		WITNESS(31, 1);
		cr[c] = CR_NO
	:: else ->
		if
		:: cf == CF_NONE || BEGIN_MINE(c) ->
			check_P13();
			cf = CF_INT; cfo = TOK(c); stl = 0; cr[c] = CR_OK
		:: cf == CF_INT -> WITNESS(25, 1); cr[c] = CR_INT
		:: cf == CF_PARK -> cr[c] = CR_PARK
		:: cf == CF_DONE -> cr[c] = CR_DONE
		fi
	fi
}
/* "rearm": check said not applied. */
inline rearm_script(c) {
	if
	:: !CHK_FENCE(c) || cf != CF_INT -> cr[c] = CR_NO
	:: else ->
		if
		:: REARM_SETTLED ->
			WITNESS(27, cfo != TOK(c));
			check_P13();
			rearmd = stl; /* P11: the "not applied" counts */
			cfo = TOK(c); stl = 0; cr[c] = CR_OK
		:: else -> WITNESS(26, 1); cr[c] = CR_INT
		fi
	fi
}
/* "store": the step's value (act's, or check's "applied") replaces the
 * intent. 1 (the step goes on), or refused (parked, not the owner). */
inline store_script(c) {
	if
	:: CHK_OWNS(c) && cf != CF_PARK ->
		cf = CF_DONE; cfo = 0; stl = 0;
		cs[c] = CS_DONE;
		printf("t=%d %c: the step's value is checkpointed\n", clock, NAME(c))
	:: else ->
		printf("t=%d %c: the step's checkpoint is refused: the step returns an error; release sent\n", clock, NAME(c));
		relp[c] = 1;
		finish(c)
	fi
}
/* "clear": act failed without acting. */
inline clear_script(c) {
	if
	:: CHK_OWNS(c) && cf == CF_INT -> cf = CF_NONE; cfo = 0; stl = 0
	:: else
	fi
}
/* "park": ReconcileFor ended with no answer. */
inline park_script(c) {
	if
	:: CHK_OWNS(c) && cf == CF_INT -> cf = CF_PARK; pk = 1
	:: else
	fi
}
#endif

/* Status (lua/status.lua) only reads: no caller acts on its answer. */

/* ---- The owner path (the Go code) -------------------------------------- */

/* Trails: the record, in words. */
inline print_record() {
	if
	:: rst == ABS -> printf("[record absent")
	:: rst == P -> printf("[record: in progress, owner %c, attempt %d, lease left %d", 'A' + IDX(rown), rn, rlease)
	:: rst == R -> printf("[record: released, owner %c, attempt %d", 'A' + IDX(rown), rn)
	:: rst == D -> printf("[record: done by %c, attempt %d, TTL %d", 'A' + IDX(rown), rn, rttl)
	fi;
#ifdef STEPS
	if
	:: ck != 0 -> printf(", step checkpoint by %c", 'A' + ck - 1)
	:: else
	fi;
#endif
#ifdef TOMB
	if
	:: rtomb -> printf("; tombstone")
	:: else
	fi;
#endif
	printf("]")
}
/* Trails: a claim's reply, in words. */
inline print_claim_reply(c) {
	if
	:: rk[c] == K_BUSY -> printf("busy")
	:: rk[c] == K_DONE -> printf("finished")
	:: rk[c] == K_FRESH -> printf("claimed attempt %d", rn)
	:: rk[c] == K_BEFORE -> printf("claimed before: attempt %d, lease left %d", rn, rlease)
	:: rk[c] == K_LATE -> printf("late retry: tombstone")
	:: rk[c] == K_PARKED -> printf("parked")
	:: rk[c] == K_NONE -> printf("nothing to recover")
	fi
}

inline clear_request(c) {
	nx[c] = 0; rk[c] = 0; cdl[c] = 0; el[c] = 0
#ifdef WAITERS
	; if
	:: c == WATCHER -> bo = 0
	:: else
	fi
#endif
}
inline clear_slot(s) {
	rv[s] = RV_FREE; rel[s] = 0
#ifdef M15
	; rsec[s] = 0
#endif
}
/* Slot s's reply came (or failed): free it, the older in S0. */
inline free_slot(c, s) {
	clear_slot(s)
#if MAXR == 2
	; if
	:: rv[S0(c)] == RV_FREE && rv[S1(c)] != RV_FREE ->
		rv[S0(c)] = rv[S1(c)]; rel[S0(c)] = rel[S1(c)];
#ifdef M15
		rsec[S0(c)] = rsec[S1(c)];
#endif
		clear_slot(S1(c))
	:: else
	fi
#endif
}
inline clear_renewals(c) {
	clear_slot(S0(c)); clear_slot(S1(c))
#ifdef M16
	; ls[c] = 0
#endif
}
#ifdef WAITERS
inline stop_watching(c) {
	if
	:: c == WATCHER -> wown = 0; mb = 0
	:: else
	fi
}
#endif
/* Do returns. Every caller-side variable but the background release and
 * what P5 needs goes back to zero (fewer states). */
inline finish(c) {
	pc[c] = END; clear_request(c); clear_renewals(c);
	dl[c] = 0; live[c] = 0; fgt[c] = 0
#ifdef LIVE
	; fnt[c] = 0
#endif
#ifdef WAITERS
	; stop_watching(c)
#endif
#ifdef STEPS
	; sp[c] = 0
#endif
#ifdef CHK
	; cs[c] = CS_NO; cr[c] = 0; ra[c] = 0; old[c] = 0
#endif
}
/* fn starts: P1 and P13 are checked; the waiter stops watching. */
inline start_fn(c) {
	printf("t=%d %c: fn starts as attempt %d, deadline in %d\n", clock, NAME(c), attempt[c], dl[c]);
	check_P1(c);
#if defined(CHK) || defined(REC)
	check_P13();
#endif
	make_live(c); fnage[c] = 0; pc[c] = FN
#ifdef WAITERS
	; stop_watching(c)
#endif
}
/* Model: step RenewBeforeFn. With the local deadline set: start fn if at
 * least a third of a lease is left, or send one renewal first. */
inline start_or_renew(c) {
	if
	:: dl[c] >= THIRD -> start_fn(c)
	:: else ->
		WITNESS(21, dl[c] > 0);
		pc[c] = PRERENW;
		printf("t=%d %c: %d left: renewal sent before fn\n", clock, NAME(c), dl[c]);
		renew_script(c, S0(c));
		rel[S0(c)] = 0;
		printf("t=%d %c:   -> %d ", clock, NAME(c), rv[S0(c)] == RV_RAN1); print_record(); printf("\n")
	fi
}

/* The deadline a renewal's reply 1 gives, counted from its own send, as
 * ticks left (0 = passed). */
#define DATED(a) ((a) + MARGIN < LEASE -> LEASE - MARGIN - (a) : 0)
#if defined(M2)
#define RENEWED(c, s) (LEASE - MARGIN) /* M2: counted from its reply */
#elif defined(M15)
/* M15: a renewal sent while another was in flight is counted from its reply */
#define RENEWED(c, s) (rsec[s] -> LEASE - MARGIN : DATED(rel[s]))
#elif defined(M16)
#define RENEWED(c, s) DATED(ls[c]) /* M16: counted from the latest renewal's send */
#else
#define RENEWED(c, s) DATED(rel[s])
#endif

/* Model: step Renew (the owner's side): the reply of the renewal in slot s.
 * A reply 1 moves the deadline to its own send + LEASE - MARGIN if that is
 * later (an older reply that comes late moves nothing back); a reply 0
 * cancels fn's context. A cancelled context stays cancelled. */
inline renewal_reply(c, s) {
	if
	:: rv[s] == RV_RAN1 && live[c] ->
		WITNESS(15, rv[S1(c)] != RV_FREE && RENEWED(c, s) > dl[c]);
		if
		:: RENEWED(c, s) > dl[c] -> dl[c] = RENEWED(c, s)
		:: else
		fi;
		if
		:: dl[c] == 0 -> live[c] = 0 /* only where M6 held the context */
		:: else
		fi;
		printf("t=%d %c: renewal reply 1, sent %d ticks ago: deadline in %d\n", clock, NAME(c), rel[s], dl[c])
	:: rv[s] == RV_RAN1 && !live[c] ->
#ifdef M13
		/* M13: a late reply 1 revives the cancelled context */
		if
		:: RENEWED(c, s) > 0 ->
			dl[c] = RENEWED(c, s);
			printf("t=%d %c: renewal reply 1, late: fn's context live again, deadline in %d\n", clock, NAME(c), dl[c]);
			make_live(c)
		:: else ->
			printf("t=%d %c: renewal reply 1, too late: fn's context stays cancelled\n", clock, NAME(c))
		fi
#else
		printf("t=%d %c: renewal reply 1, too late: fn's context stays cancelled\n", clock, NAME(c))
#endif
	:: else -> /* RV_RAN0 */
		if
		:: live[c] -> printf("t=%d %c: renewal reply 0: fn's context cancelled (lease lost)\n", clock, NAME(c))
		:: else
		fi;
		live[c] = 0; dl[c] = 0
	fi;
	free_slot(c, s)
}
/* A renewal sent into slot s: it runs, or it is lost before it runs. */
inline renewal_sent(c, s) {
#ifdef M15
	rsec[s] = (s == S1(c));
#endif
#ifdef M16
	ls[c] = 0;
#endif
	rel[s] = 0
}

#ifdef WAITERS
/* The watcher takes the notification in its mailbox. */
inline take_note(c) {
#ifdef M17
	if
	:: 1 -> /* M17: a notification of any token is accepted */
#else
	if
	:: MSG_HDR(mb) == wown ->
#endif
		WITNESS(17, 1);
		printf("t=%d %c: notification: %c's outcome (record of owner %c); Do returns it\n", clock, NAME(c), 'A' + MSG_OUT(mb) - 1, 'A' + MSG_HDR(mb) - 1);
		check_P8(MSG_OUT(mb));
		finish(c)
	:: else ->
		WITNESS(18, 1);
		printf("t=%d %c: notification of owner %c, not %c's: claims again\n", clock, NAME(c), 'A' + MSG_HDR(mb) - 1, 'A' + wown - 1);
		mb = 0
	fi
}
#endif

#ifdef CHK
#define FN_MAY_RETURN(c) (cs[c] == CS_DONE) /* fn returns after its checked step */
#else
#define FN_MAY_RETURN(c) 1
#endif

/* The caller keeps time: a deadline runs, or will be dated from a send. */
#define TIMED(c) (pc[c] == CLAIMW || pc[c] == PRERENW || (pc[c] == FN && (live[c] || rv[S0(c)] != RV_FREE)))

proctype Caller(byte me) {
end:
	do
	/* Model: step Claim (the owner path's `sent`, then the script). */
	:: d_step { pc[me] == IDLE && CLAIM_RUNNABLE(me) ->
		pc[me] = CLAIMW; clear_request(me);
		nx[me] = 1; fgt[me] = 0;
		printf("t=%d %c: claim sent\n", clock, NAME(me));
		claim_script(me);
		printf("t=%d %c:   -> ", clock, NAME(me)); print_claim_reply(me);
		printf(" "); print_record(); printf("\n") }
#ifndef LIVE
	/* The claim is lost before it runs, Do returns an error and sends a
	 * release in the background (it cannot know the claim did not run). */
	:: d_step { pc[me] == IDLE ->
		printf("t=%d %c: claim lost: release sent in the background; Do returns an error\n", clock, NAME(me));
		relp[me] = 1;
		finish(me) }
#endif
	/* Its reply is lost and go-redis sends the claim again. */
	:: d_step { pc[me] == CLAIMW && nx[me] < MAXXC && CLAIM_RUNNABLE(me) ->
		nx[me]++;
		fgt[me] = 0;
		if
		:: el[me] < LEASE -> printf("t=%d %c: claim reply lost; re-sent %d ticks after the first send\n", clock, NAME(me), el[me])
		:: else -> printf("t=%d %c: claim reply lost; re-sent %d or more ticks after the first send\n", clock, NAME(me), el[me])
		fi;
		claim_script(me);
		printf("t=%d %c:   -> ", clock, NAME(me)); print_claim_reply(me);
		printf(" "); print_record(); printf("\n");
#ifndef LIVE
		if
		:: nx[me] == MAXXC -> el[me] = 0 /* no more runs: no need to count */
		:: else
		fi
#endif
		}
	/* Model: step ClaimReply. The reply arrives (the last run's). */
	:: d_step { pc[me] == CLAIMW ->
		WITNESS(1, rk[me] == K_FRESH && cdl[me] == 0);
		if
		:: rk[me] == K_DONE ->
			printf("t=%d %c: reply: finished, the outcome is replayed\n", clock, NAME(me));
			finish(me)
#if defined(CHK) || defined(REC)
		:: rk[me] == K_PARKED ->
			printf("t=%d %c: reply: parked: ErrParked, fn not run\n", clock, NAME(me));
			finish(me)
#endif
#ifdef REC
		:: rk[me] == K_NONE ->
			printf("t=%d %c: reply: no record, or a finished one: nothing to recover\n", clock, NAME(me));
			finish(me)
#endif
		:: rk[me] == K_LATE ->
			printf("t=%d %c: reply: late retry (a tombstone, no record): ErrLateRetry, fn not run\n", clock, NAME(me));
			finish(me)
		:: rk[me] == K_BUSY ->
#ifdef WAITERS
			if
			:: me == WATCHER ->
				wown = bo;
				printf("t=%d %c: reply: busy (owner %c); waits for its notification, or claims again\n", clock, NAME(me), 'A' + wown - 1)
			:: else ->
				printf("t=%d %c: reply: busy; waits, then claims again\n", clock, NAME(me))
			fi;
#else
			printf("t=%d %c: reply: busy; waits, then claims again\n", clock, NAME(me));
#endif
			clear_request(me); pc[me] = IDLE
		:: rk[me] == K_FRESH ->
#ifdef M1
			/* M1: the deadline counts from the reply, not from when the claim was sent */
			dl[me] = LEASE - MARGIN;
#else
			dl[me] = cdl[me];
#endif
			printf("t=%d %c: reply: claimed attempt %d; deadline in %d\n", clock, NAME(me), attempt[me], dl[me]);
			clear_request(me);
			start_or_renew(me)
		:: rk[me] == K_BEFORE ->
#ifdef M4
			/* M4: "yours" without the lease left: fn starts at once, on a whole lease */
			dl[me] = LEASE - MARGIN;
			printf("t=%d %c: reply: yours, attempt %d\n", clock, NAME(me), attempt[me]);
			clear_request(me);
			start_fn(me)
#else
			dl[me] = cdl[me];
			printf("t=%d %c: reply: claimed before, attempt %d; deadline in %d\n", clock, NAME(me), attempt[me], dl[me]);
			clear_request(me);
			start_or_renew(me)
#endif
		fi }
#ifndef LIVE
	/* The claim fails for the caller (replies lost, a timeout): it ran, so
	 * a release is sent in the background; Do returns an error. */
	:: d_step { pc[me] == CLAIMW ->
		printf("t=%d %c: claim outcome unknown: release sent in the background; Do returns an error\n", clock, NAME(me));
		relp[me] = 1;
		finish(me) }
#endif

#ifdef WAITERS
	/* Model: step Notify. A waiting caller takes the notification in its
	 * mailbox: the outcome of the owner it waits for is returned; any
	 * other makes it claim again. */
	:: d_step { me == WATCHER && pc[me] == IDLE && wown != 0 && mb != 0 ->
		take_note(me) }
	/* A notification is lost. */
	:: d_step { me == WATCHER && mb != 0 ->
		printf("t=%d %c: a notification is lost\n", clock, NAME(me));
		mb = 0 }
#endif

	/* The reply of the renewal before fn. */
	:: d_step { pc[me] == PRERENW ->
		if
		:: rv[S0(me)] == RV_RAN1 ->
#ifdef M2
			/* M2: the new deadline counts from the reply, not from when the renewal was sent */
			dl[me] = LEASE - MARGIN;
#else
			dl[me] = DATED(rel[S0(me)]);
#endif
			printf("t=%d %c: renewal reply 1, sent %d ticks ago: deadline in %d\n", clock, NAME(me), rel[S0(me)], dl[me]);
			clear_renewals(me);
			if
			:: dl[me] >= THIRD -> start_fn(me)
			:: else ->
				printf("t=%d %c: still too little lease: release sent in the background; fn does not run\n", clock, NAME(me));
				relp[me] = 1;
				finish(me)
			fi
		:: else ->
			printf("t=%d %c: renewal reply 0: not ours; claims again\n", clock, NAME(me));
			clear_renewals(me); dl[me] = 0; fgt[me] = 0;
			pc[me] = IDLE
		fi }
#ifndef LIVE
	:: d_step { pc[me] == PRERENW ->
		printf("t=%d %c: the renewal before fn failed: release sent in the background; Do returns an error\n", clock, NAME(me));
		relp[me] = 1;
		finish(me) }
#endif

	/* Model: step Renew (the owner's side). While fn runs, up to two
	 * renewals in flight. The code sends one a third of a lease after the
	 * last send (the first two thirds of a lease before the deadline); the
	 * model lets it be sent at any time (a superset), but in the LIVE run,
	 * where it is sent when due, one at a time. */
#ifdef LIVE
	:: d_step { pc[me] == FN && live[me] && rv[S0(me)] == RV_FREE && dl[me] <= 2 * THIRD ->
		printf("t=%d %c: renewal sent\n", clock, NAME(me));
		renewal_sent(me, S0(me));
		renew_script(me, S0(me));
		printf("t=%d %c:   -> %d ", clock, NAME(me), rv[S0(me)] == RV_RAN1); print_record(); printf("\n") }
#else
#if MAXR == 2
	:: d_step { pc[me] == FN && live[me] && rv[S1(me)] == RV_FREE ->
		if
		:: rv[S0(me)] == RV_FREE ->
			printf("t=%d %c: renewal sent\n", clock, NAME(me));
			renewal_sent(me, S0(me)); renew_script(me, S0(me));
			printf("t=%d %c:   -> %d ", clock, NAME(me), rv[S0(me)] == RV_RAN1)
		:: else ->
			printf("t=%d %c: renewal sent, another still in flight\n", clock, NAME(me));
			renewal_sent(me, S1(me)); renew_script(me, S1(me));
			printf("t=%d %c:   -> %d ", clock, NAME(me), rv[S1(me)] == RV_RAN1)
		fi;
		print_record(); printf("\n") }
	/* A renewal is lost before the server sees it (dropped, or abandoned
	 * at its timeout while queued): its reply will be an error. */
	:: d_step { pc[me] == FN && live[me] && rv[S1(me)] == RV_FREE ->
		printf("t=%d %c: renewal sent, and lost before it runs\n", clock, NAME(me));
		if
		:: rv[S0(me)] == RV_FREE -> renewal_sent(me, S0(me)); rv[S0(me)] = RV_LOST
		:: else -> renewal_sent(me, S1(me)); rv[S1(me)] = RV_LOST
		fi }
#else
	:: d_step { pc[me] == FN && live[me] && rv[S0(me)] == RV_FREE ->
		printf("t=%d %c: renewal sent\n", clock, NAME(me));
		renewal_sent(me, S0(me)); renew_script(me, S0(me));
		printf("t=%d %c:   -> %d ", clock, NAME(me), rv[S0(me)] == RV_RAN1); print_record(); printf("\n") }
	/* A renewal is lost before the server sees it (dropped, or abandoned
	 * at its timeout while queued): its reply will be an error. */
	:: d_step { pc[me] == FN && live[me] && rv[S0(me)] == RV_FREE ->
		printf("t=%d %c: renewal sent, and lost before it runs\n", clock, NAME(me));
		renewal_sent(me, S0(me)); rv[S0(me)] = RV_LOST }
#endif
#endif
	/* A renewal's reply arrives (replies come in any order). */
	:: d_step { pc[me] == FN && (rv[S0(me)] == RV_RAN0 || rv[S0(me)] == RV_RAN1) ->
		renewal_reply(me, S0(me)) }
#if MAXR == 2
	:: d_step { pc[me] == FN && (rv[S1(me)] == RV_RAN0 || rv[S1(me)] == RV_RAN1) ->
		renewal_reply(me, S1(me)) }
#endif
#ifndef LIVE
	/* A renewal fails: its reply is lost (a timeout), or it was lost before
	 * it ran; the next is sent later. */
	:: d_step { pc[me] == FN && rv[S0(me)] != RV_FREE ->
		printf("t=%d %c: renewal failed (reply lost, or never ran)\n", clock, NAME(me));
		free_slot(me, S0(me));
		if
		:: dl[me] == 0 -> live[me] = 0 /* only where M6 held the context */
		:: else
		fi }
#if MAXR == 2
	:: d_step { pc[me] == FN && rv[S1(me)] != RV_FREE ->
		printf("t=%d %c: renewal failed (reply lost, or never ran)\n", clock, NAME(me));
		free_slot(me, S1(me));
		if
		:: dl[me] == 0 -> live[me] = 0
		:: else
		fi }
#endif
#endif
#ifdef STEPS
	/* Model: step Step (the owner's side). fn reaches its step: the
	 * checkpoint, if one was written in this operation, is read instead of
	 * running the step; else the step runs and its checkpoint is sent. */
	:: d_step { pc[me] == FN && sp[me] == 0 ->
		if
		:: ck != 0 ->
#ifdef M20
			ckk = ckk || (rst == P && rown == TOK(me));
#endif
			WITNESS(22, ck != TOK(me));
			printf("t=%d %c: step: checkpoint by %c read; the step does not run\n", clock, NAME(me), 'A' + ck - 1);
			sp[me] = 2
		:: else ->
			printf("t=%d %c: step: no checkpoint; the step runs\n", clock, NAME(me));
			sp[me] = 1
		fi }
	:: d_step { pc[me] == FN && sp[me] == 1 ->
		printf("t=%d %c: step checkpoint sent\n", clock, NAME(me));
		checkpoint_script(me);
		sp[me] = 2 }
	/* The checkpoint is lost before it runs: Step returns an error. */
	:: d_step { pc[me] == FN && sp[me] == 1 ->
		printf("t=%d %c: step checkpoint lost before it runs\n", clock, NAME(me));
		sp[me] = 2 }
#endif
#ifdef CHK
	/* Model: step Checked (the owner's side: StepChecked). fn reaches its
	 * checked step, its context live or not: "begin" is sent (and runs). */
	:: d_step { pc[me] == FN && cs[me] == CS_NO ->
		begin_script(me);
		cs[me] = CS_BEGW;
		printf("t=%d %c: checked step: begin sent\n", clock, NAME(me));
		printf("t=%d %c:   -> %d ", clock, NAME(me), cr[me]); print_record(); printf("\n") }
	/* begin's or rearm's reply "act may run" arrives: act runs and sends
	 * its request (whatever fn's context: StepChecked does not look). */
	:: d_step { pc[me] == FN && ARMED(me) ->
		if
		:: !old[me] ->
			check_P11();
			pend++;
			printf("t=%d %c: act sends its request to the provider\n", clock, NAME(me))
		:: else ->
			/* The record it was let run in is gone (retention, by design:
			 * the intent lives as long as the record): this request is of
			 * that life, not counted in this one. */
			WITNESS(33, 1);
			printf("t=%d %c: act sends its request, let run in an earlier life of the record (not counted)\n", clock, NAME(me))
		fi;
		ra[me] = 1; cs[me] = CS_ACT; cr[me] = 0 }
	/* ... or act fails before it sends anything. */
	:: d_step { pc[me] == FN && ARMED(me) ->
		ra[me] = 0; cs[me] = CS_ACT; cr[me] = 0;
		printf("t=%d %c: act fails before it sends its request\n", clock, NAME(me)) }
	/* Another reply of begin or rearm. */
	:: d_step { pc[me] == FN && (cs[me] == CS_BEGW || cs[me] == CS_RARW) && cr[me] != CR_OK ->
		if
		:: cr[me] == CR_INT ->
			if
			:: cs[me] == CS_BEGW -> printf("t=%d %c: begin: an intent is stored: check first, never act first\n", clock, NAME(me))
			:: else -> printf("t=%d %c: rearm: the intent is too young: not applied does not count yet\n", clock, NAME(me))
			fi;
			cs[me] = CS_REC; cr[me] = 0
		:: cr[me] == CR_DONE ->
			printf("t=%d %c: begin: the step's checkpoint is read; act does not run\n", clock, NAME(me));
			cs[me] = CS_DONE; cr[me] = 0
		:: cr[me] == CR_PARK ->
			printf("t=%d %c: begin: the step is parked: ErrUnknownOutcome; release sent\n", clock, NAME(me));
			relp[me] = 1;
			finish(me)
		:: cr[me] == CR_NO ->
			printf("t=%d %c: begin or rearm refused (not the owner): ErrLeaseLost; release sent\n", clock, NAME(me));
			relp[me] = 1;
			finish(me)
		fi }
	/* act returns a value: its request was applied (the provider applies
	 * one now), and the value is checkpointed. */
	:: d_step { pc[me] == FN && cs[me] == CS_ACT && ra[me] && !old[me] && pend > 0 ->
		printf("t=%d %c: act returns a value: the provider applied the request\n", clock, NAME(me));
		check_P12();
		pend--; eff++;
		store_script(me) }
	/* act returns an error marked Ambiguous (a timeout after sending, say):
	 * the reconciliation starts at once. */
	:: d_step { pc[me] == FN && cs[me] == CS_ACT ->
		printf("t=%d %c: act returns Ambiguous: reconciliation\n", clock, NAME(me));
		cs[me] = CS_REC }
	/* act returns a plain error, having sent nothing (the caller's word:
	 * the effect did not happen): the intent is cleared, fn fails. */
	:: d_step { pc[me] == FN && cs[me] == CS_ACT && !ra[me] ->
		printf("t=%d %c: act returns a plain error: the intent is cleared; fn fails, release sent\n", clock, NAME(me));
		clear_script(me);
		relp[me] = 1;
		finish(me) }
	/* check: applied (the provider has applied a request of the step's
	 * reference), its value checkpointed. */
	:: d_step { pc[me] == FN && cs[me] == CS_REC && eff > 0 ->
		WITNESS(28, cfo != TOK(me));
		printf("t=%d %c: check: applied\n", clock, NAME(me));
		store_script(me) }
	/* check: not applied (nothing applied yet; requests may be on their
	 * way): rearm is sent (and runs). */
	:: d_step { pc[me] == FN && cs[me] == CS_REC && eff == 0 ->
		rearm_script(me);
		cs[me] = CS_RARW;
		printf("t=%d %c: check: not applied; rearm sent\n", clock, NAME(me));
		printf("t=%d %c:   -> %d ", clock, NAME(me), cr[me]); print_record(); printf("\n") }
	/* (check: unknown, or an error: check again, later.) ReconcileFor
	 * ends: the step is parked, fn returns ErrUnknownOutcome, release. */
	:: d_step { pc[me] == FN && cs[me] == CS_REC ->
		park_script(me);
		printf("t=%d %c: ReconcileFor ends: the step is parked; ErrUnknownOutcome, release sent ", clock, NAME(me));
		print_record(); printf("\n");
		relp[me] = 1;
		finish(me) }
#endif
	/* Model: step Complete (the owner's side). fn returns a result or a
	 * permanent error, its context live or not: the renewals stop, the
	 * completion is sent (and runs). */
	:: d_step { pc[me] == FN && FN_MAY_RETURN(me) ->
		clear_renewals(me); live[me] = 0; dl[me] = 0; fgt[me] = 0;
#ifdef CHK
		cs[me] = CS_NO; cr[me] = 0; ra[me] = 0; old[me] = 0;
#endif
#ifdef LIVE
		fnt[me] = 0;
#endif
#ifdef STEPS
		sp[me] = 0;
#endif
		pc[me] = COMPW; clear_request(me);
		nx[me] = 1;
		printf("t=%d %c: fn returns; completion sent\n", clock, NAME(me));
		complete_script(me);
		printf("t=%d %c:   -> %d ", clock, NAME(me), rk[me]); print_record(); printf("\n") }
#ifndef LIVE
	/* Model: step Release (the owner's side). fn fails transiently (an
	 * error, a panic): a release is sent in the background. */
	:: d_step { pc[me] == FN ->
		printf("t=%d %c: fn fails transiently: release sent; Do returns the error\n", clock, NAME(me));
		relp[me] = 1;
		finish(me) }
#endif
	/* The completion's reply is lost; it is sent again (go-redis, or the
	 * owner's own retries until the store timeout). */
	:: d_step { pc[me] == COMPW && nx[me] < MAXXK ->
		nx[me]++;
		printf("t=%d %c: completion reply lost; sent again\n", clock, NAME(me));
		complete_script(me);
		printf("t=%d %c:   -> %d ", clock, NAME(me), rk[me]); print_record(); printf("\n") }
	:: d_step { pc[me] == COMPW ->
		WITNESS(7, rk[me] == 0);
		if
		:: rk[me] -> acked[me] = ackok[me];
#ifdef REC
			if
			:: ackok[me] && !ISREC(me) -> check_P14(TOK(me))
			:: else
			fi;
#endif
			printf("t=%d %c: completion acknowledged: Do returns the result\n", clock, NAME(me))
		:: else ->
			printf("t=%d %c: completion refused: ErrLeaseLost\n", clock, NAME(me))
		fi;
		ackok[me] = 0;
		finish(me) }
	/* (No reply before the store timeout, ErrNotRecorded: as a caller that
	 * pauses in COMPW for good.) */

#ifndef LIVE
	/* The background release runs (late; or never: no step is taken). */
	:: d_step { relp[me] ->
		relp[me] = 0;
		printf("t=%d %c: the background release runs\n", clock, NAME(me));
		release_script(me);
		printf("t=%d %c:   -> ", clock, NAME(me)); print_record(); printf("\n") }
#endif
#ifdef REC
	/* The recoverer sweeps again: a second recovery, with a token of its
	 * own (its first ended, its release run). */
	:: d_step { pc[me] == END && ISREC(me) && gen[me] == 0 && !relp[me] && !acked[me] ->
		gen[me] = 1; pc[me] = IDLE;
		printf("t=%d %c: the recoverer sweeps again (a new recovery)\n", clock, NAME(me)) }
#endif
#if DRIFT > 0
	/* The caller's clock runs slow: it loses the next tick (at most one in
	 * any LEASE ticks). */
	:: d_step { !slip[me] && sk[me] >= LEASE && TIMED(me) ->
		WITNESS(20, pc[me] == FN && live[me]);
		printf("t=%d %c: its clock runs slow: it loses the next tick\n", clock, NAME(me));
		slip[me] = 1 }
#endif
	od
}


/* ---- Time, expiry, Forget ---------------------------------------------- */

#ifdef M6
/* M6: fn's context is not cancelled at the local deadline while a renewal
 * is in flight (only when a renewal's reply comes back, or it fails) */
#define HOLD(c) (rv[S0(c)] != RV_FREE)
#else
#define HOLD(c) 0
#endif

#ifdef LIVE
#define AGE(c) (pc[c] == CLAIMW || pc[c] == COMPW) /* LIVE: el is the age of the request in flight */
#define RELAGE(s) (rv[s] != RV_FREE)             /* LIVE: rel is the age of any renewal in flight */
#else
#define AGE(c) 0
#define RELAGE(s) (rv[s] == RV_RAN1)             /* only a reply 1 reads its age */
#endif


inline tick_rel(s) {
	if
	:: RELAGE(s) && rel[s] < LEASE -> rel[s]++
	:: else
	fi
}

inline tick_caller(c) {
#if DRIFT > 0
	if
	:: slip[c] ->
		slip[c] = 0; sk[c] = 0
	:: else ->
		if
		:: !TIMED(c) -> sk[c] = LEASE
		:: TIMED(c) && sk[c] < LEASE -> sk[c]++
		:: else
		fi;
#endif
	if
	:: (pc[c] == CLAIMW && nx[c] < MAXXC || AGE(c)) && el[c] < LEASE -> el[c]++
	:: else
	fi;
	if
	:: cdl[c] > 0 -> cdl[c]--
	:: else
	fi;
	tick_rel(S0(c));
#if MAXR == 2
	tick_rel(S1(c));
#endif
#ifdef M16
	if
	:: pc[c] == FN && ls[c] < LEASE -> ls[c]++
	:: else
	fi;
#endif
	if
	:: dl[c] > 0 -> dl[c]--
	:: else
	fi
#if DRIFT > 0
	fi
#endif
	;
	if
	:: live[c] && fnage[c] < 255 -> fnage[c]++
	:: else
	fi;
	if
	:: live[c] && dl[c] == 0 && !HOLD(c) ->
		WITNESS(12, rv[S0(c)] != RV_FREE);
		WITNESS(16, rv[S0(c)] == RV_LOST || rv[S1(c)] == RV_LOST);
		live[c] = 0;
		printf("t=%d %c: local deadline: fn's context cancelled\n", clock, NAME(c))
	:: else
	fi
#ifdef LIVE
	; if
	:: pc[c] == FN && fnt[c] < FNMAX -> fnt[c]++
	:: else
	fi
#endif
}

#ifdef LIVE
/* LIVE: no unbounded delays. The clock waits while a reply is DMAX ticks
 * late, while a live owner's renewal is due at its last chance, and while
 * an fn has run FNMAX ticks. */
#define QUIET(c) (!((pc[c] == CLAIMW || pc[c] == COMPW) && el[c] >= DMAX) && !(rv[S0(c)] != RV_FREE && rel[S0(c)] >= DMAX) && \
	!(pc[c] == FN && live[c] && rv[S0(c)] == RV_FREE && dl[c] <= THIRD) && !(pc[c] == FN && fnt[c] >= FNMAX))
#define TICK_OK (QUIET(0) && QUIET(1) AND_C2(QUIET(2)))
#else
#define TICK_OK 1
#endif

#define MAY_EXPIRE ((rst == P && rlease == 0) || rst == R)
#ifdef CHK
#ifdef MC5
#define NOT_ARMED 1
#else
#define NOT_ARMED (!ARMED_NOW(0) && !ARMED_NOW(1))
#endif
#endif

active proctype Clock() {
	byte k;
	atomic {
		k = 0;
		do
		:: k < NC ->
#if DRIFT > 0
			sk[k] = LEASE;
#endif
			run Caller(k); k++
		:: else -> k = 0; break
		od
	}
end:
	do
	/* Model: step Tick. */
	:: d_step { TICK_OK ->
		clock++;
		if
		:: rst == P ->
			if
			:: rlease > 0 -> rlease--
			:: else
			fi
#ifdef M9
			; rttl--;
			if
			:: rttl == 0 ->
				printf("t=%d   the in-progress record's TTL runs out: it expires\n", clock);
				record_gone()
			:: else
			fi
#endif
		:: rst == D ->
			rttl--;
			if
			:: rttl == 0 ->
				WITNESS(5, 1);
				printf("t=%d   the finished record expires (retention)\n", clock);
				record_gone()
			:: else
			fi
		:: else
		fi;
		tick_caller(0); tick_caller(1) SEQ_C2(tick_caller(2));
		WITNESS(10, live[0] && fnage[0] > RET);
		printf("t=%d   tick\n", clock) }
	/* Model: step Expire. An in-progress record whose lease ended, or a
	 * released record, expires (its TTL may have passed). */
	:: d_step { MAY_EXPIRE ->
		printf("t=%d   the record expires: ", clock); print_record(); printf("\n");
		record_gone() }
#ifdef M20
	/* M20: the checkpoints expire before their record: a renewal or a
	 * takeover reset the record's TTL, and nothing reset theirs. */
	:: d_step { ck != 0 && !ckk && (rst == P || rst == R) ->
		printf("t=%d   the step checkpoints expire before their record\n", clock);
		ck = 0 }
#endif
#ifdef CHK
	/* The provider applies a request it received, or drops it (it will
	 * never apply it), at any time. */
	:: d_step { pend > 0 ->
		WITNESS(29, !ra[0] && !ra[1]);
		printf("t=%d   the provider applies a request\n", clock);
		check_P12();
		pend--; eff++ }
	:: d_step { pend > 0 ->
		printf("t=%d   the provider drops a request (it will never apply it)\n", clock);
		pend-- }
	/* The intent settles: SettleAfter has passed since it was stored, and
	 * every request sent under it has landed or been dropped. (MC5: it may
	 * settle while act is about to send under it.) */
	:: d_step { cf == CF_INT && !stl && pend == 0 && NOT_ARMED ->
		printf("t=%d   the intent settles (SettleAfter has passed)\n", clock);
		stl = 1 }
	/* Model: step Resolve. An operator settles a parked step, after asking
	 * the provider: applied, with its value (Resolve), or not applied and
	 * never to be (ResolveNotApplied; with nothing on its way). */
	:: d_step { cf == CF_PARK && (rst == P || rst == R) && eff > 0 ->
		printf("t=%d   an operator resolves the step: applied (Resolve)\n", clock);
		cf = CF_DONE; pk = 0 }
	:: d_step { cf == CF_PARK && (rst == P || rst == R) && eff == 0 && pend == 0 && !ARMED_NOW(0) && !ARMED_NOW(1) ->
		WITNESS(30, 1);
		printf("t=%d   an operator resolves the step: not applied (ResolveNotApplied)\n", clock);
		cf = CF_NONE; pk = 0; rearmd = 1 }
#endif
#ifdef REC
	/* Model: step Retry. An operator un-parks the operation. */
	:: d_step { pk && (rst == P || rst == R) ->
		WITNESS(37, 1);
		printf("t=%d   an operator un-parks the operation (Retry)\n", clock);
		pk = 0; rc = 0 }
#endif
#ifdef TOMB
	/* Model: step Tombstone. The tombstone outlives the record, then
	 * expires. */
	:: d_step { rtomb && rst == ABS ->
		printf("t=%d   the tombstone expires\n", clock);
		rtomb = 0 }
#endif
#if !defined(LIVE) && !defined(NOFORGET) && !defined(CHK) && !defined(REC)
	/* Model: step Forget: the record and its tombstone. */
	:: d_step { rst != ABS || TOMBSTONE ->
		WITNESS(6, rst == P && live[IDX(rown)]);
		printf("t=%d   Forget deletes the record: ", clock); print_record();
		if
		:: rst == P -> printf("; its claims are exempt from P1 from now on\n")
		:: else -> printf("\n")
		fi;
		/* A claim of the deleted record, held or in flight, is exempt from
		 * P1 from now on: Forget breaks P1 by design (model/README.md). */
		if
		:: rst == P ->
			k = 0;
			do
			:: k < NC ->
				if
				:: pc[k] == CLAIMW || pc[k] == PRERENW || pc[k] == FN -> fgt[k] = 1
				:: else
				fi;
				k++
			:: else -> k = 0; break
			od
		:: else
		fi;
		record_gone()
#ifdef TOMB
		; rtomb = 0
#endif
		}
#endif
	od
}

#ifdef LIVE
/* P6: liveness under weak fairness (pan -a -f), in the LIVE run: no crash
 * (weak fairness: no caller stops for good), no Forget, fn does not fail
 * transiently, no timeouts, replies (lost ones re-sent) within DMAX ticks
 * of the request, fn returns within FNMAX ticks. P6b, stronger: every
 * caller's Do returns. */
ltl P6_some_attempt_completes { <> completed }
ltl P6b_every_caller_returns { <> (pc[0] == END && pc[1] == END AND_C2(pc[2] == END)) }
#endif
