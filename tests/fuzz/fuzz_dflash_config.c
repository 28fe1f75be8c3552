/* Fuzzes the DFlash config.json parser: any input either fails with a message or gives a
 * config whose values respect the documented bounds; resolving against a few target depths
 * and checking against a file with no tensors must fail cleanly, never crash. */
#include <stdint.h>
#include <string.h>

#include "common/dflash_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dflash_config c;
    if (dflash_config_parse(&c, (const char *)data, size) != TD_OK) {
        TD_ASSERT(err_msg()[0] != '\0');
        return 0;
    }
    TD_ASSERT(c.n_layers >= 1 && c.n_layers <= DFLASH_MAX_LAYERS);
    TD_ASSERT(c.n_kv_heads >= 1 && c.n_heads % c.n_kv_heads == 0);
    TD_ASSERT(c.head_dim % 2 == 0 && c.mask_token_id < c.vocab);
    TD_ASSERT(c.n_taps <= DFLASH_MAX_TAPS && c.rms_eps > 0 && c.rope_theta > 1);
    for (uint32_t i = 0; i < c.n_layers; i++)
        TD_ASSERT(!c.layers[i].window || c.layers[i].sliding);

    static const uint8_t empty_st[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    st_file *st;
    TD_ASSERT(st_open_memory(&st, empty_st, sizeof empty_st) == TD_OK);
    static const uint32_t depths[] = {1, 2, 36, 64, 65535};
    for (size_t k = 0; k < sizeof depths / sizeof depths[0]; k++) {
        dflash_config r = c;
        if (dflash_config_resolve(&r, depths[k]) != TD_OK)
            continue;
        TD_ASSERT(r.n_taps >= 1);
        for (uint32_t i = 0; i < r.n_taps; i++)
            TD_ASSERT(r.target_layer_ids[i] < depths[k]);
        TD_ASSERT(dflash_tensors_check(&r, st, r.hidden) == TD_ENOENT);
    }
    st_close(st);
    return 0;
}
