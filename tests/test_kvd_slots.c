/* kvd's bookkeeping and the slot layout: exact byte offsets of a small layout (computed by
 * hand from the shapes), layout parameters out of range, how many 27B slots fit a given room
 * (kvl_fit, the sizing of the pools to a GPU), and the slot table: a free slot for
 * a new prompt, the longest cached prefix reused with its generation, LRU eviction, TD_EBUSY
 * when every slot runs, closes of unknown slots, and reclaiming the slots of dead owners. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/kvlayout.h"
#include "kvd/slots.h"

static kvl_params small_params(void)
{
    /* the tiny qwen35 test model: 2 attention and 6 DeltaNet layers */
    return (kvl_params){.slots = 2, .n_ctx = 8, .ring = 4, .block = 3, .n_attn = 2, .n_kv = 2,
                        .head_dim = 16, .n_delta = 6, .n_v_head = 6, .d_k = 16, .d_v = 16,
                        .conv_k = 4, .conv_ch = 160, .n_taps = 3, .n_embd = 32, .d_layers = 2,
                        .d_kv = 2, .d_head_dim = 16, .n_vocab = 50, .kv_bytes = 4,
                        .d_kv_bytes = 4, .feat_bytes = 4};
}

static void test_layout_offsets_follow_the_shapes(void **state)
{
    (void)state;
    kvl_params p = small_params();
    kvl_layout l;
    assert_int_equal(kvl_compute(&p, &l), TD_OK);
    /* kv: 2 layers * 8 positions * 2 heads * 16 * 4 bytes = 2048 each */
    assert_int_equal(l.k, 0);
    assert_int_equal(l.v, 2048);
    /* ssm: 6 * 6 * 16 * 16 * 4 = 36864; conv: 6 * 3 * 160 * 4 = 11520 */
    assert_int_equal(l.ssm, 4096);
    assert_int_equal(l.conv, 40960);
    assert_int_equal(l.rec_ssm0, 52480);
    assert_int_equal(l.rec_conv0, 89344);
    /* record rows: 6 * 3 * 160 * 4 = 11520; g and beta: 6 * 3 * 2 * 6 * 4 = 864 */
    assert_int_equal(l.rec_xconv, 100864);
    assert_int_equal(l.rec_qkv, 112384);
    assert_int_equal(l.rec_gb, 123904);
    /* 123904 + 864 = 124768, rounded up to 64 bytes; the ring is 4 * 3 * 32 * 4 = 1536 */
    assert_int_equal(l.feat, 124800);
    assert_int_equal(l.target_slot, 126976); /* 126336 rounded up to a page */
    assert_int_equal(l.target_bytes, 2 * 126976);
    /* draft: header, then K and V of 2 layers * (4 + 3) rows * 2 * 16 * 4 = 1792 each */
    assert_int_equal(l.d_header, 0);
    assert_int_equal(l.d_k, 64);
    assert_int_equal(l.d_v, 1856);
    assert_int_equal(l.d_pos, 3648);
    assert_int_equal(l.draft_slot, 4096);
    assert_int_equal(l.draft_bytes, 8192);
    /* proposal pool: (block 3 - 1) rows of 50 floats */
    assert_int_equal(l.q_bytes, 400);

    uint32_t v[KVL_N_PARAMS];
    kvl_params back;
    kvl_params_to_array(&p, v);
    assert_int_equal(v[0], 2);
    assert_int_equal(v[KVL_N_PARAMS - 5], 16); /* d_head_dim */
    assert_int_equal(v[KVL_N_PARAMS - 4], 50); /* n_vocab */
    assert_int_equal(v[KVL_N_PARAMS - 3], 4);  /* kv_bytes */
    assert_int_equal(v[KVL_N_PARAMS - 2], 4);  /* d_kv_bytes */
    assert_int_equal(v[KVL_N_PARAMS - 1], 4);  /* feat_bytes */
    kvl_params_from_array(&back, v);
    assert_memory_equal(&back, &p, sizeof p);
    assert_true(kvl_same_target(&p, &back));
    back.d_layers = 3;
    assert_true(kvl_same_target(&p, &back));
    assert_false(kvl_same_draft(&p, &back));
    back = p;
    back.d_kv_bytes = 2;
    assert_true(kvl_same_target(&p, &back));
    assert_false(kvl_same_draft(&p, &back));
    back.kv_bytes = 2;
    assert_false(kvl_same_target(&p, &back));
    back = p;
    back.feat_bytes = 2; /* a bf16 ring: another target layout */
    assert_false(kvl_same_target(&p, &back));
    assert_int_equal(kvl_compute(&back, &l), TD_OK);
    assert_int_equal(l.feat, 124800); /* 4 * 3 * 32 * 2 = 768 bytes from there: 125568, */
    assert_int_equal(l.target_slot, 126976); /* a page up */
}

