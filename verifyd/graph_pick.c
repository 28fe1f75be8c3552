#include <stddef.h>

#include "verifyd/graph_pick.h"

/* Remembers hash as last seen at pass at: in its own entry, else in an empty one or the least
 * recently seen one, if that was seen before at. */
static void gp_remember(gp_table *t, uint64_t hash, uint64_t at)
{
    gp_seen *e = &t->seen[0];
    for (int i = 0; i < GP_SEEN; i++) {
        gp_seen *s = &t->seen[i];
        if (s->at && s->hash == hash) {
            e = s;
            break;
        }
        if (s->at < e->at)
            e = s;
    }
    if (e->at && e->hash != hash && e->at > at)
        return;
    e->hash = hash;
    e->at = at;
}

gp_action gp_pick(gp_table *t, uint64_t hash, gp_same_fn same, void *user, int *slot)
{
    const uint64_t now = ++t->clock;
    int lru = 0;
    for (int i = 0; i < GP_SLOTS; i++) {
        gp_slot *s = &t->slot[i];
        if (s->used && s->hash == hash && same(user, i)) {
            s->used = now;
            *slot = i;
            return GP_REPLAY;
        }
        if (s->used < t->slot[lru].used)
            lru = i;
    }
    gp_seen *e = NULL;
    for (int i = 0; i < GP_SEEN && !e; i++)
        if (t->seen[i].at && t->seen[i].hash == hash)
            e = &t->seen[i];
    if (!e) {
        gp_remember(t, hash, now);
        return GP_DIRECT;
    }
    gp_slot *v = &t->slot[lru];
    if (v->used && now - v->used <= now - e->at) {
        e->at = now; /* the least recently replayed is no colder than this key */
        return GP_DIRECT;
    }
    e->at = 0; /* recorded: no longer only seen */
    if (v->used)
        gp_remember(t, v->hash, v->used);
    v->hash = hash;
    v->used = now;
    *slot = lru;
    return GP_RECORD;
}

void gp_free(gp_table *t, int slot)
{
    if (slot >= 0 && slot < GP_SLOTS)
        t->slot[slot].used = 0;
}
