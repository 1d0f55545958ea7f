/*
 * idem.pml: idem's protocol (the scripts claim, renew, complete and release
 * on one Redis record, and the owner path that keeps a local lease
 * deadline), as a Promela model checked by spin. model/README.md says how
 * to run it, its bounds, its mutants and its reachability witnesses.
 *
 * One key, NC callers. Each caller is one Do call with its own owner token
 * (token = caller number + 1). A discrete global clock (process Clock)
 * ticks. Every duration is a count of ticks kept relative to the present
 * (time left, time since, capped where more makes no difference), so the
 * state space is finite without a time horizon and runs may last for ever.
 * The absolute time, `clock`, is hidden: printed in trails, not part of the
 * state.
 *
 * Each Lua script is one atomic step (d_step), run "by the server" in the
 * process of the caller that sent it. A request runs when it is sent; its
 * reply is received in a later step, and the clock may tick any number of
 * times in between: a reply delayed, longer than a lease included. (A
 * request that runs later than it was sent is the same as one sent later
 * by a caller that counts its lease from the earlier send: only safer; see
 * model/README.md.) A reply lost and the request re-sent by go-redis is a
 * second run of the same request, any number of ticks later; the caller
 * gets the last run's reply and counts from the first send. A caller may
 * pause for any number of ticks (it takes no step while the clock ticks);
 * a crash is a pause that never ends (no caller is ever forced to take a
 * step). The record expires once its TTL has passed; Forget deletes it at
 * any time.
 *
 * Compile-time switches: LIVE (the restricted run for P6), M1..M10 and ML1
 * (known-bad variants: the mutants), W1..W14 (reachability witnesses),
 * NOFORGET (no Forget: the mutants' runs, so that their counterexamples
 * need no operator's action).
 */

#ifndef NC
#define NC      3       /* callers: 3 (2 for experiments) */
#endif
#if NC == 3
#define AND_C2(e) && (e)
#define SEQ_C2(s) ; s
#else
#define AND_C2(e)
#define SEQ_C2(s)
#endif
#ifndef LEASE
#ifdef LIVE
#define LEASE   6       /* LIVE: a lease of 6 ticks, so that replies may come a tick late */
#else
#define LEASE   3       /* lease, in ticks */
#endif
#endif
#define THIRD   (LEASE / 3) /* the renewal period, and the least lease left to start fn */
#define MARGIN  0       /* the owner's margin (the code: lease/32, for clock drift; the model's clock is shared) */
#ifndef RET
#define RET     12      /* retention: the TTL of a finished record, in ticks */
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
hidden byte WITNESS_reached = 1;

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

/* Checking aids (not part of the protocol). */
byte used;          /* P4: attempt numbers handed out while the record lives (bit n) */
bit  ackok[NC];     /* P5: the last run of c's completion answered 1 on a record that still lives */
bit  acked[NC];     /* P5: c received 1 for its completion, and that record still lives */
bit  fgt[NC];       /* P1: c's claim was of a record that Forget deleted (exempt from P1) */
#ifdef LIVE
bit  completed;     /* P6: some completion was stored */
#endif
hidden byte clock;      /* absolute time, for trails */
hidden byte fnage[NC];  /* W10: ticks since fn started */
hidden byte attempt[NC];/* trails: the attempt a caller claimed */

/* ---- The callers ------------------------------------------------------- */
#define IDLE    0   /* about to send a claim (a new Do call, or again after "busy") */
#define CLAIMW  1   /* claim sent (and run), waiting for its reply */
#define PRERENW 2   /* claimed with < LEASE/3 left: one renewal sent before fn */
#define FN      3   /* fn started (its context live, or cancelled) */
#define COMPW   4   /* fn returned; completion sent (and run), waiting for its reply */
#define END     5   /* Do returned */

#define K_BUSY   1  /* claim replies */
#define K_DONE   2  /* a finished record: its outcome is replayed */
#define K_FRESH  3  /* "claimed n": the whole lease */
#define K_BEFORE 4  /* "claimed before, n, lease left": a re-sent claim */

byte pc[NC];
byte el[NC];      /* CLAIMW: ticks since the claim was sent, while it may run again (capped at LEASE) */
byte nx[NC];      /* runs of the claim or completion in flight */
byte rk[NC];      /* its last run's reply: claim K_*, completion 0/1 */
byte cdl[NC];     /* claim reply K_FRESH or K_BEFORE: the local deadline it gives,
                   * in ticks left, counted from when the claim was sent:
                   * LEASE - MARGIN, or the lease left - MARGIN */
