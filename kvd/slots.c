/* Slot bookkeeping of kvd (see slots.h). */
#include "kvd/slots.h"

#include <stdlib.h>
#include <string.h>

td_err kvs_init(kvs_table *t, uint32_t n)
{
    TD_ASSERT(t && n > 0);
    memset(t, 0, sizeof *t);
    t->slots = calloc(n, sizeof *t->slots);
    if (!t->slots)
        return err_set(TD_ENOMEM, "out of memory for %u slots", n);
    t->n = n;
    t->next_gen = 1;
    return TD_OK;
}

static void kvs_forget(kvs_slot *s)
{
    free(s->tokens);
    s->tokens = NULL;
    s->n_tokens = 0;
    s->owner = 0;
    s->state = KVS_FREE;
}

void kvs_free(kvs_table *t)
{
    if (!t || !t->slots)
        return;
    for (uint32_t i = 0; i < t->n; i++)
        kvs_forget(&t->slots[i]);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

void kvs_reset(kvs_table *t)
{
    for (uint32_t i = 0; i < t->n; i++) {
        kvs_forget(&t->slots[i]);
        t->slots[i].gen = 0;
    }
}

td_err kvs_open(kvs_table *t, uint32_t owner, const uint32_t *prompt, uint32_t n,
                kvs_grant *out)
{
    TD_ASSERT(t && prompt && n > 0 && out);
    memset(out, 0, sizeof *out);
    int64_t best = -1, free_slot = -1, lru = -1;
    for (uint32_t i = 0; i < t->n; i++) {
        const kvs_slot *s = &t->slots[i];
        if (s->state == KVS_FREE && free_slot < 0)
            free_slot = i;
        if (s->state != KVS_CACHED)
            continue;
        if (lru < 0 || s->last_use < t->slots[lru].last_use)
            lru = i;
        if (s->n_tokens < n && memcmp(s->tokens, prompt, s->n_tokens * sizeof *prompt) == 0 &&
            (best < 0 || s->n_tokens > t->slots[best].n_tokens))
            best = i;
    }
    kvs_slot *s;
    if (best >= 0) {
        s = &t->slots[best];
        out->slot = (uint32_t)best;
        out->n_cached = s->n_tokens;
    } else if (free_slot >= 0 || lru >= 0) {
        out->slot = (uint32_t)(free_slot >= 0 ? free_slot : lru);
        out->evicted = free_slot < 0;
        s = &t->slots[out->slot];
        s->gen = t->next_gen++;
    } else {
        return err_set(TD_EBUSY, "all %u sequence slots are in use", t->n);
    }
    free(s->tokens);
    s->tokens = NULL;
    s->n_tokens = 0;
    s->state = KVS_USED;
    s->owner = owner;
    s->last_use = ++t->tick;
    out->gen = s->gen;
    return TD_OK;
}

td_err kvs_close(kvs_table *t, uint32_t slot, uint64_t gen, bool keep, const uint32_t *tokens,
                 uint32_t n)
{
    TD_ASSERT(t);
    if (slot >= t->n || t->slots[slot].state != KVS_USED || t->slots[slot].gen != gen)
        return err_set(TD_ENOENT, "slot %u generation %llu holds no live sequence", slot,
                       (unsigned long long)gen);
    kvs_slot *s = &t->slots[slot];
    if (keep && n > 0) {
        uint32_t *copy = malloc((size_t)n * sizeof *copy);
        if (!copy)
            return err_set(TD_ENOMEM, "out of memory caching %u tokens", n);
        memcpy(copy, tokens, (size_t)n * sizeof *copy);
        s->tokens = copy;
        s->n_tokens = n;
        s->state = KVS_CACHED;
        s->owner = 0;
    } else {
        kvs_forget(s);
    }
    s->last_use = ++t->tick;
    return TD_OK;
}

uint32_t kvs_reclaim_owner(kvs_table *t, uint32_t owner)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->slots[i].state == KVS_USED && t->slots[i].owner == owner) {
            kvs_forget(&t->slots[i]);
            n++;
        }
    return n;
}

uint32_t kvs_reclaim_dead(kvs_table *t, bool (*is_dead)(uint32_t pid))
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->slots[i].state == KVS_USED && is_dead(t->slots[i].owner)) {
            kvs_forget(&t->slots[i]);
            n++;
        }
    return n;
}

void kvs_count(const kvs_table *t, uint32_t *free_n, uint32_t *used, uint32_t *cached)
{
    *free_n = *used = *cached = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        kvs_state st = t->slots[i].state;
        *(st == KVS_FREE ? free_n : st == KVS_USED ? used : cached) += 1;
    }
}
