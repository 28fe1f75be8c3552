/* tandem gguf-info FILE [--json] [--max-items N]: a GGUF file's header, every metadata key
 * with its type and value, the tensor table and totals.
 *
 * Text is for people: long strings are cut, arrays show their length and first elements
 * (like gguf-py's gguf_dump). --json is the same content as one document for scripts and
 * tests; it never cuts scalar strings. In JSON, a UINT64 above 2^63-1 is a decimal string
 * (jansson integers are signed 64-bit) and a non-finite float is "nan", "inf" or "-inf";
 * bytes that are not UTF-8 become U+FFFD in both forms. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "cli/cmd.h"
#include "common/args.h"
#include "common/gguf.h"

#define INFO_TEXT_STR_MAX 80 /* bytes of a string shown in text form before it is cut */

/* --- strings ---------------------------------------------------------------------------- */

/* s as valid UTF-8 (each invalid byte becomes U+FFFD) in a malloc'd buffer of *len bytes. */
static char *info_utf8(gguf_str s, size_t *len)
{
    char *out = malloc(s.len * 3 + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s.ptr;
    for (uint64_t i = 0; i < s.len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(s.len - i), &cp);
        if (k <= 0) {
            memcpy(out + n, "\xef\xbf\xbd", 3);
            n += 3;
            i++;
        } else {
            memcpy(out + n, p + i, (size_t)k);
            n += (size_t)k;
            i += (uint64_t)k;
        }
    }
    out[n] = '\0';
    *len = n;
    return out;
}

/* Quoted, with C escapes for control characters; cut after max bytes (0 = never) at a
 * character boundary. */
static void info_print_str(FILE *f, gguf_str s, size_t max)
{
    size_t len;
    char *u = info_utf8(s, &len);
    if (!u) {
        fprintf(f, "<out of memory>");
        return;
    }
    size_t shown = len;
    if (max && len > max) {
        shown = max;
        while (shown > 0 && ((unsigned char)u[shown] & 0xc0) == 0x80)
            shown--;
    }
    fputc('"', f);
    for (size_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)u[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
    if (shown < len)
        fprintf(f, "... (%" PRIu64 " bytes)", s.len);
    free(u);
}

/* --- text ------------------------------------------------------------------------------- */

static void info_print_scalar(FILE *f, const gguf_value *v)
{
    switch (v->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        fprintf(f, "%" PRIu64, v->u64);
        break;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        fprintf(f, "%" PRId64, v->i64);
        break;
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64: {
        /* The shortest text that reads back to the same value at the stored width. */
        char buf[40];
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v->f64);
            double back = strtod(buf, NULL);
            if (v->type == GGUF_TYPE_FLOAT32 ? (float)back == (float)v->f64 : back == v->f64)
                break;
        }
        fputs(buf, f);
        break;
    }
    case GGUF_TYPE_BOOL:
        fputs(v->b ? "true" : "false", f);
        break;
    default:
        TD_ASSERT(!"not a scalar");
    }
}

/* "[n] [e0, e1, ...]": the first max elements (0 = all). */
static void info_print_value(FILE *f, const gguf_value *v, uint64_t max)
{
    if (v->type == GGUF_TYPE_STRING) {
        info_print_str(f, v->str, INFO_TEXT_STR_MAX);
        return;
    }
    if (v->type != GGUF_TYPE_ARRAY) {
        info_print_scalar(f, v);
        return;
    }
    uint64_t n = v->arr.n, shown = max && n > max ? max : n;
    fprintf(f, "[%" PRIu64 "] [", n);
    for (uint64_t i = 0; i < shown; i++) {
        gguf_value e;
        TD_ASSERT(gguf_arr_get(v, i, &e) == TD_OK);
        if (i)
            fputs(", ", f);
        info_print_value(f, &e, max);
    }
    fputs(shown < n ? ", ...]" : "]", f);
}

static void info_type_label(char *buf, size_t cap, const gguf_value *v)
{
    if (v->type == GGUF_TYPE_ARRAY)
        snprintf(buf, cap, "[%s]", gguf_type_name(v->arr.elem));
    else
        snprintf(buf, cap, "%s", gguf_type_name(v->type));
}

