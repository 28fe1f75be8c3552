/* kvd's attach (kvd_attach, without sockets): which buffers each role gets, by name, size and
 * kind; the proposal pool sized [block - 1][n_vocab] f32; a drafter of another vocabulary
 * refused; heads (verifyd's shared embedding and LM head) accepted only from verifyd, with
 * one fd each, and only for pools of the cuda kind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include "common/kvclient.h"
#include "common/shbuf.h"
#include "kvd/server.h"

static const uint32_t taps[3] = {1, 3, 5};

/* The tiny qwen35 shape of test_kvd_slots, a drafter of blocks of 3, vocabulary 50. */
static kvl_params params(void)
{
    return (kvl_params){.n_ctx = 8, .ring = 4, .block = 3, .n_attn = 2, .n_kv = 2,
                        .head_dim = 16, .n_delta = 6, .n_v_head = 6, .d_k = 16, .d_v = 16,
                        .conv_k = 4, .conv_ch = 160, .n_taps = 3, .n_embd = 32, .d_layers = 2,
                        .d_kv = 2, .d_head_dim = 16, .n_vocab = 50, .kv_bytes = 4,
                        .d_kv_bytes = 4, .feat_bytes = 4};
}

/* One attach of role with in_fds; on success the reply's pools land in out. */
static td_err attach(kvd *k, msg_kv_attach *m, const int *in_fds, size_t n_in,
                     msg_kv_pools *out)
{
    msg_buf req, reply;
    msg_buf_init(&req);
    msg_buf_init(&reply);
    assert_int_equal(msg_pack_kv_attach(&req, 7, m), TD_OK);
    int fds[MSG_POOLS_MAX];
    size_t n = 0;
    uint32_t pid = 0;
    msg_role role = 0;
    td_err e = kvd_attach(k, req.data, req.len, in_fds, n_in, &reply, fds, &n, &pid, &role);
    if (e == TD_OK) {
        assert_int_equal(msg_unpack_kv_pools(reply.data, reply.len, NULL, out), TD_OK);
        assert_int_equal(n, out->n_pools);
        assert_int_equal(pid, m->pid);
        assert_int_equal(role, m->role);
    } else {
        assert_int_equal(n, 0);
    }
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
    msg_buf_free(&req);
    msg_buf_free(&reply);
    return e;
}

static void test_each_role_gets_its_buffers_by_name_with_the_layout_sizes(void **state)
{
    (void)state;
    kvd k;
    assert_int_equal(kvd_init(&k, 2, 0, NULL), TD_OK);
    kvl_params p = params();
    p.slots = 2;
    kvl_layout lay;
    assert_int_equal(kvl_compute(&p, &lay), TD_OK);

    msg_kv_attach vd = {.role = MSG_ROLE_VERIFYD, .pid = 100, .params = p, .taps = taps,
                        .n_taps = 3};
    msg_kv_pools got;
    assert_int_equal(attach(&k, &vd, NULL, 0, &got), TD_OK);
    assert_int_equal(got.n_pools, 2);
    assert_string_equal(got.pools[0].name, KVC_POOL_TARGET);
    assert_string_equal(got.pools[1].name, KVC_POOL_Q);
    assert_int_equal(got.pools[0].size, lay.target_bytes);
    assert_int_equal(got.pools[1].size, 2 * 50 * 4); /* (block 3 - 1) rows of 50 f32 */
    assert_int_equal(got.pools[0].kind, MSG_SHBUF_CPU);
    assert_int_equal(got.pools[1].kind, MSG_SHBUF_CPU);
    assert_int_equal(got.params.n_vocab, 50);

    msg_kv_attach dd = {.role = MSG_ROLE_DRAFTD, .pid = 200, .params = p, .taps = taps,
                        .n_taps = 3};
    assert_int_equal(attach(&k, &dd, NULL, 0, &got), TD_OK);
    assert_int_equal(got.n_pools, 3);
    assert_string_equal(got.pools[0].name, KVC_POOL_TARGET);
    assert_string_equal(got.pools[1].name, KVC_POOL_Q);
    assert_string_equal(got.pools[2].name, KVC_POOL_DRAFT);
    assert_int_equal(got.pools[2].size, lay.draft_bytes);

    /* a drafter whose LM head has another vocabulary cannot share the proposal pool */
    dd.params.n_vocab = 51;
    assert_int_equal(attach(&k, &dd, NULL, 0, &got), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "vocabulary"));

    /* plain decoding (block 1): no proposal pool */
    kvd_free(&k);
    assert_int_equal(kvd_init(&k, 2, 0, NULL), TD_OK);
    vd.params.block = 1;
    assert_int_equal(attach(&k, &vd, NULL, 0, &got), TD_OK);
    assert_int_equal(got.n_pools, 1);
    assert_string_equal(got.pools[0].name, KVC_POOL_TARGET);
    kvd_free(&k);
}

