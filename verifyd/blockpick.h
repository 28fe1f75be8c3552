/* How many tokens the next speculative step verifies, chosen from what steps have cost and how
 * many drafts they got accepted (verifyd --draft-auto, tandem generate --draft-auto).
 *
 * A step of B tokens (the pending token and B - 1 drafts) commits 1 + a tokens, a the drafts
 * accepted, and costs the proposal plus the verify pass. Speculation pays only where the
 * tokens a step is expected to commit, per second, beat those of a plain step: on a GPU a
 * 16-token verify costs about twice a single token's and long blocks pay, on a CPU it costs
 * several single-token steps and the drafter's pass is not free, so shorter blocks or none at
 * all give more tokens per second. The picker measures both sides and takes the B with the
 * most expected tokens per second:
 *
 *   tokens(B) = 1 + sum_{k=1}^{B-1} h_1 h_2 ... h_k
 *
 * where h_k is the rate at which draft k is accepted once drafts 1..k-1 were (counted over the
 * steps that offered it, with older steps weighing less: each drafting step multiplies the
 * counts by BP_DECAY, each plain one by BP_DECAY_PLAIN), pulled towards h_{k-1} (h_0 = 1/2)
 * by BP_PRIOR steps' weight so that a draft position never offered yet is expected to do as
 * the one before it. cost(B) is the mean
 * seconds of the recent steps of B tokens (the first step of each B is left out: it pays for
 * warming up; so is a step that recorded a CUDA graph, which its caller reports with no
 * time); a B not yet measured is costed by the line between
 * the measured sizes around it, or, outside them, optimistically (as the largest measured
 * below it, or proportionally to B below the smallest), so that it gets tried once it looks
 * best. Before any measurement the whole block is taken.
 *
 * Plain steps (B = 1) teach nothing about acceptance, which changes with the text: while they
 * win, a step of the whole block is still taken once the plain steps since the last drafting
 * one have cost 1/BP_EXPLORE times what it is expected to cost more than a plain step, so
 * about BP_EXPLORE of the time goes to finding out whether drafting pays again; until
 * BP_EVIDENCE drafting steps have been seen, k of them, the plain steps' share is cut by
 * k/BP_EVIDENCE, so that a start whose first blocks were refused is looked at again soon. (While some
 * B > 1 wins, its steps keep measuring drafts 1..B-1, and a draft position beyond them is
 * expected to do as the one before it once its old counts have decayed: longer blocks get
 * tried as the accepted runs grow.)
 *
 * Greedy output does not depend on B (every step is lossless); a seeded sampled output does,
 * and with the picker B depends on timing, so such outputs are no longer repeatable. */
#ifndef TANDEM_VERIFYD_BLOCKPICK_H
#define TANDEM_VERIFYD_BLOCKPICK_H

#include <stdint.h>

#define BP_MAX 64        /* tokens a step verifies at most (SPEC_MAX_BLOCK) */
#define BP_DECAY 0.97    /* weight of the acceptance counts kept at each drafting step */
#define BP_DECAY_PLAIN 0.995 /* ... at each plain step (those come ~50x as often) */
#define BP_PRIOR 2.0     /* weight, in steps, of h_{k-1} in the estimate of h_k */
#define BP_COST_NEW 0.2  /* weight of a new step in the running mean of cost(B) */
#define BP_EXPLORE 0.05  /* share of the time plain steps give to a drafting step */
#define BP_EVIDENCE 6    /* drafting steps before that share falls to BP_EXPLORE (k steps: x 6/k) */

typedef struct blockpick {
    int64_t most;               /* tokens a step verifies at most: 1..BP_MAX */
    double cost[BP_MAX + 1];    /* [B] seconds per step of B tokens (running mean), 0: none yet */
    uint32_t seen[BP_MAX + 1];  /* [B] steps of B tokens recorded, warm-up included */
    double offered[BP_MAX];     /* [k] decayed steps that offered draft k with 1..k-1 accepted */
    double accepted[BP_MAX];    /* [k] decayed steps of those that accepted draft k */
    double plain_s;             /* seconds of plain steps since the last drafting one */
    int64_t drafting;           /* drafting steps recorded, up to BP_EVIDENCE */
} blockpick;

void bp_init(blockpick *p, int64_t most);

/* The B of the next step: 1..most. */
int64_t bp_pick(const blockpick *p);

/* A step of B tokens (1..most) committed n of them (1..B) in the given seconds; 0 seconds:
 * its acceptance counts, its time does not (e.g. it recorded a CUDA graph). */
void bp_record(blockpick *p, int64_t B, int64_t n, double seconds);

/* tokens(B) and cost(B) as bp_pick sees them (cost 0: nothing measured yet). */
double bp_tokens(const blockpick *p, int64_t B);
double bp_cost(const blockpick *p, int64_t B);

#endif