static void info_print_text(FILE *f, const char *path, const gguf_file *g, uint64_t max)
{
    fprintf(f, "file:        %s\n", path);
    fprintf(f, "version:     %u\n", g->version);
    fprintf(f, "alignment:   %u\n", g->alignment);
    fprintf(f, "data offset: %" PRIu64 " bytes\n", g->data_offset);
    fprintf(f, "file size:   %" PRIu64 " bytes\n", g->size);

    fprintf(f, "\nmetadata: %" PRIu64 " keys\n", g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        char label[24];
        info_type_label(label, sizeof label, &kv->value);
        fprintf(f, "%6" PRIu64 "  %-10s  ", i, label);
        size_t klen;
        char *key = info_utf8(kv->key, &klen);
        fprintf(f, "%s = ", key ? key : "?");
        free(key);
        info_print_value(f, &kv->value, max);
        fputc('\n', f);
    }

    fprintf(f, "\ntensors: %" PRIu64 "\n", g->n_tensors);
    fprintf(f, "%6s  %-8s  %-28s  %14s  %14s  %14s  %s\n", "#", "type", "shape", "elements", "bytes",
            "offset", "name");
    uint64_t total_elems = 0, total_bytes = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char shape[128];
        int n = snprintf(shape, sizeof shape, "[");
        uint64_t elems = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%" PRId64, d ? ", " : "", t->ne[d]);
            elems *= (uint64_t)t->ne[d];
        }
        snprintf(shape + n, sizeof shape - (size_t)n, "]");
        fprintf(f, "%6" PRIu64 "  %-8s  %-28s  %14" PRIu64 "  %14" PRIu64 "  %14" PRIu64 "  %s\n", i,
                dtype_name(t->type), shape, elems, t->size, t->offset, t->name);
        total_elems += elems;
        total_bytes += t->size;
    }
    fprintf(f, "\ntotal: %" PRIu64 " tensors, %" PRIu64 " elements, %" PRIu64 " bytes (%.2f GiB)\n",
            g->n_tensors, total_elems, total_bytes, (double)total_bytes / (1024.0 * 1024 * 1024));
}

/* --- JSON ------------------------------------------------------------------------------- */

static json_t *info_json_str(gguf_str s)
{
    size_t len;
    char *u = info_utf8(s, &len);
    if (!u)
        return NULL;
    json_t *j = json_stringn(u, len);
    free(u);
    return j;
}

static json_t *info_json_float(double d)
{
    if (isnan(d))
        return json_string("nan");
    if (isinf(d))
        return json_string(d > 0 ? "inf" : "-inf");
    return json_real(d);
}

static json_t *info_json_u64(uint64_t u)
{
    if (u <= INT64_MAX)
        return json_integer((json_int_t)u);
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, u);
    return json_string(buf);
}

static json_t *info_json_array(const gguf_value *v, uint64_t max);

/* A value as JSON; arrays give just the (possibly cut) list of elements. */
static json_t *info_json_value(const gguf_value *v, uint64_t max)
{
    switch (v->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
        return info_json_u64(v->u64);
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
        return json_integer(v->i64);
    case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64:
        return info_json_float(v->f64);
    case GGUF_TYPE_BOOL:
        return json_boolean(v->b);
    case GGUF_TYPE_STRING:
        return info_json_str(v->str);
    case GGUF_TYPE_ARRAY:
        return info_json_array(v, max);
    default:
        TD_ASSERT(!"unknown value type");
        return NULL;
    }
}

/* Adds elem_type, length and value (the first max elements, 0 = all) to obj. A nested
 * array's element is an object of the same three fields. */
static int info_json_fill_array(json_t *obj, const gguf_value *v, uint64_t max)
{
    json_t *items = info_json_array(v, max);
    if (!items)
        return -1;
    int rc = json_object_set_new(obj, "elem_type", json_string(gguf_type_name(v->arr.elem)));
    rc |= json_object_set_new(obj, "length", info_json_u64(v->arr.n));
    rc |= json_object_set_new(obj, "value", items);
    return rc;
}