/* Without --slots kvd holds KVD_SLOTS_AUTO slots in host memory (a GPU's are sized to its
 * free memory at verifyd's attach); verifyd's reserve for the drafter changes nothing there,
 * and a drafter part that is wrong in itself is refused. */
static void test_without_slots_the_cpu_pools_hold_sixteen(void **state)
{
    (void)state;
    kvd k;
    assert_int_equal(kvd_init(&k, KVL_SLOTS_MAX + 1, 0, NULL), TD_ERANGE);
    assert_int_equal(kvd_init(&k, 0, 0, NULL), TD_OK);
    assert_true(k.slots_auto);
    kvl_params p = params();
    p.slots = 3; /* kvd's own: ignored */
    msg_kv_attach vd = {.role = MSG_ROLE_VERIFYD, .pid = 100, .params = p, .taps = taps,
                        .n_taps = 3, .reserve = 1ull << 30};
    msg_kv_attach bad = vd;
    bad.params.d_kv_bytes = 3;
    msg_kv_pools got;
    assert_int_equal(attach(&k, &bad, NULL, 0, &got), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "drafter part"));
    assert_int_equal(attach(&k, &vd, NULL, 0, &got), TD_OK);
    assert_int_equal(got.params.slots, KVD_SLOTS_AUTO);
    assert_int_equal(got.params.d_layers, 0); /* the draft pool is draftd's to ask for */
    p.slots = KVD_SLOTS_AUTO;
    p.d_layers = p.d_kv = p.d_head_dim = p.d_kv_bytes = 0;
    kvl_layout lay;
    assert_int_equal(kvl_compute(&p, &lay), TD_OK);
    assert_int_equal(got.pools[0].size, lay.target_bytes);
    assert_int_equal(k.table.n, KVD_SLOTS_AUTO);
    kvd_free(&k);
}

static void test_heads_need_their_fds_verifyd_and_pools_of_the_cuda_kind(void **state)
{
    (void)state;
    kvd k;
    assert_int_equal(kvd_init(&k, 2, 0, NULL), TD_OK);
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CPU, KVC_HEAD_EMBD, 4096, NULL), TD_OK);
    shbuf_desc d;
    int fd = -1;
    assert_int_equal(shbuf_export(sb, &d, &fd), TD_OK);
    msg_kv_attach vd = {.role = MSG_ROLE_VERIFYD, .pid = 100, .params = params(),
                        .taps = taps, .n_taps = 3, .n_heads = 1};
    kvc_announce_from_desc(&vd.heads[0], &d);
    msg_kv_pools got;

    /* announced but not sent */
    assert_int_equal(attach(&k, &vd, NULL, 0, &got), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "fds"));
    /* sent, but kvd's pools are host memory: the heads are for a GPU drafter */
    assert_int_equal(attach(&k, &vd, &fd, 1, &got), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "cpu kind"));
    /* draftd never sends descriptors */
    vd.n_heads = 0;
    assert_int_equal(attach(&k, &vd, NULL, 0, &got), TD_OK);
    msg_kv_attach dd = {.role = MSG_ROLE_DRAFTD, .pid = 200, .params = params(), .taps = taps,
                        .n_taps = 3};
    assert_int_equal(attach(&k, &dd, &fd, 1, &got), TD_EINVAL);
    /* and its heads are refused by the message rules already */
    dd.n_heads = 1;
    dd.heads[0] = vd.heads[0];
    msg_buf b;
    msg_buf_init(&b);
    assert_int_equal(msg_pack_kv_attach(&b, 1, &dd), TD_EINVAL);
    msg_buf_free(&b);
    close(fd);
    shbuf_release(sb);
    kvd_free(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_role_gets_its_buffers_by_name_with_the_layout_sizes),
        cmocka_unit_test(test_without_slots_the_cpu_pools_hold_sixteen),
        cmocka_unit_test(test_heads_need_their_fds_verifyd_and_pools_of_the_cuda_kind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