/* f16 caches (a GPU's): the target's and the drafter's K/V regions take half the bytes. */
static void test_layout_sizes_f16_caches_by_their_elements(void **state)
{
    (void)state;
    kvl_params p = small_params();
    p.kv_bytes = p.d_kv_bytes = 2;
    kvl_layout l;
    assert_int_equal(kvl_compute(&p, &l), TD_OK);
    /* kv: 2 layers * 8 positions * 2 heads * 16 * 2 bytes = 1024 each */
    assert_int_equal(l.k, 0);
    assert_int_equal(l.v, 1024);
    assert_int_equal(l.ssm, 2048);
    /* draft: K and V of 2 layers * 7 rows * 2 * 16 * 2 bytes = 896 each */
    assert_int_equal(l.d_k, 64);
    assert_int_equal(l.d_v, 960);
    assert_int_equal(l.d_pos, 1856);
    assert_int_equal(l.draft_slot, 4096);
}

static void test_layout_refuses_parameters_out_of_range(void **state)
{
    (void)state;
    kvl_layout l;
    kvl_params p = small_params();
    p.slots = 0;
    assert_int_equal(kvl_compute(&p, &l), TD_ERANGE);
    p = small_params();
    p.block = 65;
    assert_int_equal(kvl_compute(&p, &l), TD_ERANGE);
    p = small_params();
    p.n_ctx = KVL_CTX_MAX + 1;
    assert_int_equal(kvl_compute(&p, &l), TD_ERANGE);
    p = small_params();
    p.ring = 0; /* taps without a ring */
    assert_int_equal(kvl_compute(&p, &l), TD_ERANGE);
    p = small_params();
    p.n_embd = 0;
    assert_int_equal(kvl_compute(&p, &l), TD_EINVAL);
    p = small_params();
    p.n_attn = p.n_delta = 0;
    assert_int_equal(kvl_compute(&p, &l), TD_EINVAL);
    /* K/V elements are f32 or f16, and only where there are K/V */
    const uint32_t bad_bytes[] = {0, 1, 3, 8};
    for (size_t i = 0; i < sizeof bad_bytes / sizeof *bad_bytes; i++) {
        p = small_params();
        p.kv_bytes = bad_bytes[i];
        assert_int_equal(kvl_compute(&p, &l), TD_EINVAL);
        assert_non_null(strstr(err_msg(), "kv_bytes"));
        p = small_params();
        p.d_kv_bytes = bad_bytes[i];
        assert_int_equal(kvl_compute(&p, &l), TD_EINVAL);
        assert_non_null(strstr(err_msg(), "d_kv_bytes"));
        p = small_params();
        p.feat_bytes = bad_bytes[i];
        assert_int_equal(kvl_compute(&p, &l), TD_EINVAL);
        assert_non_null(strstr(err_msg(), "feat_bytes"));
    }
    p = small_params();
    p.d_layers = p.d_kv = p.d_head_dim = 0; /* no drafter, yet an element size */
    assert_int_equal(kvl_compute(&p, &l), TD_EINVAL);
    p.d_kv_bytes = 0;
    assert_int_equal(kvl_compute(&p, &l), TD_OK);
    /* each factor in range, the pool far too large: 1024 slots of 2^20 positions */
    p = small_params();
    p.slots = KVL_SLOTS_MAX;
    p.n_ctx = KVL_CTX_MAX;
    p.n_kv = 64;
    p.head_dim = 256;
    assert_int_equal(kvl_compute(&p, &l), TD_ERANGE);
    assert_non_null(strstr(err_msg(), "pool limit"));
}

/* The 27B qwen35 target at 4096 positions with its DFlash drafter, f16 caches and a bf16
 * feature ring (a GPU's). */
static kvl_params params_27b(void)
{
    return (kvl_params){.slots = 1, .n_ctx = 4096, .ring = 4096, .block = 16, .n_attn = 16,
                        .n_kv = 4, .head_dim = 256, .n_delta = 48, .n_v_head = 48, .d_k = 128,
                        .d_v = 128, .conv_k = 4, .conv_ch = 10240, .n_taps = 5, .n_embd = 5120,
                        .d_layers = 5, .d_kv = 8, .d_head_dim = 128, .n_vocab = 248320,
                        .kv_bytes = 2, .d_kv_bytes = 2, .feat_bytes = 2};
}