static json_t *info_json_array(const gguf_value *v, uint64_t max)
{
    json_t *a = json_array();
    uint64_t shown = max && v->arr.n > max ? max : v->arr.n;
    for (uint64_t i = 0; a && i < shown; i++) {
        gguf_value item;
        TD_ASSERT(gguf_arr_get(v, i, &item) == TD_OK);
        json_t *e;
        if (item.type == GGUF_TYPE_ARRAY) {
            e = json_object();
            if (e && info_json_fill_array(e, &item, max)) {
                json_decref(e);
                e = NULL;
            }
        } else {
            e = info_json_value(&item, max);
        }
        if (!e || json_array_append_new(a, e)) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

static json_t *info_json_doc(const char *path, const gguf_file *g, uint64_t max)
{
    json_t *root = json_pack("{s:s, s:i, s:I, s:I, s:I}", "file", path, "version", (int)g->version,
                             "alignment", (json_int_t)g->alignment, "data_offset",
                             (json_int_t)g->data_offset, "file_size", (json_int_t)g->size);
    json_t *meta = json_array(), *tensors = json_array();
    if (!root || !meta || !tensors)
        goto fail;
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "tensors", tensors);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_value *v = &g->kv[i].value;
        json_t *e = json_object();
        json_t *key = info_json_str(g->kv[i].key);
        if (!e || !key || json_object_set_new(e, "key", key) ||
            json_object_set_new(e, "type", json_string(gguf_type_name(v->type))) ||
            json_array_append_new(meta, e))
            goto fail;
        if (v->type == GGUF_TYPE_ARRAY ? info_json_fill_array(e, v, max)
                                       : json_object_set_new(e, "value", info_json_value(v, max)))
            goto fail;
    }
    uint64_t total_elems = 0, total_bytes = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        json_t *shape = json_array();
        uint64_t elems = 1;
        for (uint32_t d = 0; shape && d < t->n_dims; d++) {
            json_array_append_new(shape, json_integer(t->ne[d]));
            elems *= (uint64_t)t->ne[d];
        }
        json_t *e = json_pack("{s:I, s:s, s:s, s:i, s:o, s:I, s:I, s:I}", "index", (json_int_t)i,
                              "name", t->name, "type", dtype_name(t->type), "type_id", (int)t->type,
                              "shape", shape, "n_elements", (json_int_t)elems, "bytes",
                              (json_int_t)t->size, "offset", (json_int_t)t->offset);
        if (!e || json_array_append_new(tensors, e))
            goto fail;
        total_elems += elems;
        total_bytes += t->size;
    }
    json_t *totals = json_pack("{s:I, s:I, s:I}", "n_tensors", (json_int_t)g->n_tensors, "n_elements",
                               (json_int_t)total_elems, "bytes", (json_int_t)total_bytes);
    if (!totals || json_object_set_new(root, "totals", totals))
        goto fail;
    return root;
fail:
    json_decref(root);
    return NULL;
}

/* --- command ---------------------------------------------------------------------------- */

int cmd_gguf_info(int argc, char **argv)
{
    bool json = false, help = false;
    int64_t max_items = 8;
    const args_opt opts[] = {
        {.name = "json", .type = ARGS_FLAG, .value = &json, .help = "print one JSON document"},
        {.name = "max-items", .type = ARGS_INT, .value = &max_items,
         .help = "array elements shown per array (0 = all)", .min = 0, .max = INT64_MAX},
        ARGS_END,
    };
    static const char usage[] = "tandem gguf-info FILE [--json] [--max-items N]";
    const char *pos[1];
    int npos = 0;
    if (args_parse(argc, argv, 1, opts, pos, 1, &npos, &help) != TD_OK) {
        fprintf(stderr, "tandem gguf-info: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (npos != 1) {
        fprintf(stderr, "tandem gguf-info: expected one FILE\n");
        args_usage(usage, opts);
        return 2;
    }
    gguf_file *g = NULL;
    if (gguf_open(&g, pos[0]) != TD_OK) {
        fprintf(stderr, "tandem gguf-info: %s\n", err_msg());
        return 1;
    }
    int rc = 0;
    if (json) {
        json_t *doc = info_json_doc(pos[0], g, (uint64_t)max_items);
        if (!doc || json_dumpf(doc, stdout, JSON_INDENT(1)) != 0) {
            fprintf(stderr, "tandem gguf-info: out of memory building the JSON document\n");
            rc = 1;
        }
        fputc('\n', stdout);
        json_decref(doc);
    } else {
        info_print_text(stdout, pos[0], g, (uint64_t)max_items);
    }
    gguf_close(g);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "tandem gguf-info: writing the output failed\n");
        rc = 1;
    }
    return rc;
}
