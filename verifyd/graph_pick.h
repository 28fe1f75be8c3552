/* Which forward passes are worth recording as CUDA graphs (verifyd/target_graph.c).
 *
 * A recording pays only when it is replayed: recording a 27B step costs more than running it
 * op by op, and a replay saves only the host's queueing. So a pass is recorded on the second
 * time its key (state arrays, scratch, outputs, token count ...) is seen, never on the first:
 * the passes that repeat (decode steps, verify blocks of a sequence, full prefill chunks) are
 * recorded once they have repeated, the ones that do not (a prompt's last chunk, a verify of
 * a size tried once) run op by op and cost no recording.
 *
 * The recordings are GP_SLOTS; the keys seen but not recorded (GP_SEEN, the least recently
 * seen forgotten first) keep when they were last seen. A key seen again after d passes takes
 * the slot of the least recently replayed recording only if that one has not been replayed
 * for more than d passes, i.e. if it is colder than the newcomer; otherwise the pass runs op
 * by op. So more sequences taking turns than there are slots do not record every step in
 * turn (each recording replaced before its next use): GP_SLOTS of them replay and the rest
 * run op by op, while a finished sequence's recordings, never replayed again, make room. */
#ifndef TANDEM_VERIFYD_GRAPH_PICK_H
#define TANDEM_VERIFYD_GRAPH_PICK_H

#include <stdbool.h>
#include <stdint.h>

#define GP_SLOTS 24  /* recordings kept */
#define GP_SEEN 256  /* keys seen and not recorded, remembered */

typedef enum gp_action {
    GP_DIRECT, /* run op by op */
    GP_RECORD, /* record into *slot (free it first if it held a recording), then replay it */
    GP_REPLAY, /* replay *slot */
} gp_action;

typedef struct gp_slot {
    uint64_t hash;
    uint64_t used; /* pass of the last replay; 0 = free */
} gp_slot;

typedef struct gp_seen {
    uint64_t hash;
    uint64_t at; /* pass it was last seen; 0 = empty */
} gp_seen;

typedef struct gp_table {
    gp_slot slot[GP_SLOTS];
    gp_seen seen[GP_SEEN];
    uint64_t clock; /* passes picked for */
} gp_table;

/* Whether slot i holds exactly the key being picked for (a hash match is not taken on trust). */
typedef bool (*gp_same_fn)(void *user, int i);

/* The action for one pass of the key hashing to hash; *slot for GP_RECORD and GP_REPLAY. */
gp_action gp_pick(gp_table *t, uint64_t hash, gp_same_fn same, void *user, int *slot);

/* A recording into slot failed or was dropped: the slot is free. */
void gp_free(gp_table *t, int slot);

#endif