byte dl[NC];      /* the owner's local deadline, in ticks left (0 = passed) */
bit  live[NC];    /* fn's context is live: fn runs and its context is not cancelled */
bit  rs[NC];      /* a renewal is in flight: sent, run, its reply not received yet */
bit  rrep[NC];    /* its reply */
byte rel[NC];     /* ticks since it was sent (capped at LEASE) */
bit  relp[NC];    /* a release was sent in the background and has not run yet */
#ifdef LIVE
byte fnt[NC];     /* LIVE: ticks since fn started (capped at FNMAX) */
#endif

#define TOK(c)  ((c) + 1)
#define NAME(c) ('A' + (c))

/* ---- Witnesses ---------------------------------------------------------- */
/* Witnesses: with Wn defined, an assertion fails where the event is
 * reached, and the trail shows how. */
#define WITNESS(w, cond) assert(WITNESS_reached && !(w && (cond)))
#ifdef W1
#define W1_ 1
#else
#define W1_ 0
#endif
#ifdef W2
#define W2_ 1
#else
#define W2_ 0
#endif
#ifdef W3
#define W3_ 1
#else
#define W3_ 0
#endif
#ifdef W4
#define W4_ 1
#else
#define W4_ 0
#endif
#ifdef W5
#define W5_ 1
#else
#define W5_ 0
#endif
#ifdef W6
#define W6_ 1
#else
#define W6_ 0
#endif
#ifdef W7
#define W7_ 1
#else
#define W7_ 0
#endif
#ifdef W8
#define W8_ 1
#else
#define W8_ 0
#endif
#ifdef W9
#define W9_ 1
#else
#define W9_ 0
#endif
#ifdef W10
#define W10_ 1
#else
#define W10_ 0
#endif
#ifdef W11
#define W11_ 1
#else
#define W11_ 0
#endif
#ifdef W12
#define W12_ 1
#else
#define W12_ 0
#endif
#ifdef W13
#define W13_ 1
#else
#define W13_ 0
#endif
#ifdef W14
#define W14_ 1
#else
#define W14_ 0
#endif

/* ---- Properties -------------------------------------------------------- */
#define NOT_LIVE(k, c) (k == c || !live[k] || fgt[k])
#define ACK_OK(c) (!acked[c] || (rst == D && rown == TOK(c)))

/* P1, when fn starts (a context only becomes live there, and once
 * cancelled it stays cancelled): no other caller's fn context is live. */
#define NOT_LIVE_AT_ALL(k, c) (k == c || !live[k])
inline check_P1(c) {
	assert(P1_at_most_one_live_fn && (fgt[c] || (NOT_LIVE(0, c) && NOT_LIVE(1, c) AND_C2(NOT_LIVE(2, c)))));
	WITNESS(W13_, !(NOT_LIVE_AT_ALL(0, c) && NOT_LIVE_AT_ALL(1, c) AND_C2(NOT_LIVE_AT_ALL(2, c))))
}
/* P2, at every write: the record replaced is not finished (expiry and
 * Forget make it absent first). */
inline check_P2() {
	assert(P2_done_never_overwritten && rst != D)
}
/* P3, when a completion is stored: it replaces the completing caller's own
 * claim (a newer owner's claim has another token and a higher attempt). */
inline check_P3(c) {
	assert(P3_stale_completion_fenced && rst == P && rown == TOK(c))
}
/* P4, when a claim hands out attempt n: n was not handed out before while
 * the record lives. */
inline check_P4(n) {
	assert(P4_attempt_numbers_unique && (used & (1 << (n))) == 0);
	used = used | (1 << (n))
}
/* P5, at every run of a claim: every caller whose completion was
 * acknowledged finds its outcome stored, unless the record expired or was
 * forgotten since. */
inline check_P5() {
	assert(P5_acked_outcome_replayed && ACK_OK(0) && ACK_OK(1) AND_C2(ACK_OK(2)))
}

/* The record is gone (retention expiry, Forget): what was stored is lost by
 * design, and P4 and P5 start again. */
inline record_gone() {
	WITNESS(W14_, acked[0] || acked[1] AND_C2(acked[2]));
	rst = ABS; rown = 0; rn = 0; rlease = 0; rttl = 0;
#ifdef ML1
	rremark = 0;
#endif
	used = 0;
	ackok[0] = 0; ackok[1] = 0 SEQ_C2(ackok[2] = 0);
	acked[0] = 0; acked[1] = 0 SEQ_C2(acked[2] = 0)
}

