/* Fuzzes the safetensors reader: any input either fails with a message or opens, and an
 * opened file has every tensor inside the image, is found by name, and survives a write and
 * re-read through st_serialize with identical contents. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file *f;
    if (st_open_memory(&f, data, size) != TD_OK) {
        TD_ASSERT(err_msg()[0] != '\0');
        return 0;
    }
    st_entry *e = calloc(f->n_tensors + 1, sizeof *e);
    TD_ASSERT(e);
    uint32_t sum = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        TD_ASSERT(st_find(f, t->name) == t);
        TD_ASSERT((const uint8_t *)t->data >= data + 8 + f->header_size);
        TD_ASSERT((const uint8_t *)t->data + t->bytes <= data + size);
        for (uint64_t b = 0; b < t->bytes; b++)
            sum += ((const uint8_t *)t->data)[b];
        td_dtype type;
        TD_ASSERT((st_tensor_type(t, &type) == TD_OK) == t->supported);
        e[i] = (st_entry){t->name, t->dtype, t->n_dims, t->shape, t->data, t->bytes};
    }
    (void)sum;

    uint8_t *img;
    size_t img_size;
    TD_ASSERT(st_serialize(e, f->n_tensors, f->meta, f->n_meta, &img, &img_size) == TD_OK);
    st_file *g;
    TD_ASSERT(st_open_memory(&g, img, img_size) == TD_OK);
    TD_ASSERT(g->n_tensors == f->n_tensors && g->n_meta == f->n_meta);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *a = &f->tensors[i], *b = st_find(g, a->name);
        TD_ASSERT(b && a->dtype == b->dtype && a->n_dims == b->n_dims && a->bytes == b->bytes);
        TD_ASSERT(!memcmp(a->shape, b->shape, sizeof a->shape));
        TD_ASSERT(!a->bytes || !memcmp(a->data, b->data, (size_t)a->bytes));
    }
    for (size_t i = 0; i < f->n_meta; i++)
        TD_ASSERT(!strcmp(st_meta_get(g, f->meta[i].key), f->meta[i].value));
    st_close(g);
    free(img);
    free(e);
    st_close(f);
    return 0;
}
