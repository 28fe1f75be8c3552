/* Internal to common/msg*.c: the bounded msgpack reader and the writer every message's
 * pack/unpack is built from. Not for use outside the msg module.
 *
 * Writing goes through msgpack-c's packer. Reading does not: msgpack-c's C unpacker builds an
 * object tree and allocates count * 24 bytes as soon as it sees an array header, before any
 * element arrives, so a 5-byte hostile message ([array32 0xffffffff]) asks for 96 GiB. The
 * reader here instead pulls one field at a time, checks it against the message's schema (type,
 * width, length limit) and against the bytes actually left, and allocates only after a count
 * is known to fit in them. Every failure is TD_EFORMAT naming the message and the field. */
#ifndef TANDEM_COMMON_MSG_CODEC_H
#define TANDEM_COMMON_MSG_CODEC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "common/msg.h"

typedef struct msg_reader {
    const uint8_t *start; /* first byte of the message */
    const uint8_t *p;     /* next byte to read */
    const uint8_t *end;   /* one past the last byte */
    const char *what;     /* message name for error text ("gen_start") */
} msg_reader;

void msg_reader_init(msg_reader *r, const void *buf, size_t len, const char *what);

/* An array header with exactly want items. */
td_err msg_read_array(msg_reader *r, const char *field, uint32_t want);

/* An array header with at most max items; the count goes to *n. */
td_err msg_read_array_len(msg_reader *r, const char *field, uint32_t max, uint32_t *n);

/* A non-negative integer in any msgpack encoding, at most max. */
td_err msg_read_uint(msg_reader *r, const char *field, uint64_t max, uint64_t *out);

/* A float32 or float64 that is finite and representable as a float. */
td_err msg_read_f32(msg_reader *r, const char *field, float *out);

/* A string of at most cap - 1 bytes without NUL bytes, copied into dst and NUL-terminated. */
td_err msg_read_str(msg_reader *r, const char *field, char *dst, size_t cap);

/* A bin of at most max bytes; *data points into the input (not copied). */
td_err msg_read_bin(msg_reader *r, const char *field, uint32_t max, const uint8_t **data,
                    uint32_t *len);

/* An array of min_n..max_n u32 values, copied into a new malloc'd array (*out, NULL when
 * empty; the caller frees it). */
td_err msg_read_u32_array(msg_reader *r, const char *field, uint32_t min_n, uint32_t max_n,
                          uint32_t **out, uint32_t *n);

/* A msgpack bool (true/false; integers are not bools). */
td_err msg_read_bool(msg_reader *r, const char *field, bool *out);

/* An array of at most max floats (msg_read_f32 each) into dst; the count goes to *n. */
td_err msg_read_f32_array(msg_reader *r, const char *field, uint32_t max, float *dst,
                          uint32_t *n);

/* A bin of n_want little-endian f32 values (4 * n_want bytes), each finite, copied into a new
 * malloc'd array (*out; the caller frees it). */
td_err msg_read_f32_bin(msg_reader *r, const char *field, uint32_t n_want, float **out);

/* No bytes may follow the message. */
td_err msg_read_end(msg_reader *r);

/* Reads the envelope [version, type, request_id, [payload]] and the payload's array header,
 * which must have exactly n_fields items. A version mismatch or a type other than want is
 * TD_EPROTO; pass want = 0 to accept any known type (the header is then returned in *hdr). */
td_err msg_read_envelope(msg_reader *r, msg_type want, uint32_t n_fields, msg_header *hdr);

typedef struct msg_writer {
    msgpack_packer pk;
    msg_buf *buf;
    int failed; /* sticky: a write ran out of memory */
} msg_writer;

/* Empties buf and writes the envelope and the payload array header of n_fields items. */
void msg_write_begin(msg_writer *w, msg_buf *buf, msg_type type, uint64_t request_id,
                     uint32_t n_fields);
void msg_write_array(msg_writer *w, uint32_t n);
void msg_write_uint(msg_writer *w, uint64_t v);
void msg_write_f32(msg_writer *w, float v);
void msg_write_str(msg_writer *w, const char *s); /* NUL-terminated */
void msg_write_bin(msg_writer *w, const uint8_t *data, uint32_t len);
void msg_write_u32_array(msg_writer *w, const uint32_t *v, uint32_t n);
void msg_write_bool(msg_writer *w, bool v);
void msg_write_f32_array(msg_writer *w, const float *v, uint32_t n);
/* n floats as one bin of little-endian f32 (4 bytes each: compact for long vectors). */
void msg_write_f32_bin(msg_writer *w, const float *v, uint32_t n);

/* TD_OK, or TD_ENOMEM when any write failed. */
td_err msg_write_end(msg_writer *w);

/* Copies the envelope's request id to *dst when dst is not NULL. */
static inline void msg_put_request_id(uint64_t *dst, const msg_header *h)
{
    if (dst)
        *dst = h->request_id;
}

/* An inline char array must hold its NUL: anything else is a caller's bug. */
#define MSG_ASSERT_TERMINATED(arr) TD_ASSERT(memchr((arr), 0, sizeof(arr)) != NULL)

/* Sampler settings, a nested array shared by every message that carries them; the check
 * returns code (TD_EINVAL when packing, TD_EFORMAT when unpacking) for values out of range. */
td_err msg_check_sampler(const char *what, const msg_sampler *s, td_err code);
void msg_write_sampler(msg_writer *w, const msg_sampler *s);
td_err msg_read_sampler(msg_reader *r, msg_sampler *s);

/* The value rules of a shared buffer announcement (also nested in kv_pools). */
td_err msg_check_shbuf_announce(const msg_shbuf_announce *m, td_err code);

#endif
