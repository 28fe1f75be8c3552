/* tandem st-write OUT SPEC.json: writes a safetensors file from the JSON that
 * `st-info --json --data` prints ({"metadata": {..}, "tensors": [{"name", "dtype", "shape",
 * "data": hex}]}), so small test models can be made and files round-tripped without Python. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "common/args.h"
#include "common/safetensors.h"

typedef struct st_spec {
    size_t n;
    st_entry *entries;    /* [n] */
    uint64_t (*shapes)[ST_MAX_DIMS]; /* [n] */
    uint8_t **data;       /* [n] decoded bytes */
    size_t n_meta;
    st_meta *meta;        /* [n_meta], strings point into the JSON */
} st_spec;

static void st_spec_free(st_spec *s)
{
    for (size_t i = 0; s->data && i < s->n; i++)
        free(s->data[i]);
    free(s->data);
    free(s->shapes);
    free(s->entries);
    free(s->meta);
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static td_err st_spec_tensor(st_spec *s, size_t i, json_t *t)
{
    st_entry *e = &s->entries[i];
    json_t *name = json_object_get(t, "name"), *dtype = json_object_get(t, "dtype");
    json_t *shape = json_object_get(t, "shape"), *data = json_object_get(t, "data");
    if (!json_is_string(name) || !json_is_string(dtype) || !json_is_array(shape) ||
        !json_is_string(data))
        return err_set(TD_EINVAL, "tensors[%zu]: needs string name, dtype, data and a shape array", i);
    e->name = json_string_value(name);
    TD_TRY(st_dtype_parse(json_string_value(dtype), &e->dtype));
    if (json_array_size(shape) > ST_MAX_DIMS)
        return err_set(TD_EINVAL, "tensor \"%s\": more than %d dims", e->name, ST_MAX_DIMS);
    e->n_dims = (uint32_t)json_array_size(shape);
    for (uint32_t d = 0; d < e->n_dims; d++) {
        json_t *v = json_array_get(shape, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return err_set(TD_EINVAL, "tensor \"%s\": shape[%u] is not a non-negative integer",
                           e->name, d);
        s->shapes[i][d] = (uint64_t)json_integer_value(v);
    }
    e->shape = s->shapes[i];
    const char *hex = json_string_value(data);
    size_t len = json_string_length(data);
    if (len % 2)
        return err_set(TD_EINVAL, "tensor \"%s\": data has an odd number of hex digits", e->name);
    s->data[i] = malloc(len / 2 + 1);
    if (!s->data[i])
        return err_set(TD_ENOMEM, "tensor \"%s\": out of memory", e->name);
    for (size_t b = 0; b < len / 2; b++) {
        int hi = hex_val(hex[2 * b]), lo = hex_val(hex[2 * b + 1]);
        if (hi < 0 || lo < 0)
            return err_set(TD_EINVAL, "tensor \"%s\": data is not hex", e->name);
        s->data[i][b] = (uint8_t)(hi << 4 | lo);
    }
    e->data = s->data[i];
    e->bytes = len / 2;
    return TD_OK;
}

static td_err st_spec_parse(st_spec *s, json_t *root)
{
    memset(s, 0, sizeof *s);
    json_t *tensors = json_object_get(root, "tensors");
    json_t *meta = json_object_get(root, "metadata");
    if (!json_is_array(tensors))
        return err_set(TD_EINVAL, "spec: \"tensors\" is not an array");
    if (meta && !json_is_object(meta))
        return err_set(TD_EINVAL, "spec: \"metadata\" is not an object");
    s->n = json_array_size(tensors);
    s->entries = calloc(s->n + 1, sizeof *s->entries);
    s->shapes = calloc(s->n + 1, sizeof *s->shapes);
    s->data = calloc(s->n + 1, sizeof *s->data);
    s->meta = calloc(json_object_size(meta) + 1, sizeof *s->meta);
    if (!s->entries || !s->shapes || !s->data || !s->meta)
        return err_set(TD_ENOMEM, "spec: out of memory");
    for (size_t i = 0; i < s->n; i++)
        TD_TRY(st_spec_tensor(s, i, json_array_get(tensors, i)));
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return err_set(TD_EINVAL, "spec: metadata \"%s\" is not a string", key);
        s->meta[s->n_meta++] = (st_meta){key, json_string_value(v)};
    }
    return TD_OK;
}

int cmd_st_write(int argc, char **argv)
{
    bool help = false;
    const args_opt opts[] = {ARGS_END};
    const char *pos[2];
    int npos = 0;
    if (args_parse(argc, argv, 1, opts, pos, 2, &npos, &help) != TD_OK) {
        fprintf(stderr, "tandem st-write: %s\n", err_msg());
        return 2;
    }
    if (help || npos != 2) {
        args_usage("tandem st-write OUT.safetensors SPEC.json   (SPEC as st-info --json --data prints; - reads stdin)",
                   opts);
        return help ? 0 : 2;
    }
    json_error_t je;
    json_t *root = !strcmp(pos[1], "-") ? json_loadf(stdin, 0, &je) : json_load_file(pos[1], 0, &je);
    if (!root) {
        fprintf(stderr, "tandem st-write: %s: line %d: %s\n", pos[1], je.line, je.text);
        return 1;
    }
    st_spec s;
    td_err e = st_spec_parse(&s, root);
    if (e == TD_OK)
        e = st_write(pos[0], s.entries, s.n, s.meta, s.n_meta);
    if (e != TD_OK)
        fprintf(stderr, "tandem st-write: %s\n", err_msg());
    st_spec_free(&s);
    json_decref(root);
    return e == TD_OK ? 0 : 1;
}