/* ---- The scripts (lua/*.lua), each one atomic step -------------------- */

/* The claim would take the record over: released, or a lease that ended. */
#define TAKES_OVER(c) ((rst == P && rown != TOK(c) && rlease == 0) || rst == R)
/* Bound MAXN: a takeover past it is not explored (the claim is not sent). */
#ifdef M7
#define CLAIM_RUNNABLE(c) 1
#else
#define CLAIM_RUNNABLE(c) (!TAKES_OVER(c) || rn < MAXN)
#endif

/* Model: step Claim (lua/claim.lua), run el[c] ticks after it was sent. */
inline claim_script(c) {
	check_P5();
	if
	:: rst == ABS ->
		check_P4(1);
		rst = P; rown = TOK(c); rn = 1; rlease = LEASE;
#ifdef M9
		rttl = RET;
#endif
		rk[c] = K_FRESH; cdl[c] = (LEASE > MARGIN + el[c] -> LEASE - MARGIN - el[c] : 0)
	:: rst == D ->
		rk[c] = K_DONE; cdl[c] = 0
	:: rst == P && rown == TOK(c) ->
		WITNESS(W2_, rlease == 0);
		rk[c] = K_BEFORE;
		if
		:: rlease > MARGIN + el[c] -> cdl[c] = rlease - MARGIN - el[c]
		:: else -> cdl[c] = 0
		fi
	:: rst == P && rown != TOK(c) && rlease > 0 ->
		rk[c] = K_BUSY; cdl[c] = 0
	:: else -> /* TAKES_OVER(c) */
		check_P2();
		WITNESS(W4_, rst == P && pc[rown - 1] == FN);
#ifndef M7
		rn = rn + 1;
#endif
		/* M7: a takeover keeps the attempt number */
		check_P4(rn);
		rst = P; rown = TOK(c); rlease = LEASE;
#ifdef M9
		rttl = RET;
#endif
#ifdef ML1
		rremark = 0;
#endif
		rk[c] = K_FRESH; cdl[c] = (LEASE > MARGIN + el[c] -> LEASE - MARGIN - el[c] : 0)
	fi;
	attempt[c] = rn
}

