/* The bounded msgpack reader, the writer over msgpack-c, and msg_buf (see msg_codec.h for why
 * reading does not use msgpack-c). Wire format: the msgpack specification, big-endian. */
#include "common/msg_codec.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* --- msg_buf ------------------------------------------------------------------------------ */

void msg_buf_init(msg_buf *b)
{
    TD_ASSERT(b);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void msg_buf_free(msg_buf *b)
{
    if (!b)
        return;
    free(b->data);
    msg_buf_init(b);
}

static td_err buf_reserve(msg_buf *b, size_t need)
{
    if (need <= b->cap)
        return TD_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return err_set(TD_ENOMEM, "message buffer: %zu bytes is too large", need);
        cap *= 2;
    }
    uint8_t *p = realloc(b->data, cap);
    if (!p)
        return err_set(TD_ENOMEM, "message buffer: cannot allocate %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return TD_OK;
}

td_err msg_buf_append(msg_buf *b, const void *data, size_t len)
{
    TD_ASSERT(b && (data || len == 0));
    if (len > SIZE_MAX - b->len)
        return err_set(TD_ENOMEM, "message buffer: size overflow");
    TD_TRY(buf_reserve(b, b->len + len));
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    return TD_OK;
}

td_err msg_buf_assign(msg_buf *b, const void *data, size_t len)
{
    TD_ASSERT(b);
    b->len = 0;
    return msg_buf_append(b, data, len);
}

/* --- reader ------------------------------------------------------------------------------- */

void msg_reader_init(msg_reader *r, const void *buf, size_t len, const char *what)
{
    TD_ASSERT(r && (buf || len == 0) && what);
    r->start = buf;
    r->p = buf;
    r->end = r->p + len;
    r->what = what;
}

static size_t left(const msg_reader *r)
{
    return (size_t)(r->end - r->p);
}

static td_err bad(const msg_reader *r, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static td_err bad(const msg_reader *r, const char *field, const char *fmt, ...)
{
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return err_set(TD_EFORMAT, "message %s, field %s (byte %zu): %s", r->what, field,
                   (size_t)(r->p - r->start), detail);
}

/* Big-endian unsigned of n = 1, 2, 4 or 8 bytes; the caller checked n <= left(r). */
static uint64_t take_be(msg_reader *r, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | r->p[i];
    r->p += n;
    return v;
}

/* The type byte of the next value. */
static td_err take_tag(msg_reader *r, const char *field, uint8_t *tag)
{
    if (left(r) < 1)
        return bad(r, field, "truncated: message ends before the field");
    *tag = *r->p++;
    return TD_OK;
}

/* The n-byte big-endian length or value that follows a type byte. */
static td_err take_suffix(msg_reader *r, const char *field, size_t n, uint64_t *v)
{
    if (left(r) < n)
        return bad(r, field, "truncated: need %zu bytes, %zu left", n, left(r));
    *v = take_be(r, n);
    return TD_OK;
}

static const char *tag_kind(uint8_t tag)
{
    if (tag <= 0x7f || (tag >= 0xcc && tag <= 0xd3) || tag >= 0xe0)
        return "integer";
    if ((tag >= 0x80 && tag <= 0x8f) || tag == 0xde || tag == 0xdf)
        return "map";
    if ((tag >= 0x90 && tag <= 0x9f) || tag == 0xdc || tag == 0xdd)
        return "array";
    if ((tag >= 0xa0 && tag <= 0xbf) || (tag >= 0xd9 && tag <= 0xdb))
        return "string";
    if (tag == 0xc0)
        return "nil";
    if (tag == 0xc2 || tag == 0xc3)
        return "bool";
    if (tag >= 0xc4 && tag <= 0xc6)
        return "bin";
    if (tag == 0xca || tag == 0xcb)
        return "float";
    if ((tag >= 0xc7 && tag <= 0xc9) || (tag >= 0xd4 && tag <= 0xd8))
        return "ext";
    return "invalid byte 0xc1";
}

td_err msg_read_array_len(msg_reader *r, const char *field, uint32_t max, uint32_t *n)
{
    uint8_t tag = 0;
    uint64_t v = 0;
    TD_TRY(take_tag(r, field, &tag));
    if (tag >= 0x90 && tag <= 0x9f)
        v = tag & 0x0f;
    else if (tag == 0xdc)
        TD_TRY(take_suffix(r, field, 2, &v));
    else if (tag == 0xdd)
        TD_TRY(take_suffix(r, field, 4, &v));
    else
        return bad(r, field, "expected an array, found %s", tag_kind(tag));
    if (v > max)
        return bad(r, field, "array of %llu items exceeds the limit of %u",
                   (unsigned long long)v, max);
    /* Every item takes at least one byte: a count the rest of the input cannot hold is a lie,
     * caught here before anyone allocates for it. */
    if (v > left(r))
        return bad(r, field, "truncated: array of %llu items, %zu bytes left",
                   (unsigned long long)v, left(r));
    *n = (uint32_t)v;
    return TD_OK;
}

td_err msg_read_array(msg_reader *r, const char *field, uint32_t want)
{
    uint32_t n = 0;
    TD_TRY(msg_read_array_len(r, field, UINT32_MAX, &n));
    if (n != want)
        return bad(r, field, "array has %u items, expected %u", n, want);
    return TD_OK;
}

td_err msg_read_uint(msg_reader *r, const char *field, uint64_t max, uint64_t *out)
{
    uint8_t tag = 0;
    uint64_t v = 0;
    TD_TRY(take_tag(r, field, &tag));
    if (tag <= 0x7f) {
        v = tag;
    } else if (tag >= 0xcc && tag <= 0xcf) {
        TD_TRY(take_suffix(r, field, (size_t)1 << (tag - 0xcc), &v));
    } else if (tag >= 0xd0 && tag <= 0xd3) {
        /* Signed encodings of non-negative values are legal msgpack from other packers. */
        size_t n = (size_t)1 << (tag - 0xd0);
        TD_TRY(take_suffix(r, field, n, &v));
        if ((v >> (8 * n - 1)) & 1)
            return bad(r, field, "negative integer where an unsigned one is expected");
    } else if (tag >= 0xe0) {
        return bad(r, field, "negative integer where an unsigned one is expected");
    } else {
        return bad(r, field, "expected an integer, found %s", tag_kind(tag));
    }
    if (v > max)
        return bad(r, field, "integer %llu out of range (max %llu)", (unsigned long long)v,
                   (unsigned long long)max);
    *out = v;
    return TD_OK;
}

td_err msg_read_f32(msg_reader *r, const char *field, float *out)
{
    uint8_t tag = 0;
    uint64_t bits = 0;
    double d;
    TD_TRY(take_tag(r, field, &tag));
    if (tag == 0xca) {
        TD_TRY(take_suffix(r, field, 4, &bits));
        uint32_t b32 = (uint32_t)bits;
        float f;
        memcpy(&f, &b32, sizeof f);
        d = f;
    } else if (tag == 0xcb) {
        TD_TRY(take_suffix(r, field, 8, &bits));
        memcpy(&d, &bits, sizeof d);
    } else {
        return bad(r, field, "expected a float, found %s", tag_kind(tag));
    }
    if (!isfinite(d) || fabs(d) > FLT_MAX)
        return bad(r, field, "float %g is not a finite f32", d);
    *out = (float)d;
    return TD_OK;
}

/* Length of a str (is_bin = 0) or bin (is_bin = 1) header; the bytes must be there. */
static td_err read_blob_len(msg_reader *r, const char *field, int is_bin, uint64_t max,
                            uint64_t *len)
{
    uint8_t tag = 0;
    uint64_t v = 0;
    TD_TRY(take_tag(r, field, &tag));
    if (!is_bin && tag >= 0xa0 && tag <= 0xbf)
        v = tag & 0x1f;
    else if (!is_bin && tag >= 0xd9 && tag <= 0xdb)
        TD_TRY(take_suffix(r, field, (size_t)1 << (tag - 0xd9), &v));
    else if (is_bin && tag >= 0xc4 && tag <= 0xc6)
        TD_TRY(take_suffix(r, field, (size_t)1 << (tag - 0xc4), &v));
    else
        return bad(r, field, "expected %s, found %s", is_bin ? "a bin" : "a string",
                   tag_kind(tag));
    if (v > max)
        return bad(r, field, "%s of %llu bytes exceeds the limit of %llu",
                   is_bin ? "bin" : "string", (unsigned long long)v, (unsigned long long)max);
    if (v > left(r))
        return bad(r, field, "truncated: %llu bytes announced, %zu left", (unsigned long long)v,
                   left(r));
    *len = v;
    return TD_OK;
}

td_err msg_read_str(msg_reader *r, const char *field, char *dst, size_t cap)
{
    TD_ASSERT(dst && cap >= 1);
    uint64_t len = 0;
    TD_TRY(read_blob_len(r, field, 0, cap - 1, &len));
    if (memchr(r->p, 0, (size_t)len))
        return bad(r, field, "string contains a NUL byte");
    memcpy(dst, r->p, (size_t)len);
    dst[len] = '\0';
    r->p += len;
    return TD_OK;
}

td_err msg_read_bin(msg_reader *r, const char *field, uint32_t max, const uint8_t **data,
                    uint32_t *len)
{
    uint64_t n = 0;
    TD_TRY(read_blob_len(r, field, 1, max, &n));
    *data = r->p;
    *len = (uint32_t)n;
    r->p += n;
    return TD_OK;
}

td_err msg_read_u32_array(msg_reader *r, const char *field, uint32_t min_n, uint32_t max_n,
                          uint32_t **out, uint32_t *n)
{
    uint32_t count = 0;
    *out = NULL;
    *n = 0;
    TD_TRY(msg_read_array_len(r, field, max_n, &count));
    if (count < min_n)
        return bad(r, field, "array of %u items, at least %u required", count, min_n);
    if (count == 0)
        return TD_OK;
    uint32_t *v = malloc((size_t)count * sizeof *v);
    if (!v)
        return err_set(TD_ENOMEM, "message %s, field %s: cannot allocate %u items", r->what,
                       field, count);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t x = 0;
        td_err e = msg_read_uint(r, field, UINT32_MAX, &x);
        if (e != TD_OK) {
            free(v);
            return e;
        }
        v[i] = (uint32_t)x;
    }
    *out = v;
    *n = count;
    return TD_OK;
}

td_err msg_read_bool(msg_reader *r, const char *field, bool *out)
{
    uint8_t tag = 0;
    TD_TRY(take_tag(r, field, &tag));
    if (tag != 0xc2 && tag != 0xc3)
        return bad(r, field, "expected a bool, found %s", tag_kind(tag));
    *out = tag == 0xc3;
    return TD_OK;
}

td_err msg_read_f32_array(msg_reader *r, const char *field, uint32_t max, float *dst,
                          uint32_t *n)
{
    uint32_t count = 0;
    TD_TRY(msg_read_array_len(r, field, max, &count));
    for (uint32_t i = 0; i < count; i++)
        TD_TRY(msg_read_f32(r, field, &dst[i]));
    *n = count;
    return TD_OK;
}

td_err msg_read_f32_bin(msg_reader *r, const char *field, uint32_t n_want, float **out)
{
    const uint8_t *data = NULL;
    uint32_t len = 0;
    *out = NULL;
    if (n_want > UINT32_MAX / 4)
        return bad(r, field, "%u floats do not fit a bin", n_want);
    TD_TRY(msg_read_bin(r, field, n_want * 4, &data, &len));
    if (len != n_want * 4)
        return bad(r, field, "bin of %u bytes, expected %u floats (%u bytes)", len, n_want,
                   n_want * 4);
    float *v = malloc((size_t)(n_want ? n_want : 1) * sizeof *v);
    if (!v)
        return err_set(TD_ENOMEM, "message %s, field %s: cannot allocate %u floats", r->what,
                       field, n_want);
    for (uint32_t i = 0; i < n_want; i++) {
        const uint8_t *b = data + 4 * (size_t)i;
        uint32_t bits = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                        (uint32_t)b[3] << 24;
        memcpy(&v[i], &bits, sizeof bits);
        if (!isfinite(v[i])) {
            free(v);
            return bad(r, field, "float %u is not finite", i);
        }
    }
    *out = v;
    return TD_OK;
}

td_err msg_read_end(msg_reader *r)
{
    if (left(r) != 0)
        return bad(r, "(end)", "%zu trailing bytes after the message", left(r));
    return TD_OK;
}

td_err msg_read_envelope(msg_reader *r, msg_type want, uint32_t n_fields, msg_header *hdr)
{
    uint32_t n = 0;
    uint64_t version = 0, type = 0, request_id = 0;
    TD_TRY(msg_read_array_len(r, "envelope", UINT32_MAX, &n));
    if (n < 1)
        return bad(r, "envelope", "empty array");
    TD_TRY(msg_read_uint(r, "version", UINT16_MAX, &version));
    if (version != MSG_PROTOCOL_VERSION)
        return err_set(TD_EPROTO,
                       "message from a peer speaking protocol version %llu; this build "
                       "speaks version %u",
                       (unsigned long long)version, MSG_PROTOCOL_VERSION);
    if (n != 4)
        return bad(r, "envelope", "array has %u items, expected 4", n);
    TD_TRY(msg_read_uint(r, "type", UINT16_MAX, &type));
    if (type == 0 || type >= MSG_TYPE_END)
        return err_set(TD_EPROTO, "unknown message type %llu (protocol version %u)",
                       (unsigned long long)type, MSG_PROTOCOL_VERSION);
    if (want != 0 && type != want)
        return err_set(TD_EPROTO, "expected a %s message, got %s", msg_type_name(want),
                       msg_type_name((msg_type)type));
    r->what = msg_type_name((msg_type)type);
    TD_TRY(msg_read_uint(r, "request_id", UINT64_MAX, &request_id));
    if (want != 0) {
        TD_TRY(msg_read_array(r, "payload", n_fields));
    } else {
        uint32_t any = 0;
        TD_TRY(msg_read_array_len(r, "payload", UINT32_MAX, &any));
    }
    if (hdr) {
        hdr->version = (uint16_t)version;
        hdr->type = (msg_type)type;
        hdr->request_id = request_id;
    }
    return TD_OK;
}

/* --- writer ------------------------------------------------------------------------------- */

static int writer_append(void *data, const char *buf, size_t len)
{
    msg_writer *w = data;
    return msg_buf_append(w->buf, buf, len) == TD_OK ? 0 : -1;
}

static void writer_check(msg_writer *w, int rc)
{
    if (rc != 0)
        w->failed = 1;
}

void msg_write_begin(msg_writer *w, msg_buf *buf, msg_type type, uint64_t request_id,
                     uint32_t n_fields)
{
    TD_ASSERT(w && buf && type > 0 && type < MSG_TYPE_END);
    w->buf = buf;
    w->failed = 0;
    buf->len = 0;
    msgpack_packer_init(&w->pk, w, writer_append);
    writer_check(w, msgpack_pack_array(&w->pk, 4));
    writer_check(w, msgpack_pack_uint16(&w->pk, MSG_PROTOCOL_VERSION));
    writer_check(w, msgpack_pack_uint16(&w->pk, (uint16_t)type));
    writer_check(w, msgpack_pack_uint64(&w->pk, request_id));
    writer_check(w, msgpack_pack_array(&w->pk, n_fields));
}

void msg_write_array(msg_writer *w, uint32_t n)
{
    writer_check(w, msgpack_pack_array(&w->pk, n));
}

void msg_write_uint(msg_writer *w, uint64_t v)
{
    writer_check(w, msgpack_pack_uint64(&w->pk, v));
}

void msg_write_f32(msg_writer *w, float v)
{
    writer_check(w, msgpack_pack_float(&w->pk, v));
}

void msg_write_str(msg_writer *w, const char *s)
{
    size_t n = strlen(s);
    writer_check(w, msgpack_pack_str(&w->pk, n));
    writer_check(w, msgpack_pack_str_body(&w->pk, s, n));
}

void msg_write_bin(msg_writer *w, const uint8_t *data, uint32_t len)
{
    writer_check(w, msgpack_pack_bin(&w->pk, len));
    if (len)
        writer_check(w, msgpack_pack_bin_body(&w->pk, data, len));
}

void msg_write_u32_array(msg_writer *w, const uint32_t *v, uint32_t n)
{
    writer_check(w, msgpack_pack_array(&w->pk, n));
    for (uint32_t i = 0; i < n; i++)
        writer_check(w, msgpack_pack_uint32(&w->pk, v[i]));
}

void msg_write_bool(msg_writer *w, bool v)
{
    writer_check(w, v ? msgpack_pack_true(&w->pk) : msgpack_pack_false(&w->pk));
}

void msg_write_f32_array(msg_writer *w, const float *v, uint32_t n)
{
    writer_check(w, msgpack_pack_array(&w->pk, n));
    for (uint32_t i = 0; i < n; i++)
        writer_check(w, msgpack_pack_float(&w->pk, v[i]));
}

void msg_write_f32_bin(msg_writer *w, const float *v, uint32_t n)
{
    TD_ASSERT(n <= UINT32_MAX / 4);
    writer_check(w, msgpack_pack_bin(&w->pk, (size_t)n * 4));
    uint8_t chunk[256];
    size_t used = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof bits);
        chunk[used++] = (uint8_t)bits;
        chunk[used++] = (uint8_t)(bits >> 8);
        chunk[used++] = (uint8_t)(bits >> 16);
        chunk[used++] = (uint8_t)(bits >> 24);
        if (used == sizeof chunk || i + 1 == n) {
            writer_check(w, msgpack_pack_bin_body(&w->pk, chunk, used));
            used = 0;
        }
    }
}

td_err msg_write_end(msg_writer *w)
{
    if (w->failed) {
        w->buf->len = 0;
        return err_set(TD_ENOMEM, "packing a message: out of memory");
    }
    return TD_OK;
}