static void test_fit_counts_whole_slots_of_both_pools_in_the_room(void **state)
{
    (void)state;
    /* one target slot: K and V 16 * 4096 * 4 * 256 * 2 = 134217728 each, the states
     * 48 * 48 * 128 * 128 * 4 = 150994944 twice, the conv windows 48 * 3 * 10240 * 4 = 5898240
     * twice, the record rows 48 * 16 * 10240 * 4 = 31457280 twice, g and beta
     * 48 * 16 * 2 * 48 * 4 = 294912, the ring 4096 * 5 * 5120 * 2 = 209715200: 855146496
     * (1064861696 with an f32 ring); one draft slot: 64 + 2 * 5 * 4112 * 8 * 128 * 2 +
     * 4112 * 4 = 84230272, a page up 84234240; the proposal pool 15 * 248320 * 4 = 14899200
     * once */
    const uint64_t per = 855146496ull + 84234240ull, q = 14899200ull;
    kvl_params p = params_27b();
    kvl_layout l;
    p.feat_bytes = 4;
    assert_int_equal(kvl_compute(&p, &l), TD_OK);
    assert_int_equal(l.target_slot, 1064861696ull);
    p.feat_bytes = 2;
    assert_int_equal(kvl_compute(&p, &l), TD_OK);
    assert_int_equal(l.target_slot, 855146496ull);
    assert_int_equal(l.draft_slot, 84234240ull);
    assert_int_equal(l.q_bytes, q);
    uint32_t n = 99;
    p.slots = 7; /* ignored */
    assert_int_equal(kvl_fit(&p, 2 * per + q, 16, &n), TD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(kvl_fit(&p, 2 * per + q - 1, 16, &n), TD_OK);
    assert_int_equal(n, 1);
    assert_int_equal(kvl_fit(&p, 100 * per, 16, &n), TD_OK);
    assert_int_equal(n, 16);
    assert_int_equal(kvl_fit(&p, 100 * per, 5, &n), TD_OK);
    assert_int_equal(n, 5);
    /* without a drafter part the target slots alone */
    p.d_layers = p.d_kv = p.d_head_dim = p.d_kv_bytes = 0;
    assert_int_equal(kvl_fit(&p, 2 * per + q, 16, &n), TD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(kvl_fit(&p, 3 * 855146496ull + q, 16, &n), TD_OK);
    assert_int_equal(n, 3);

    /* not one: what a slot takes, by part, against the room (MiB) */
    p = params_27b();
    assert_int_equal(kvl_fit(&p, per + q - 1, 16, &n), TD_ENOMEM);
    assert_int_equal(n, 0);
    assert_string_equal(err_msg(), "one sequence slot of 4096 positions takes 896 MiB "
                        "(attention KV 256, DeltaNet state and rollback record 360, feature "
                        "ring 200, drafter context 80) and the proposal pool 14 MiB, against "
                        "910 MiB of room");
    assert_int_equal(kvl_fit(&p, 0, 16, &n), TD_ENOMEM);
    /* a layout that is wrong in itself says so */
    p.kv_bytes = 3;
    assert_int_equal(kvl_fit(&p, 100 * per, 16, &n), TD_EINVAL);
}

static const uint32_t a5[5] = {1, 2, 3, 4, 5};

static void test_open_prefers_the_longest_cached_prefix_and_keeps_its_generation(void **state)
{
    (void)state;
    kvs_table t;
    assert_int_equal(kvs_init(&t, 3), TD_OK);
    kvs_grant g1, g2, g3;
    assert_int_equal(kvs_open(&t, 100, a5, 5, &g1), TD_OK);
    assert_int_equal(g1.n_cached, 0);
    assert_int_equal(g1.gen, 1);
    assert_int_equal(kvs_open(&t, 100, a5, 5, &g2), TD_OK);
    assert_int_not_equal(g2.slot, g1.slot);
    assert_int_equal(g2.gen, 2);
    assert_int_equal(kvs_close(&t, g1.slot, g1.gen, true, a5, 2), TD_OK); /* caches [1 2] */
    assert_int_equal(kvs_close(&t, g2.slot, g2.gen, true, a5, 4), TD_OK); /* caches [1 2 3 4] */
    assert_int_equal(kvs_open(&t, 200, a5, 5, &g3), TD_OK);
    assert_int_equal(g3.slot, g2.slot);
    assert_int_equal(g3.n_cached, 4);
    assert_int_equal(g3.gen, g2.gen);
    /* [1 2 3 4] is no longer cached: it is running. A prompt equal to a cached list is not
     * served from it (a prompt must leave a token to run). */
    kvs_grant g4;
    assert_int_equal(kvs_open(&t, 200, a5, 2, &g4), TD_OK);
    assert_int_equal(g4.n_cached, 0);
    assert_int_not_equal(g4.slot, g1.slot); /* the free third slot, not the cache */
    uint32_t f, u, c;
    kvs_count(&t, &f, &u, &c);
    assert_int_equal(f, 0);
    assert_int_equal(u, 2);
    assert_int_equal(c, 1);
    kvs_free(&t);
}

static void test_eviction_takes_the_least_recently_used_cache_then_refuses(void **state)
{
    (void)state;
    kvs_table t;
    assert_int_equal(kvs_init(&t, 2), TD_OK);
    kvs_grant g[4];
    const uint32_t x[2] = {9, 9}, y[2] = {8, 8}, z[3] = {7, 7, 7};
    assert_int_equal(kvs_open(&t, 1, x, 2, &g[0]), TD_OK);
    assert_int_equal(kvs_open(&t, 1, y, 2, &g[1]), TD_OK);
    assert_int_equal(kvs_open(&t, 1, z, 3, &g[2]), TD_EBUSY);
    assert_int_equal(kvs_close(&t, g[1].slot, g[1].gen, true, y, 2), TD_OK); /* older */
    assert_int_equal(kvs_close(&t, g[0].slot, g[0].gen, true, x, 2), TD_OK); /* newer */
    assert_int_equal(kvs_open(&t, 1, z, 3, &g[2]), TD_OK);
    assert_int_equal(g[2].slot, g[1].slot);
    assert_true(g[2].evicted);
    assert_int_equal(g[2].n_cached, 0);
    assert_int_equal(g[2].gen, 3); /* new contents, new generation */
    /* x is still cached and serves a prompt that extends it */
    const uint32_t x3[3] = {9, 9, 1};
    assert_int_equal(kvs_open(&t, 1, x3, 3, &g[3]), TD_OK);
    assert_int_equal(g[3].slot, g[0].slot);
    assert_int_equal(g[3].n_cached, 2);
    kvs_free(&t);
}

static void test_closes_of_unknown_slots_fail_and_dead_owners_are_reclaimed(void **state)
{
    (void)state;
    kvs_table t;
    assert_int_equal(kvs_init(&t, 4), TD_OK);
    kvs_grant g[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvs_open(&t, i < 2 ? 10 : 20, a5, 5, &g[i]), TD_OK);
    assert_int_equal(kvs_close(&t, 9, 1, false, NULL, 0), TD_ENOENT);
    assert_int_equal(kvs_close(&t, g[0].slot, g[0].gen + 1, false, NULL, 0), TD_ENOENT);
    assert_int_equal(kvs_close(&t, g[0].slot, g[0].gen, false, NULL, 0), TD_OK);
    assert_int_equal(kvs_close(&t, g[0].slot, g[0].gen, false, NULL, 0), TD_ENOENT);
    assert_int_equal(kvs_reclaim_owner(&t, 10), 1);
    assert_int_equal(kvs_reclaim_owner(&t, 10), 0);
    uint32_t f, u, c;
    kvs_count(&t, &f, &u, &c);
    assert_int_equal(f, 2);
    assert_int_equal(u, 2);
    assert_int_equal(c, 0);
    kvs_reset(&t);
    kvs_count(&t, &f, &u, &c);
    assert_int_equal(f, 4);
    kvs_free(&t);
}

static bool owner_20_is_dead(uint32_t pid)
{
    return pid == 20;
}

static void test_reclaim_dead_frees_only_the_dead_owners_slots(void **state)
{
    (void)state;
    kvs_table t;
    assert_int_equal(kvs_init(&t, 3), TD_OK);
    kvs_grant g;
    assert_int_equal(kvs_open(&t, 10, a5, 5, &g), TD_OK);
    assert_int_equal(kvs_open(&t, 20, a5, 5, &g), TD_OK);
    assert_int_equal(kvs_open(&t, 20, a5, 5, &g), TD_OK);
    assert_int_equal(kvs_reclaim_dead(&t, owner_20_is_dead), 2);
    uint32_t f, u, c;
    kvs_count(&t, &f, &u, &c);
    assert_int_equal(u, 1);
    assert_int_equal(f, 2);
    kvs_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_offsets_follow_the_shapes),
        cmocka_unit_test(test_layout_sizes_f16_caches_by_their_elements),
        cmocka_unit_test(test_layout_refuses_parameters_out_of_range),
        cmocka_unit_test(test_fit_counts_whole_slots_of_both_pools_in_the_room),
        cmocka_unit_test(test_open_prefers_the_longest_cached_prefix_and_keeps_its_generation),
        cmocka_unit_test(test_eviction_takes_the_least_recently_used_cache_then_refuses),
        cmocka_unit_test(test_closes_of_unknown_slots_fail_and_dead_owners_are_reclaimed),
        cmocka_unit_test(test_reclaim_dead_frees_only_the_dead_owners_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
