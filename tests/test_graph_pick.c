/* Which forward passes become CUDA graphs (verifyd/graph_pick.c): recorded the second time
 * they come, one-off passes never, more sequences in turn than slots without recording every
 * step, a finished sequence's recordings replaced, a hash match checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "verifyd/graph_pick.h"

/* The caller's side: which key each slot's recording is of (the hash of key k is k, unless a
 * test makes two keys collide). */
typedef struct keys {
    int64_t slot_key[GP_SLOTS];
    int64_t key; /* the key being picked for */
} keys;

static bool same_key(void *user, int i)
{
    const keys *k = user;
    return k->slot_key[i] == k->key;
}

/* An empty table; no slot holds a key. */
static void fresh(gp_table *t, keys *k)
{
    memset(t, 0, sizeof *t);
    memset(k, 0xff, sizeof *k);
}

/* What a run of picks did. */
typedef struct tally {
    int rec, rep, direct;
} tally;

static void count(tally *c, gp_action a)
{
    c->rec += a == GP_RECORD;
    c->rep += a == GP_REPLAY;
    c->direct += a == GP_DIRECT;
}

static gp_action pick(gp_table *t, keys *k, int64_t key, uint64_t hash, int *slot)
{
    k->key = key;
    *slot = -1;
    gp_action a = gp_pick(t, hash, same_key, k, slot);
    if (a == GP_RECORD) {
        assert_true(*slot >= 0 && *slot < GP_SLOTS);
        k->slot_key[*slot] = key;
    }
    if (a == GP_REPLAY)
        assert_int_equal(k->slot_key[*slot], key);
    return a;
}

static gp_action pick_key(gp_table *t, keys *k, int64_t key)
{
    int slot;
    return pick(t, k, key, (uint64_t)key, &slot);
}

static void test_second_time_recorded(void **ctx)
{
    (void)ctx;
    gp_table t;
    keys k;
    fresh(&t, &k);
    int s1, s2, s3;
    assert_int_equal(pick(&t, &k, 7, 7, &s1), GP_DIRECT);
    assert_int_equal(s1, -1);
    assert_int_equal(pick(&t, &k, 7, 7, &s2), GP_RECORD);
    assert_int_equal(pick(&t, &k, 7, 7, &s3), GP_REPLAY);
    assert_int_equal(s3, s2);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(pick(&t, &k, 7, 7, &s3), GP_REPLAY);
        assert_int_equal(s3, s2);
    }
    /* a freed slot (its recording failed): the key starts over */
    gp_free(&t, s2);
    k.slot_key[s2] = -1;
    assert_int_equal(pick_key(&t, &k, 7), GP_DIRECT);
    assert_int_equal(pick_key(&t, &k, 7), GP_RECORD);
    assert_int_equal(pick_key(&t, &k, 7), GP_REPLAY);
}

/* A decode step between prompts' last chunks of every length: the step recorded once and
 * replayed, none of the chunks recorded. */
static void test_one_off_passes_never_recorded(void **ctx)
{
    (void)ctx;
    gp_table t;
    keys k;
    fresh(&t, &k);
    tally c = {0};
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(pick_key(&t, &k, 1000000 + i), GP_DIRECT);
        count(&c, pick_key(&t, &k, 5));
    }
    assert_int_equal(c.direct, 1);
    assert_int_equal(c.rec, 1);
    assert_int_equal(c.rep, 1998);
}

/* 30 sequences taking turns over 24 slots: once warm, every round replays 24 and runs 6 op
 * by op, recording nothing (least-recently-used replacement would record every step). */
static void test_more_sequences_than_slots(void **ctx)
{
    (void)ctx;
    enum { N = 30 };
    gp_table t;
    keys k;
    fresh(&t, &k);
    for (int round = 0; round < 12; round++) {
        tally c = {0};
        for (int q = 0; q < N; q++)
            count(&c, pick_key(&t, &k, 100 + q));
        if (round == 0) {
            assert_int_equal(c.direct, N);
        } else if (round == 1) {
            assert_int_equal(c.rec, GP_SLOTS);
            assert_int_equal(c.direct, N - GP_SLOTS);
        } else {
            assert_int_equal(c.rec, 0);
            assert_int_equal(c.rep, GP_SLOTS);
            assert_int_equal(c.direct, N - GP_SLOTS);
        }
    }
}

