/* kvd's sequence slots: which slot holds which sequence, the prefix cache of finished ones,
 * LRU eviction, and reclaiming the slots of processes that died. Pure bookkeeping (the
 * memory itself is in the pools, common/kvlayout.h); the caller serialises calls.
 *
 * A slot is FREE, USED (a live sequence of one owner process) or CACHED (a finished
 * sequence whose state is exactly that of its token list). Each time a slot starts a new
 * sequence from scratch it gets a new generation; a prefix-cache hit keeps the cached
 * generation, so a drafter context bound to that generation stays valid. */
#ifndef TANDEM_KVD_SLOTS_H
#define TANDEM_KVD_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

typedef enum kvs_state {
    KVS_FREE = 0,
    KVS_USED,
    KVS_CACHED,
} kvs_state;

typedef struct kvs_slot {
    kvs_state state;
    uint32_t owner;    /* USED: the owner's pid */
    uint64_t gen;      /* generation of the contents; 0 = never used */
    uint32_t *tokens;  /* CACHED: [n_tokens] the committed tokens the state holds */
    uint32_t n_tokens;
    uint64_t last_use; /* table tick of the last open or close (LRU order) */
} kvs_slot;

typedef struct kvs_table {
    kvs_slot *slots;   /* [n] */
    uint32_t n;
    uint64_t next_gen; /* next generation handed out, >= 1 */
    uint64_t tick;     /* grows with every open and close */
} kvs_table;

/* What an open returns. */
typedef struct kvs_grant {
    uint32_t slot;
    uint64_t gen;
    uint32_t n_cached; /* leading prompt tokens the slot's state already holds */
    bool evicted;      /* a cached sequence was dropped to make room */
} kvs_grant;

td_err kvs_init(kvs_table *t, uint32_t n);
void kvs_free(kvs_table *t);

/* Forgets every slot (the pool was re-created): all FREE, generations keep growing. */
void kvs_reset(kvs_table *t);

/* Hands a slot to owner for prompt[n]: the cached slot with the longest token list that is a
 * prefix of the prompt and shorter than it; else a free slot; else the least recently used
 * cached slot. TD_EBUSY when every slot is in use. */
td_err kvs_open(kvs_table *t, uint32_t owner, const uint32_t *prompt, uint32_t n,
                kvs_grant *out);

/* Ends the sequence in slot (generation gen). With keep the slot becomes CACHED with a copy
 * of tokens[n] (n >= 1); without, FREE. TD_ENOENT when the slot does not hold a live
 * sequence of that generation (a repeated close, or one after a reclaim). */
td_err kvs_close(kvs_table *t, uint32_t slot, uint64_t gen, bool keep, const uint32_t *tokens,
                 uint32_t n);

/* Frees the USED slots of owner (its state may be half-written: nothing is cached); returns
 * how many. */
uint32_t kvs_reclaim_owner(kvs_table *t, uint32_t owner);

/* Frees the USED slots whose owner is_dead says is gone; returns how many. */
uint32_t kvs_reclaim_dead(kvs_table *t, bool (*is_dead)(uint32_t pid));

/* Counts of slots in each state. */
void kvs_count(const kvs_table *t, uint32_t *free_n, uint32_t *used, uint32_t *cached);

#endif
