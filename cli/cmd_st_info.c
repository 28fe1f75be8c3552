/* tandem st-info FILE: a safetensors file's metadata and tensor table, as text or (--json)
 * as one JSON object; --data adds each tensor's bytes in hex, so tests can compare the
 * reader's view of a file byte for byte with another implementation's. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cmd.h"
#include "common/args.h"
#include "common/safetensors.h"

static json_t *st_info_json(const st_file *f, const char *path, bool data)
{
    json_t *root = json_object();
    json_object_set_new(root, "file", json_string(path));
    json_object_set_new(root, "size", json_integer((json_int_t)f->size));
    json_object_set_new(root, "header_size", json_integer((json_int_t)f->header_size));
    json_t *meta = json_object();
    for (size_t i = 0; i < f->n_meta; i++)
        json_object_set_new(meta, f->meta[i].key, json_string(f->meta[i].value));
    json_object_set_new(root, "metadata", meta);
    json_t *tensors = json_array();
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(t->name));
        json_object_set_new(o, "dtype", json_string(st_dtype_name(t->dtype)));
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "offset", json_integer((json_int_t)t->offset));
        json_object_set_new(o, "bytes", json_integer((json_int_t)t->bytes));
        json_object_set_new(o, "supported", json_boolean(t->supported));
        if (data) {
            static const char hex[] = "0123456789abcdef";
            char *s = malloc(2 * (size_t)t->bytes + 1);
            if (!s) {
                json_decref(o);
                json_decref(tensors);
                json_decref(root);
                return NULL;
            }
            const uint8_t *p = t->data;
            for (uint64_t b = 0; b < t->bytes; b++) {
                s[2 * b] = hex[p[b] >> 4];
                s[2 * b + 1] = hex[p[b] & 15];
            }
            s[2 * t->bytes] = '\0';
            json_object_set_new(o, "data", json_string(s));
            free(s);
        }
        json_array_append_new(tensors, o);
    }
    json_object_set_new(root, "tensors", tensors);
    return root;
}

static void st_info_text(const st_file *f, const char *path)
{
    printf("file: %s (%llu bytes)\nheader: %llu bytes, %zu tensors, %zu metadata entries\n", path,
           (unsigned long long)f->size, (unsigned long long)f->header_size, f->n_tensors, f->n_meta);
    for (size_t i = 0; i < f->n_meta; i++)
        printf("  %s = %s\n", f->meta[i].key, f->meta[i].value);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        char shape[160];
        size_t k = 0;
        shape[0] = '\0';
        for (uint32_t d = 0; d < t->n_dims && k < sizeof shape - 24; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%llu", d ? ", " : "",
                                  (unsigned long long)t->shape[d]);
        printf("  %-48s %-8s [%s] offset %llu, %llu bytes%s\n", t->name, st_dtype_name(t->dtype),
               shape, (unsigned long long)t->offset, (unsigned long long)t->bytes,
               t->supported ? "" : " (not a compute dtype)");
    }
}

int cmd_st_info(int argc, char **argv)
{
    bool as_json = false, data = false, help = false;
    const args_opt opts[] = {
        {.name = "json", .type = ARGS_FLAG, .value = &as_json, .help = "print one JSON object"},
        {.name = "data", .type = ARGS_FLAG, .value = &data,
         .help = "with --json: each tensor's bytes in hex"},
        ARGS_END,
    };
    const char *pos[1];
    int npos = 0;
    if (args_parse(argc, argv, 1, opts, pos, 1, &npos, &help) != TD_OK) {
        fprintf(stderr, "tandem st-info: %s\n", err_msg());
        return 2;
    }
    if (help || npos != 1) {
        args_usage("tandem st-info FILE.safetensors [--json [--data]]", opts);
        return help ? 0 : 2;
    }
    st_file *f;
    if (st_open(&f, pos[0]) != TD_OK) {
        fprintf(stderr, "tandem st-info: %s\n", err_msg());
        return 1;
    }
    int rc = 0;
    if (as_json) {
        json_t *j = st_info_json(f, pos[0], data);
        if (!j || json_dumpf(j, stdout, JSON_INDENT(1)) != 0) {
            fprintf(stderr, "tandem st-info: out of memory\n");
            rc = 1;
        } else {
            putchar('\n');
        }
        json_decref(j);
    } else {
        st_info_text(f, pos[0]);
    }
    st_close(f);
    return rc;
}