/* Half of 24 sequences end and as many new ones take turns with the rest: the finished
 * ones' recordings are replaced, and soon every sequence replays again. */
static void test_finished_sequences_make_room(void **ctx)
{
    (void)ctx;
    gp_table t;
    keys k;
    fresh(&t, &k);
    for (int round = 0; round < 3; round++)
        for (int q = 0; q < GP_SLOTS; q++)
            pick_key(&t, &k, q);
    tally c = {0};
    for (int round = 0; round < 5; round++) {
        c = (tally){0};
        for (int q = 0; q < GP_SLOTS; q++)
            count(&c, pick_key(&t, &k, q < GP_SLOTS / 2 ? q : 500 + q));
        assert_int_equal(c.rec, round == 1 ? GP_SLOTS / 2 : 0);
    }
    assert_int_equal(c.rep, GP_SLOTS); /* the last round */
}

/* A key seen again soon takes the slot of a recording left unreplayed for longer; the key it
 * displaced comes back op by op, being no colder than the recordings in use. */
static void test_colder_recording_replaced(void **ctx)
{
    (void)ctx;
    gp_table t;
    keys k;
    fresh(&t, &k);
    int slot0 = -1, s;
    for (int q = 0; q < GP_SLOTS; q++) {
        assert_int_equal(pick_key(&t, &k, q), GP_DIRECT);
        assert_int_equal(pick(&t, &k, q, (uint64_t)q, &s), GP_RECORD);
        if (q == 0)
            slot0 = s;
    }
    for (int round = 0; round < 3; round++)
        for (int q = 1; q < GP_SLOTS; q++)
            assert_int_equal(pick_key(&t, &k, q), GP_REPLAY);
    assert_int_equal(pick_key(&t, &k, 77), GP_DIRECT);
    assert_int_equal(pick_key(&t, &k, 1), GP_REPLAY);
    assert_int_equal(pick(&t, &k, 77, 77, &s), GP_RECORD); /* key 0: not replayed since */
    assert_int_equal(s, slot0);
    assert_int_equal(pick_key(&t, &k, 0), GP_DIRECT);
    assert_int_equal(pick_key(&t, &k, 77), GP_REPLAY);
}

/* Two keys of one hash: the slot holding one is never replayed for the other (pick checks
 * every replay's key). */
static void test_hash_match_checked(void **ctx)
{
    (void)ctx;
    gp_table t;
    keys k;
    fresh(&t, &k);
    int s1, s2;
    assert_int_equal(pick(&t, &k, 1, 42, &s1), GP_DIRECT);
    assert_int_equal(pick(&t, &k, 1, 42, &s1), GP_RECORD);
    assert_int_equal(pick(&t, &k, 1, 42, &s2), GP_REPLAY);
    /* key 2 is new: op by op, then a recording of its own, replayed */
    int s3;
    assert_int_equal(pick(&t, &k, 2, 42, &s2), GP_DIRECT);
    assert_int_equal(pick(&t, &k, 2, 42, &s2), GP_RECORD);
    assert_int_not_equal(s2, s1);
    assert_int_equal(pick(&t, &k, 2, 42, &s3), GP_REPLAY);
    assert_int_equal(s3, s2);
    assert_int_equal(pick(&t, &k, 1, 42, &s2), GP_REPLAY);
    assert_int_equal(s2, s1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_time_recorded),
        cmocka_unit_test(test_one_off_passes_never_recorded),
        cmocka_unit_test(test_more_sequences_than_slots),
        cmocka_unit_test(test_finished_sequences_make_room),
        cmocka_unit_test(test_colder_recording_replaced),
        cmocka_unit_test(test_hash_match_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