/* Model: step Renew (lua/renew.lua). */
inline renew_script(c) {
	if
	:: rst == P && rown == TOK(c) ->
		WITNESS(W3_, rlease == 0);
		rlease = LEASE;
		/* M9: the lease is extended, the TTL is not reset */
#ifdef ML1
		rremark = 1;
#endif
		rrep[c] = 1
	:: else -> rrep[c] = 0
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

inline complete_script(c) {
	if
	:: COMPLETE_CAS(c) ->
		check_P2();
		check_P3(c);
		rst = D; rlease = 0; rttl = RET; /* the header (token, attempt) stays */
#ifdef LIVE
		completed = 1;
#endif
		rk[c] = 1; ackok[c] = 1
	:: else ->
		if
		:: COMPLETE_REPEAT(c) ->
			WITNESS(W8_, nx[c] == 2);
			rk[c] = 1; ackok[c] = 1
		:: else ->
			WITNESS(W9_, rst == P && rown != TOK(c));
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
	WITNESS(W11_, rst == P && rown != TOK(c));
	if
	:: RELEASE_OWN(c) ->
		check_P2();
		rst = R; rlease = 0 /* the TTL is kept; a released record's lease is never read */
	:: else
	fi
}

/* Status (lua/status.lua) only reads: no caller acts on its answer. */

/* ---- The owner path (the Go code) -------------------------------------- */

/* Trails: the record, in words. */
inline print_record() {
	if
	:: rst == ABS -> printf("[record absent]")
	:: rst == P -> printf("[record: in progress, owner %c, attempt %d, lease left %d]", 'A' + rown - 1, rn, rlease)
	:: rst == R -> printf("[record: released, owner %c, attempt %d]", 'A' + rown - 1, rn)
	:: rst == D -> printf("[record: done by %c, attempt %d, TTL %d]", 'A' + rown - 1, rn, rttl)
	fi
}
/* Trails: a claim's reply, in words. */
inline print_claim_reply(c) {
	if
	:: rk[c] == K_BUSY -> printf("busy")
	:: rk[c] == K_DONE -> printf("finished")
	:: rk[c] == K_FRESH -> printf("claimed attempt %d", rn)
	:: rk[c] == K_BEFORE -> printf("claimed before: attempt %d, lease left %d", rn, rlease)
	fi
}

inline clear_request(c) {
	nx[c] = 0; rk[c] = 0; cdl[c] = 0; el[c] = 0
}
inline clear_renewal(c) {
	rs[c] = 0; rrep[c] = 0; rel[c] = 0
}
/* Do returns. Every caller-side variable but the background release and
 * what P5 needs goes back to zero (fewer states). */
inline finish(c) {
	pc[c] = END; clear_request(c); clear_renewal(c);
	dl[c] = 0; live[c] = 0; fgt[c] = 0
#ifdef LIVE
	; fnt[c] = 0
#endif
}
/* fn starts: P1 is checked. */
inline start_fn(c) {
	printf("t=%d %c: fn starts as attempt %d, deadline in %d\n", clock, NAME(c), attempt[c], dl[c]);
	check_P1(c);
	live[c] = 1; fnage[c] = 0; pc[c] = FN
}
/* Model: step RenewBeforeFn. With the local deadline set: start fn if at
 * least a third of a lease is left, or send one renewal first. */
inline start_or_renew(c) {
	if
	:: dl[c] >= THIRD -> start_fn(c)
	:: else ->
		pc[c] = PRERENW;
		printf("t=%d %c: %d left: renewal sent before fn\n", clock, NAME(c), dl[c]);
		renew_script(c);
		rs[c] = 1; rel[c] = 0;
		printf("t=%d %c:   -> %d ", clock, NAME(c), rrep[c]); print_record(); printf("\n")
	fi
}

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
		WITNESS(W1_, rk[me] == K_FRESH && cdl[me] == 0);
		if
		:: rk[me] == K_DONE ->
			printf("t=%d %c: reply: finished, the outcome is replayed\n", clock, NAME(me));
			finish(me)
		:: rk[me] == K_BUSY ->
			printf("t=%d %c: reply: busy; waits, then claims again\n", clock, NAME(me));
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

	/* The reply of the renewal before fn. */
	:: d_step { pc[me] == PRERENW ->
		if
		:: rrep[me] ->
#ifdef M2
			/* M2: the new deadline counts from the reply, not from when the renewal was sent */
			dl[me] = LEASE - MARGIN;
#else
			if
			:: rel[me] + MARGIN < LEASE -> dl[me] = LEASE - MARGIN - rel[me]
			:: else -> dl[me] = 0
			fi;
#endif
			printf("t=%d %c: renewal reply 1, sent %d ticks ago: deadline in %d\n", clock, NAME(me), rel[me], dl[me]);
			clear_renewal(me);
			if
			:: dl[me] >= THIRD -> start_fn(me)
			:: else ->
				printf("t=%d %c: still too little lease: release sent in the background; fn does not run\n", clock, NAME(me));
				relp[me] = 1;
				finish(me)
			fi
		:: else ->
			printf("t=%d %c: renewal reply 0: not ours; claims again\n", clock, NAME(me));
			clear_renewal(me); dl[me] = 0; fgt[me] = 0;
			pc[me] = IDLE
		fi }
#ifndef LIVE
	:: d_step { pc[me] == PRERENW ->
		printf("t=%d %c: the renewal before fn failed: release sent in the background; Do returns an error\n", clock, NAME(me));
		relp[me] = 1;
		finish(me) }
#endif

	/* Model: step Renew (the owner's side). While fn runs, one renewal at a
	 * time. The code sends one a third of a lease after the last that
	 * succeeded (or the claim); the model lets it be sent at any time (a
	 * superset), but in the LIVE run, where it is sent when due. */
#ifdef LIVE
	:: d_step { pc[me] == FN && live[me] && !rs[me] && dl[me] + THIRD <= LEASE ->
#else
	:: d_step { pc[me] == FN && live[me] && !rs[me] ->
#endif
		printf("t=%d %c: renewal sent\n", clock, NAME(me));
		renew_script(me);
		rs[me] = 1; rel[me] = 0;
		printf("t=%d %c:   -> %d ", clock, NAME(me), rrep[me]); print_record(); printf("\n") }
	:: d_step { pc[me] == FN && rs[me] ->
		if
		:: rrep[me] && live[me] ->
#ifdef M2
			dl[me] = LEASE - MARGIN;
#else
			if
			:: rel[me] + MARGIN < LEASE -> dl[me] = LEASE - MARGIN - rel[me]
			:: else -> dl[me] = 0
			fi;
#endif
			if
			:: dl[me] == 0 -> live[me] = 0 /* only where M6 held the context */
			:: else
			fi;
			printf("t=%d %c: renewal reply 1, sent %d ticks ago: deadline in %d\n", clock, NAME(me), rel[me], dl[me])
		:: rrep[me] && !live[me] ->
			printf("t=%d %c: renewal reply 1, too late: fn's context stays cancelled\n", clock, NAME(me))
		:: else ->
			if
			:: live[me] -> printf("t=%d %c: renewal reply 0: fn's context cancelled (lease lost)\n", clock, NAME(me))
			:: else
			fi;
			live[me] = 0; dl[me] = 0
		fi;
		clear_renewal(me) }
#ifndef LIVE
	/* The renewal times out: its reply is lost; the next is sent later. */
	:: d_step { pc[me] == FN && rs[me] ->
		printf("t=%d %c: renewal reply lost (timeout)\n", clock, NAME(me));
		clear_renewal(me);
		if
		:: dl[me] == 0 -> live[me] = 0
		:: else
		fi }
#endif
	/* Model: step Complete (the owner's side). fn returns a result or a
	 * permanent error, its context live or not: the renewals stop, the
	 * completion is sent (and runs). */
	:: d_step { pc[me] == FN ->
		clear_renewal(me); live[me] = 0; dl[me] = 0; fgt[me] = 0;
#ifdef LIVE
		fnt[me] = 0;
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
		WITNESS(W7_, rk[me] == 0);
		if
		:: rk[me] -> acked[me] = ackok[me];
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
	od
}

/* ---- Time, expiry, Forget ---------------------------------------------- */

#ifdef M6
/* M6: fn's context is not cancelled at the local deadline while a renewal
 * is in flight (only when a renewal's reply comes back, or it fails) */
#define HOLD(c) rs[c]
#else
#define HOLD(c) 0
#endif

#ifdef LIVE
#define AGE(c) (pc[c] == CLAIMW || pc[c] == COMPW) /* LIVE: el is the age of the request in flight */
#else
#define AGE(c) 0
#endif

inline tick_caller(c) {
	if
	:: (pc[c] == CLAIMW && nx[c] < MAXXC || AGE(c)) && el[c] < LEASE -> el[c]++
	:: else
	fi;
	if
	:: cdl[c] > 0 -> cdl[c]--
	:: else
	fi;
	if
	:: rs[c] && rel[c] < LEASE -> rel[c]++
	:: else
	fi;
	if
	:: dl[c] > 0 -> dl[c]--
	:: else
	fi;
	if
	:: live[c] && fnage[c] < 255 -> fnage[c]++
	:: else
	fi;
	if
	:: live[c] && dl[c] == 0 && !HOLD(c) ->
		WITNESS(W12_, rs[c]);
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
#define QUIET(c) (!((pc[c] == CLAIMW || pc[c] == COMPW) && el[c] >= DMAX) && !(rs[c] && rel[c] >= DMAX) && \
	!(pc[c] == FN && live[c] && !rs[c] && dl[c] <= THIRD) && !(pc[c] == FN && fnt[c] >= FNMAX))
#define TICK_OK (QUIET(0) && QUIET(1) AND_C2(QUIET(2)))
#else
#define TICK_OK 1
#endif

#define MAY_EXPIRE ((rst == P && rlease == 0) || rst == R)

active proctype Clock() {
	byte k;
	atomic { k = 0; do :: k < NC -> run Caller(k); k++ :: else -> k = 0; break od }
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
				WITNESS(W5_, 1);
				printf("t=%d   the finished record expires (retention)\n", clock);
				record_gone()
			:: else
			fi
		:: else
		fi;
		tick_caller(0); tick_caller(1) SEQ_C2(tick_caller(2));
		WITNESS(W10_, live[0] && fnage[0] > RET);
		printf("t=%d   tick\n", clock) }
	/* Model: step Expire. An in-progress record whose lease ended, or a
	 * released record, expires (its TTL may have passed). */
	:: d_step { MAY_EXPIRE ->
		printf("t=%d   the record expires: ", clock); print_record(); printf("\n");
		record_gone() }
#if !defined(LIVE) && !defined(NOFORGET)
	/* Model: step Forget. */
	:: d_step { rst != ABS ->
		WITNESS(W6_, rst == P && live[rown - 1]);
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
		record_gone() }
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
