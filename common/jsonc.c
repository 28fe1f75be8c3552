/* The JSON constraint's matcher: a set of alternatives, each a deterministic pushdown machine
 * over the compiled schema (common/jsonc_int.h).
 *
 * State blob: a jc_head, then n_alts alternatives back to back. An alternative is a jc_alt
 * (the token being matched) followed by one jc_frame per open object or array, innermost last,
 * so a single shallow alternative grows at the end of the blob and is fed in place; several
 * are fed through a scratch copy, where forks are made and duplicates merged. */
#include <stddef.h>
#include <string.h>

#include "common/jsonc_int.h"

enum {
    LX_NONE,  /* between tokens: the innermost frame's phase says what may come */
    LX_VALUE, /* before a value of `node` (whitespace, then its first byte) */
    LX_STR,   /* inside a string value of `node` */
    LX_KEY,   /* inside an object key */
    LX_NUM,   /* inside a number */
    LX_LIT,   /* inside an enum / const literal of `node` */
    LX_WORD   /* inside true, false or null */
};

enum { F_OBJ_FIRST, F_OBJ_KEY, F_OBJ_COLON, F_OBJ_NEXT, F_ARR_FIRST, F_ARR_NEXT };

/* Number phases, after: '-', a leading '0', integer digits, '.', fraction digits, 'e', the
 * exponent's sign, exponent digits. */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

enum {
    ST_REJECT,
    ST_OK,
    ST_FORK, /* before the first byte of a union's value: the byte is not consumed yet */
    ST_END   /* a number or literal ended before the byte: the byte belongs to what follows */
};

typedef struct jc_head {
    uint32_t used;   /* bytes of the live part, this header included */
    uint32_t n_alts; /* alternatives that follow */
} jc_head;

typedef struct jc_alt {
    uint8_t depth;   /* frames that follow */
    uint8_t ws;      /* whitespace bytes just matched in a row */
    /* The token being matched: all zero but kind and node when one begins. */
    uint8_t kind;    /* LX_* */
    uint8_t sub;     /* STR / KEY: escape phase; NUM: N_*; WORD: which word */
    uint8_t utf8;    /* continuation bytes still due (bits 0-1), range of the next (bits 2-4) */
    uint8_t intonly; /* NUM: the integer grammar */
    uint16_t node;   /* VALUE / STR / NUM / LIT: the value's node; NONE after a key: its value's */
    uint32_t pos;    /* KEY / LIT / WORD / NUM: bytes so far; STR with limits: code points */
    union {
        struct {
            uint16_t lo, hi; /* KEY: declared names [lo, hi) still possible; LIT: literals */
        };
        struct {
            uint16_t digits; /* NUM: integer digits, a lone leading 0 not counted */
            uint16_t exp;    /* NUM: exponent's value, saturating */
        };
    };
    union {
        struct {
            uint16_t hex;  /* \u escape: the hex digits so far */
            uint16_t high; /* \u high surrogate waiting for its low half */
        };
        struct {
            uint8_t neg;   /* NUM: after '-' */
            uint8_t cmp;   /* NUM: integer digits against the int64 limit's: CMP_* */
            uint8_t eneg;  /* NUM: after "e-" */
            uint8_t bound; /* NUM of a node with a range: the digits against the range's
                            * least and greatest magnitude of this sign, CMP_* in bits 0-1
                            * and 2-3 */
        };
    };
} jc_alt;

typedef struct jc_frame {
    uint16_t node;
    uint8_t phase; /* F_* */
    uint8_t pad;
    uint32_t a;    /* object: bits 0-31 of the declared properties seen; array: items begun */
    uint32_t b;    /* object: bits 32-63 */
} jc_frame;

/* Alternatives are compared with memcmp when merging: no padding anywhere. */
_Static_assert(sizeof(jc_alt) == 20 && sizeof(jc_frame) == 12, "jc_alt / jc_frame have padding");

enum { ALT_MAX_BYTES = sizeof(jc_alt) + JC_DEPTH_MAX * sizeof(jc_frame) };

static jc_frame *alt_frames(jc_alt *a)
{
    return (jc_frame *)(a + 1);
}

static size_t alt_size(const jc_alt *a)
{
    return sizeof *a + a->depth * sizeof(jc_frame);
}

static bool is_ws(uint8_t b)
{
    return b == ' ' || b == '\n' || b == '\r' || b == '\t';
}

static uint64_t frame_seen(const jc_frame *f)
{
    return f->a | (uint64_t)f->b << 32;
}

/* Starts a token (or none), clearing whatever the last one left, so that alternatives in the
 * same state are the same bytes and merge. */
static void lex_reset(jc_alt *a, uint8_t kind, uint16_t node)
{
    memset((uint8_t *)a + offsetof(jc_alt, kind), 0, sizeof *a - offsetof(jc_alt, kind));
    a->kind = kind;
    a->node = node;
}

static void value_done(jc_alt *a)
{
    lex_reset(a, LX_NONE, 0);
    if (a->depth) {
        jc_frame *f = &alt_frames(a)[a->depth - 1];
        f->phase = f->phase < F_ARR_FIRST ? F_OBJ_NEXT : F_ARR_NEXT;
    }
}

/* Byte pos of string v, or -1 past its end (so a string that ends there sorts first). */
static int byte_at(const uint8_t *pool, jc_str v, uint32_t pos)
{
    return v.len > pos ? pool[v.off + pos] : -1;
}

/* Narrows [*lo, *hi) of v (sorted, all sharing their first pos bytes) to those whose byte at
 * pos is c, by two binary searches. */
static void narrow(const uint8_t *pool, const jc_str *v, uint16_t *lo, uint16_t *hi, uint32_t pos,
                   uint8_t c)
{
    uint32_t l = *lo, h = *hi;
    while (l < h) {
        uint32_t m = (l + h) / 2;
        if (byte_at(pool, v[m], pos) < c)
            l = m + 1;
        else
            h = m;
    }
    uint32_t first = l;
    h = *hi;
    while (l < h) {
        uint32_t m = (l + h) / 2;
        if (byte_at(pool, v[m], pos) <= c)
            l = m + 1;
        else
            h = m;
    }
    *lo = (uint16_t)first;
    *hi = (uint16_t)l;
}

/* --- strings and keys ------------------------------------------------------------------------- */

static const uint8_t utf8_lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80};
static const uint8_t utf8_hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};

/* A lead byte: sets how many continuation bytes follow and the range of the first, which
 * rules out overlong forms (E0, F0), surrogates (ED) and code points past U+10FFFF (F4). */
static bool utf8_lead(jc_alt *a, uint8_t b)
{
    if (b < 0xC2 || b > 0xF4)
        return false;
    if (b < 0xE0)
        a->utf8 = 1;
    else if (b < 0xF0)
        a->utf8 = (uint8_t)(2 | (b == 0xE0 ? 1 << 2 : b == 0xED ? 2 << 2 : 0));
    else
        a->utf8 = (uint8_t)(3 | (b == 0xF0 ? 3 << 2 : b == 0xF4 ? 4 << 2 : 0));
    return true;
}

static bool utf8_next(jc_alt *a, uint8_t b)
{
    unsigned range = a->utf8 >> 2;
    if (b < utf8_lo[range] || b > utf8_hi[range])
        return false;
    a->utf8 = (uint8_t)((a->utf8 & 3) - 1);
    return true;
}

/* One decoded byte of a key, compared with the declared names still possible. */
static int key_byte(const jc_schema *s, jc_alt *a, uint8_t c)
{
    if (a->lo == a->hi)
        return ST_OK; /* an undeclared key, which the object allows */
    const jc_frame *f = &alt_frames(a)[a->depth - 1];
    const jc_node *o = &s->nodes[f->node];
    narrow(s->pool, s->names + o->first, &a->lo, &a->hi, a->pos, c);
    a->pos++;
    if (a->lo == a->hi) { /* from here on a free string: the same bytes whatever came before */
        a->pos = 0;
        a->lo = a->hi = 0;
        return o->addl != JC_NODE_NONE ? ST_OK : ST_REJECT;
    }
    if (o->addl != JC_NODE_NONE)
        return ST_OK;
    uint64_t range = (a->hi >= 64 ? ~0ull : (1ull << a->hi) - 1) & ~((1ull << a->lo) - 1);
    return range & o->usable & ~frame_seen(f) ? ST_OK : ST_REJECT;
}

static int key_cp(const jc_schema *s, jc_alt *a, uint32_t cp)
{
    uint8_t u[4];
    int n;
    if (cp < 0x80) {
        u[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (uint8_t)(0xC0 | cp >> 6);
        u[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (uint8_t)(0xE0 | cp >> 12);
        u[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (uint8_t)(0xF0 | cp >> 18);
        u[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        u[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    for (int i = 0; i < n; i++)
        if (key_byte(s, a, u[i]) != ST_OK)
            return ST_REJECT;
    return ST_OK;
}

static int key_start(const jc_schema *s, jc_alt *a, const jc_frame *f)
{
    const jc_node *o = &s->nodes[f->node];
    if (o->addl == JC_NODE_NONE && !(o->usable & ~frame_seen(f)))
        return ST_REJECT;
    lex_reset(a, LX_KEY, 0);
    a->hi = (uint16_t)o->n;
    return ST_OK;
}

static int key_end(const jc_schema *s, jc_alt *a)
{
    jc_frame *f = &alt_frames(a)[a->depth - 1];
    const jc_node *o = &s->nodes[f->node];
    uint16_t node = o->addl;
    if (a->lo < a->hi && s->names[o->first + a->lo].len == a->pos) {
        uint64_t bit = 1ull << a->lo, seen = frame_seen(f);
        if ((seen & bit) || !(o->usable & bit))
            return ST_REJECT; /* a repeated key, or one whose value cannot exist */
        seen |= bit;
        f->a = (uint32_t)seen;
        f->b = (uint32_t)(seen >> 32);
        node = s->prop_nodes[o->first + a->lo];
    } else if (node == JC_NODE_NONE) {
        return ST_REJECT;
    }
    lex_reset(a, LX_NONE, node);
    f->phase = F_OBJ_COLON;
    return ST_OK;
}

/* --- string patterns: a string value's code points through its node's automaton, whose state
 * is a->lo (0 when the string begins); a raw UTF-8 character's bits so far are in hex (low 16)
 * and high (the rest) until it is whole. Each character must leave a state from which the
 * pattern can still hold within maxLength, and a character begun (a lead byte, a \u escape's
 * first digits) needs some code point it can become that the automaton takes. */

static const gm_dfa *pat_of(const jc_schema *s, const jc_alt *a)
{
    const uint16_t p = a->kind == LX_STR ? s->nodes[a->node].pattern : 0;
    return p ? s->pats[p - 1] : NULL;
}

/* The code points a match may still take after pos of them, within the node's minLength and
 * maxLength (0 and UINT32_MAX when it has none): false when pos is already past maxLength. */
static bool pat_left(const jc_node *n, uint32_t pos, uint32_t *least, uint32_t *most)
{
    if (pos > n->max_len)
        return false;
    *least = pos < n->min_len ? n->min_len - pos : 0;
    *most = n->max_len - pos;
    return true;
}

/* Whether a string of pos code points in state st can still become a match of a length
 * within the node's bounds (gm_dfa_room: the shortest completion within maxLength, the
 * longest reaching minLength). */
static bool pat_room(const gm_dfa *d, uint16_t st, uint32_t pos, const jc_node *n)
{
    uint32_t least, most;
    return pat_left(n, pos, &least, &most) && gm_dfa_room(d, st, least, most);
}

static bool pat_cp(const jc_schema *s, jc_alt *a, uint32_t cp)
{
    const gm_dfa *d = pat_of(s, a);
    if (!d)
        return true;
    const uint16_t st = gm_dfa_step(d, a->lo, cp);
    if (st == GM_DFA_DEAD || !pat_room(d, st, a->pos, &s->nodes[a->node]))
        return false;
    a->lo = st;
    return true;
}

/* Whether some code point of [lo, hi], the character begun, leaves room for a match within
 * the node's bounds (a->pos counts that character already). */
static bool pat_meets(const jc_schema *s, const jc_alt *a, uint32_t lo, uint32_t hi)
{
    const gm_dfa *d = pat_of(s, a);
    uint32_t least, most;
    if (!d)
        return true;
    return pat_left(&s->nodes[a->node], a->pos, &least, &most) &&
           gm_dfa_meets(d, a->lo, lo, hi > 0x10FFFF ? 0x10FFFF : hi, least, most);
}

/* A raw UTF-8 byte of a pattern string (the lead when lead): its bits, then the character
 * when whole, else the code points it can still become. */
static bool pat_utf8(const jc_schema *s, jc_alt *a, uint8_t b, bool lead)
{
    if (!pat_of(s, a))
        return true;
    const unsigned rest = a->utf8 & 3; /* continuation bytes still due */
    uint32_t cp = lead ? (uint32_t)(b & (0x3F >> rest))
                       : ((uint32_t)a->high << 16 | a->hex) << 6 | (b & 0x3Fu);
    if (rest == 0) {
        a->hex = a->high = 0;
        return pat_cp(s, a, cp);
    }
    a->hex = (uint16_t)cp;
    a->high = (uint16_t)(cp >> 16);
    static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000}; /* by continuation bytes */
    uint32_t lo = cp << 6 * rest, hi = lo | ((1u << 6 * rest) - 1);
    if (lead && lo < least[rest])
        lo = least[rest];
    return pat_meets(s, a, lo, hi);
}

/* After a \u escape's k-th hex digit (low: of the low surrogate after a high one): the code
 * points the escape can still become. */
static bool pat_hex(const jc_schema *s, const jc_alt *a, int k, bool low)
{
    if (!pat_of(s, a))
        return true;
    const uint32_t span = (1u << 4 * (4 - k)) - 1, u_lo = (uint32_t)a->hex << 4 * (4 - k);
    const uint32_t u_hi = u_lo | span;
    if (low) {
        const uint32_t base = 0x10000 + ((uint32_t)(a->high - 0xD800) << 10);
        const uint32_t l = u_lo < 0xDC00 ? 0xDC00 : u_lo, h = u_hi > 0xDFFF ? 0xDFFF : u_hi;
        return l <= h && pat_meets(s, a, base + (l - 0xDC00), base + (h - 0xDC00));
    }
    if (k == 1 && u_lo == 0xD000) /* D800-DBFF stand for U+10000 on: not decided yet */
        return pat_meets(s, a, 0xD000, 0x10FFFF);
    if (u_lo >= 0xD800 && u_hi <= 0xDBFF)
        return pat_meets(s, a, 0x10000 + ((u_lo - 0xD800) << 10),
                         0x10000 + ((u_hi - 0xD800) << 10) + 0x3FF);
    return pat_meets(s, a, u_lo, u_hi);
}

/* A character begins in a string value: counted only when its length is limited. */
static bool str_char(const jc_schema *s, jc_alt *a)
{
    if (a->kind != LX_STR || !s->nodes[a->node].has_len)
        return true;
    if (a->pos >= s->nodes[a->node].max_len)
        return false;
    a->pos++;
    return true;
}

static int str_end(const jc_schema *s, jc_alt *a)
{
    if (a->kind == LX_KEY)
        return key_end(s, a);
    if (a->pos < s->nodes[a->node].min_len)
        return ST_REJECT;
    const gm_dfa *d = pat_of(s, a);
    if (d && !gm_dfa_accepts(d, a->lo))
        return ST_REJECT;
    value_done(a);
    return ST_OK;
}

static int hex_digit(uint8_t b)
{
    if (b >= '0' && b <= '9')
        return b - '0';
    b |= 0x20;
    return b >= 'a' && b <= 'f' ? b - 'a' + 10 : -1;
}

/* The code point of a declared name at byte pos (names are UTF-8), or -1 past its end. */
static int32_t name_cp(const uint8_t *pool, jc_str v, uint32_t pos)
{
    if (pos >= v.len)
        return -1;
    const uint8_t *p = pool + v.off + pos;
    const uint32_t n = v.len - pos;
    if (p[0] < 0x80)
        return p[0];
    const int k = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : 2;
    if ((uint32_t)k > n)
        return -1;
    int32_t cp = p[0] & (0x7F >> k);
    for (int i = 1; i < k; i++)
        cp = cp << 6 | (p[i] & 0x3F);
    return cp;
}

/* A \u escape in a key that can only be a declared name: some unseen candidate's next
 * character must be the one whose UTF-16 unit starts with the digits so far (digits: 1..4;
 * low: the low unit after the high one in a->high). Without this, a prefix like "\udab" could
 * stay viable with no name to complete it. */
static bool key_hex_viable(const jc_schema *s, jc_alt *a, int digits, bool low)
{
    if (a->lo == a->hi)
        return true;
    const jc_frame *f = &alt_frames(a)[a->depth - 1];
    const jc_node *o = &s->nodes[f->node];
    if (o->addl != JC_NODE_NONE)
        return true;
    const jc_str *v = s->names + o->first;
    const uint64_t live = o->usable & ~frame_seen(f);
    for (uint32_t i = a->lo; i < a->hi; i++) {
        const int32_t cp = name_cp(s->pool, v[i], a->pos);
        if (!(live >> i & 1) || cp < 0)
            continue;
        uint32_t unit = (uint32_t)cp;
        if (cp >= 0x10000) {
            const uint32_t hi = 0xD800 + ((uint32_t)(cp - 0x10000) >> 10);
            if (low && hi != a->high)
                continue;
            unit = low ? 0xDC00 + ((uint32_t)(cp - 0x10000) & 0x3FF) : hi;
        } else if (low) {
            continue;
        }
        if (unit >> (4 * (4 - digits)) == a->hex)
            return true;
    }
    return false;
}

/* Escape phases: 0 none, 1 after '\', 2-5 the \u's hex digits, 6-7 "\u" of the low surrogate
 * due after a high one, 8-11 its hex digits. */
static int str_escape(const jc_schema *s, jc_alt *a, uint8_t b)
{
    static const char simple[] = "\"\\/bfnrt", decoded[] = "\"\\/\b\f\n\r\t";
    bool key = a->kind == LX_KEY;
    if (a->sub == 1) {
        if (b == 'u') {
            a->sub = 2;
            return ST_OK;
        }
        const char *p = b ? strchr(simple, b) : NULL;
        if (!p)
            return ST_REJECT;
        a->sub = 0;
        if (key)
            return key_byte(s, a, (uint8_t)decoded[p - simple]);
        return pat_cp(s, a, (uint8_t)decoded[p - simple]) ? ST_OK : ST_REJECT;
    }
    if (a->sub == 6 || a->sub == 7) {
        if (b != (a->sub == 6 ? '\\' : 'u'))
            return ST_REJECT;
        a->sub++;
        return ST_OK;
    }
    int d = hex_digit(b);
    if (d < 0)
        return ST_REJECT;
    a->hex = (uint16_t)(a->hex << 4 | d);
    /* The first two digits decide the surrogate range, so a prefix that only a lone low
     * surrogate (or, after a high one, anything but a low one) could complete dies here. */
    const bool first = a->sub <= 5;
    if ((a->sub == 3 || a->sub == 9) && ((a->hex >= 0xDC && a->hex <= 0xDF) != !first))
        return ST_REJECT;
    if (a->sub == 8 && a->hex != 0xD)
        return ST_REJECT;
    if (key && !key_hex_viable(s, a, first ? a->sub - 1 : a->sub - 7, !first))
        return ST_REJECT;
    if (!key && !pat_hex(s, a, first ? a->sub - 1 : a->sub - 7, !first))
        return ST_REJECT;
    if (a->sub != 5 && a->sub != 11) {
        a->sub++;
        return ST_OK;
    }
    uint32_t cp = a->hex;
    bool low = cp >= 0xDC00 && cp <= 0xDFFF;
    if (a->sub == 5 && cp >= 0xD800 && cp <= 0xDBFF) {
        a->high = (uint16_t)cp;
        a->hex = 0;
        a->sub = 6;
        return ST_OK;
    }
    if (low != (a->sub == 11))
        return ST_REJECT; /* a lone low surrogate, or a high one not followed by a low one */
    if (low)
        cp = 0x10000 + ((uint32_t)(a->high - 0xD800) << 10) + (cp - 0xDC00);
    a->sub = 0;
    a->hex = a->high = 0;
    if (key)
        return key_cp(s, a, cp);
    return pat_cp(s, a, cp) ? ST_OK : ST_REJECT;
}

static int str_byte(const jc_schema *s, jc_alt *a, uint8_t b)
{
    if (a->sub)
        return str_escape(s, a, b);
    if (a->utf8) {
        if (!utf8_next(a, b) || !pat_utf8(s, a, b, false))
            return ST_REJECT;
    } else if (b >= 0x80) {
        if (!utf8_lead(a, b) || !str_char(s, a) || !pat_utf8(s, a, b, true))
            return ST_REJECT;
    } else if (b == '"') {
        return str_end(s, a);
    } else if (b < 0x20) {
        return ST_REJECT;
    } else if (b == '\\') {
        /* an escape writes one more character: a declared-only key needs a name that has one */
        if (!str_char(s, a) || (a->kind == LX_KEY && !key_hex_viable(s, a, 0, false)))
            return ST_REJECT;
        a->sub = 1;
        return ST_OK;
    } else if (!str_char(s, a)) {
        return ST_REJECT;
    }
    if (a->kind == LX_KEY)
        return key_byte(s, a, b);
    return b < 0x80 && !pat_cp(s, a, b) ? ST_REJECT : ST_OK;
}

/* --- numbers, literals, words ----------------------------------------------------------------- */

/* Numbers end only where jansson can read them, as the server parses what it generated: an
 * integer within int64, and a real whose decimal magnitude (integer digits plus exponent) stays
 * below 308, so it cannot overflow a double (a bound that refuses a few reals near DBL_MAX). */
enum { CMP_EQUAL, CMP_LESS, CMP_GREATER, INT64_DIGITS = 19, REAL_MAGNITUDE_MAX = 308 };

/* --- number ranges (jc_node.has_range) ---------------------------------------------------------
 * A number's magnitude is compared digit by digit with the least and greatest magnitude of its
 * sign (jc_side). `bound` keeps the two comparisons, CMP_* in bits 0-1 (lo) and 2-3 (hi): in the
 * integer part, of its digits so far with as many leading digits of the bound's integer part;
 * from the '.' on, of the whole number so far with the bound cut after as many fraction digits
 * (integer parts compared by length first). A ranged number has no exponent. */
enum { B_LO, B_HI };

static const jc_side *num_side(const jc_schema *s, const jc_alt *a)
{
    return &s->nodes[a->node].sides[a->neg];
}

static const jc_dec *side_dec(const jc_side *sd, int w)
{
    return w == B_LO ? &sd->lo : &sd->hi;
}

static int bound_get(const jc_alt *a, int w)
{
    return a->bound >> 2 * w & 3;
}

static void bound_set(jc_alt *a, int w, int c)
{
    a->bound = (uint8_t)((a->bound & ~(3u << 2 * w)) | (unsigned)c << 2 * w);
}

static int cmp_byte(uint8_t x, uint8_t y)
{
    return x < y ? CMP_LESS : x > y ? CMP_GREATER : CMP_EQUAL;
}

/* Fraction digits so far (while a byte is being read: the index of a fraction digit in it). */
static int num_frac_digits(const jc_alt *a)
{
    return (int)a->pos - a->neg - (a->digits ? a->digits : 1) - 1;
}

/* The integer part so far (all of it) against the bound's, given c for equal lengths. */
static int int_rel(const jc_alt *a, const jc_dec *d, int c)
{
    return a->digits < d->n_int ? CMP_LESS : a->digits > d->n_int ? CMP_GREATER : c;
}

/* The number so far, as it is, against bound w (a bound with more digits is larger). */
static int num_rel(const jc_schema *s, const jc_alt *a, int w)
{
    const jc_dec *d = side_dec(num_side(s, a), w);
    if (a->sub == N_FRAC) {
        const int c = bound_get(a, w);
        return c == CMP_EQUAL && d->n_frac > num_frac_digits(a) ? CMP_LESS : c;
    }
    const int c = int_rel(a, d, bound_get(a, w));
    return c == CMP_EQUAL && d->n_frac > 0 ? CMP_LESS : c;
}

/* Whether the number so far is inside the range. */
static bool num_range_in(const jc_schema *s, const jc_alt *a)
{
    if (!s->nodes[a->node].has_range)
        return true;
    const jc_side *sd = num_side(s, a);
    if (!sd->ok || (a->sub != N_ZERO && a->sub != N_INT && a->sub != N_FRAC))
        return false;
    return num_rel(s, a, B_LO) != CMP_LESS && (sd->inf || num_rel(s, a, B_HI) != CMP_GREATER);
}

/* Whether some number of the range begins with the number so far (it may be the number). */
static bool num_range_viable(const jc_schema *s, const jc_alt *a)
{
    if (!s->nodes[a->node].has_range)
        return true;
    const jc_side *sd = num_side(s, a);
    if (!sd->ok)
        return false;
    const int clo = bound_get(a, B_LO), chi = bound_get(a, B_HI);
    switch (a->sub) {
    case N_MINUS: return true;
    case N_ZERO: /* 0, or 0.x with a fraction: [0, 1) */
        return a->intonly ? num_range_in(s, a) : sd->lo.n_int == 0;
    case N_INT: {
        /* a completion of L >= k integer digits: P's least of that length <= hi, its greatest
         * (with a fraction where allowed) >= lo */
        const int k = a->digits, most = JC_NUMBER_MAX - a->neg;
        const int last = sd->inf || sd->hi.n_int > most ? most : sd->hi.n_int;
        for (int L = k; L <= last; L++) {
            const bool below = sd->inf || L < sd->hi.n_int || chi != CMP_GREATER;
            const bool above = L > sd->lo.n_int || (L == sd->lo.n_int && clo != CMP_LESS);
            if (below && above)
                return true;
        }
        return false;
    }
    case N_DOT:
    case N_FRAC: /* the completions fill [v, v + 10^-j): lo and hi compared at j digits */
        return clo != CMP_LESS && (sd->inf || chi != CMP_GREATER);
    default: return false;
    }
}

/* Bound comparisons after an integer digit b, a fraction digit b, or the '.'. */
static void num_range_digit(const jc_schema *s, jc_alt *a, uint8_t b, bool frac)
{
    const jc_side *sd = num_side(s, a);
    if (!s->nodes[a->node].has_range || !sd->ok)
        return;
    for (int w = B_LO; w <= (sd->inf ? B_LO : B_HI); w++) {
        const jc_dec *d = side_dec(sd, w);
        if (bound_get(a, w) != CMP_EQUAL)
            continue;
        if (!frac && a->digits < d->n_int)
            bound_set(a, w, cmp_byte(b, s->pool[d->off + a->digits]));
        if (frac) {
            const int j = num_frac_digits(a);
            bound_set(a, w, cmp_byte(b, j < d->n_frac ? s->pool[d->off + d->n_int + j] : '0'));
        }
    }
}

static void num_range_dot(const jc_schema *s, jc_alt *a)
{
    const jc_side *sd = num_side(s, a);
    if (!s->nodes[a->node].has_range || !sd->ok)
        return;
    for (int w = B_LO; w <= B_HI; w++)
        bound_set(a, w, int_rel(a, side_dec(sd, w), bound_get(a, w)));
}

static bool num_int_fits(const jc_alt *a)
{
    return a->digits < INT64_DIGITS || (a->digits == INT64_DIGITS && a->cmp != CMP_GREATER);
}

static bool num_real_fits(const jc_alt *a)
{
    return a->eneg || (a->digits ? a->digits - 1 : 0) + a->exp < REAL_MAGNITUDE_MAX;
}

static bool num_can_end(const jc_schema *s, const jc_alt *a)
{
    switch (a->sub) {
    case N_ZERO:
    case N_INT: return num_int_fits(a) && num_range_in(s, a);
    case N_FRAC: return num_real_fits(a) && num_range_in(s, a);
    case N_EXP: return num_real_fits(a);
    default: return false;
    }
}

/* Bytes still needed before the number can end: a prefix is viable only if they fit. */
static uint32_t num_need(const jc_schema *s, const jc_alt *a)
{
    /* a number outside its range so far needs one more digit at least */
    const uint32_t range = num_range_in(s, a) ? 0 : 1;
    switch (a->sub) {
    case N_ZERO:
    case N_INT: return num_int_fits(a) ? range : 2; /* ".0" */
    case N_FRAC: return range;
    case N_EXP: return 0;
    default: return 1;
    }
}

static void num_digit(const jc_schema *s, jc_alt *a, uint8_t b)
{
    static const char limit[2][INT64_DIGITS + 1] = {"9223372036854775807", "9223372036854775808"};
    if (a->digits < INT64_DIGITS && a->cmp == CMP_EQUAL) {
        char l = limit[a->neg][a->digits];
        a->cmp = b < l ? CMP_LESS : b > l ? CMP_GREATER : CMP_EQUAL;
    }
    num_range_digit(s, a, b, false);
    a->digits++;
}

static int num_byte(const jc_schema *s, jc_alt *a, uint8_t b)
{
    const bool ranged = s->nodes[a->node].has_range;
    bool digit = b >= '0' && b <= '9', dot = b == '.' && !a->intonly;
    bool e = (b == 'e' || b == 'E') && !a->intonly && !ranged;
    uint8_t next;
    switch (a->sub) {
    case N_MINUS:
        if (!digit)
            return ST_REJECT;
        next = b == '0' ? N_ZERO : N_INT;
        if (b != '0')
            num_digit(s, a, b);
        break;
    case N_ZERO:
    case N_INT:
        if (digit && a->sub == N_INT) {
            next = N_INT;
            num_digit(s, a, b);
            if (a->intonly && !num_int_fits(a))
                return ST_REJECT;
        } else if (dot || e) {
            next = dot ? N_DOT : N_E;
            if (dot)
                num_range_dot(s, a);
        } else {
            return num_can_end(s, a) ? ST_END : ST_REJECT;
        }
        break;
    case N_DOT:
        if (!digit)
            return ST_REJECT;
        next = N_FRAC;
        num_range_digit(s, a, b, true);
        break;
    case N_FRAC:
        if (!digit && !e)
            return num_can_end(s, a) ? ST_END : ST_REJECT;
        next = digit ? N_FRAC : N_E;
        if (digit)
            num_range_digit(s, a, b, true);
        break;
    case N_E:
        if (b == '+' || b == '-')
            next = N_ESIGN;
        else if (digit)
            next = N_EXP;
        else
            return ST_REJECT;
        a->eneg = b == '-';
        break;
    case N_ESIGN:
        if (!digit)
            return ST_REJECT;
        next = N_EXP;
        break;
    default: /* N_EXP */
        if (!digit)
            return num_can_end(s, a) ? ST_END : ST_REJECT;
        next = N_EXP;
        break;
    }
    if (next == N_EXP) {
        uint32_t v = a->exp * 10u + (uint32_t)(b - '0');
        a->exp = (uint16_t)(v > UINT16_MAX ? UINT16_MAX : v);
        if (!num_real_fits(a))
            return ST_REJECT; /* more exponent digits only make it larger */
    }
    a->sub = next;
    if (!num_range_viable(s, a))
        return ST_REJECT;
    return ++a->pos + num_need(s, a) > JC_NUMBER_MAX ? ST_REJECT : ST_OK;
}

static bool lit_can_end(const jc_schema *s, const jc_alt *a)
{
    return a->lo < a->hi && s->lits[s->nodes[a->node].first + a->lo].len == a->pos;
}

static int lit_byte(const jc_schema *s, jc_alt *a, uint8_t b)
{
    const jc_str *v = s->lits + s->nodes[a->node].first;
    bool can_end = lit_can_end(s, a);
    narrow(s->pool, v, &a->lo, &a->hi, a->pos, b);
    if (a->lo == a->hi)
        return can_end ? ST_END : ST_REJECT; /* "1" of enum [1, 12] followed by ',' */
    a->pos++;
    if (a->hi - a->lo == 1 && v[a->lo].len == a->pos)
        value_done(a);
    return ST_OK;
}

static const char *const words[3] = {"true", "false", "null"};

static int word_byte(jc_alt *a, uint8_t b)
{
    const char *w = words[a->sub];
    if (b != (uint8_t)w[a->pos])
        return ST_REJECT;
    if (w[++a->pos] == 0)
        value_done(a);
    return ST_OK;
}

/* --- values and containers -------------------------------------------------------------------- */

static int push(jc_alt *a, uint16_t node, uint8_t phase)
{
    if (a->depth >= JC_DEPTH_MAX)
        return ST_REJECT;
    alt_frames(a)[a->depth++] = (jc_frame){node, phase, 0, 0, 0};
    lex_reset(a, LX_NONE, 0);
    return ST_OK;
}

static int pop(jc_alt *a)
{
    a->depth--;
    value_done(a);
    return ST_OK;
}

/* The first byte of a value of a->node (not a union). */
static int value_start(const jc_schema *s, jc_alt *a, uint8_t b)
{
    uint16_t idx = a->node;
    const jc_node *n = &s->nodes[idx];
    if (n->kind == JN_UNION)
        return ST_FORK;
    if (n->kind == JN_LIT) {
        if (n->n == 0)
            return ST_REJECT;
        lex_reset(a, LX_LIT, idx);
        a->hi = (uint16_t)n->n;
        return lit_byte(s, a, b);
    }
    uint8_t t = n->types;
    switch (b) {
    case '{':
        return t & JT_OBJ ? push(a, idx, F_OBJ_FIRST) : ST_REJECT;
    case '[':
        return t & JT_ARR ? push(a, idx, F_ARR_FIRST) : ST_REJECT;
    case '"':
        if (!(t & JT_STR))
            return ST_REJECT;
        lex_reset(a, LX_STR, idx);
        if (s->nodes[idx].pattern &&
            !pat_room(s->pats[s->nodes[idx].pattern - 1], 0, 0, &s->nodes[idx]))
            return ST_REJECT; /* no match of a length the bounds allow */
        return ST_OK;
    case 't':
    case 'f':
    case 'n':
        if (!(t & (b == 'n' ? JT_NULL : JT_BOOL)))
            return ST_REJECT;
        lex_reset(a, LX_WORD, 0);
        a->sub = b == 't' ? 0 : b == 'f' ? 1 : 2;
        a->pos = 1;
        return ST_OK;
    default:
        if (b != '-' && !(b >= '0' && b <= '9'))
            return ST_REJECT;
        if (!(t & (JT_INT | JT_FRAC)))
            return ST_REJECT;
        lex_reset(a, LX_NUM, idx);
        a->intonly = !(t & JT_FRAC);
        a->neg = b == '-';
        a->sub = b == '-' ? N_MINUS : b == '0' ? N_ZERO : N_INT;
        if (a->sub == N_INT)
            num_digit(s, a, b);
        a->pos = 1;
        return num_range_viable(s, a) ? ST_OK : ST_REJECT;
    }
}

static uint16_t item_node(const jc_schema *s, const jc_node *n, uint32_t i)
{
    return i < n->pn ? s->prefix[n->pfirst + i] : n->items;
}

/* A structural byte between tokens. */
static int punct(const jc_schema *s, jc_alt *a, uint8_t b)
{
    if (a->depth == 0)
        return ST_REJECT; /* after the document only whitespace */
    jc_frame *f = &alt_frames(a)[a->depth - 1];
    const jc_node *n = &s->nodes[f->node];
    switch (f->phase) {
    case F_OBJ_FIRST:
    case F_OBJ_NEXT:
        if (b == '}')
            return (n->required & ~frame_seen(f)) ? ST_REJECT : pop(a);
        if (f->phase == F_OBJ_FIRST)
            return b == '"' ? key_start(s, a, f) : ST_REJECT;
        if (b != ',' || (n->addl == JC_NODE_NONE && !(n->usable & ~frame_seen(f))))
            return ST_REJECT;
        f->phase = F_OBJ_KEY;
        return ST_OK;
    case F_OBJ_KEY:
        return b == '"' ? key_start(s, a, f) : ST_REJECT;
    case F_OBJ_COLON:
        if (b != ':')
            return ST_REJECT;
        a->kind = LX_VALUE;
        return ST_OK;
    case F_ARR_FIRST:
        if (b == ']')
            return n->min_items ? ST_REJECT : pop(a);
        if (n->max_items == 0)
            return ST_REJECT;
        f->a = 1;
        lex_reset(a, LX_VALUE, item_node(s, n, 0));
        return value_start(s, a, b);
    default: /* F_ARR_NEXT */
        if (b == ']')
            return f->a < n->min_items ? ST_REJECT : pop(a);
        if (b != ',' || f->a >= n->max_items)
            return ST_REJECT;
        lex_reset(a, LX_VALUE, item_node(s, n, f->a));
        f->a++;
        return ST_OK;
    }
}

static int ws_byte(const jc_schema *s, jc_alt *a)
{
    return ++a->ws > s->ws_max ? ST_REJECT : ST_OK;
}

static int alt_step(const jc_schema *s, jc_alt *a, uint8_t b)
{
    for (;;) {
        int r;
        switch (a->kind) {
        case LX_STR:
        case LX_KEY:
            return str_byte(s, a, b);
        case LX_WORD:
            return word_byte(a, b);
        case LX_NUM:
            r = num_byte(s, a, b);
            break;
        case LX_LIT:
            r = lit_byte(s, a, b);
            break;
        case LX_VALUE:
            if (is_ws(b))
                return ws_byte(s, a);
            a->ws = 0;
            return value_start(s, a, b);
        default:
            if (is_ws(b))
                return ws_byte(s, a);
            a->ws = 0;
            return punct(s, a, b);
        }
        if (r != ST_END)
            return r;
        value_done(a);
    }
}

/* --- the set of alternatives ------------------------------------------------------------------ */

static jc_alt *head_alts(jc_head *h)
{
    return (jc_alt *)(h + 1);
}

/* Keeps the alternative just written at out + *at unless an equal one is there already;
 * false when that would make more than the schema's limit. */
static bool keep(const jc_schema *s, jc_head *o, size_t *at, const jc_alt *x)
{
    size_t sz = alt_size(x);
    const uint8_t *p = (const uint8_t *)head_alts(o);
    for (uint32_t i = 0; i < o->n_alts; i++) {
        size_t psz = alt_size((const jc_alt *)p);
        if (psz == sz && memcmp(p, x, sz) == 0)
            return true;
        p += psz;
    }
    if (o->n_alts >= s->max_alts)
        return false;
    o->n_alts++;
    *at += sz;
    return true;
}

static bool feed_alts(const jc_schema *s, jc_head *h, uint8_t b)
{
    /* Room for the kept alternatives and one more being tried. */
    _Alignas(8) uint8_t out[sizeof(jc_head) + (JC_ALT_MAX + 1) * ALT_MAX_BYTES];
    _Alignas(8) uint8_t tmpl[ALT_MAX_BYTES];
    jc_head *o = (jc_head *)out;
    o->n_alts = 0;
    size_t at = sizeof *o;
    const uint8_t *p = (const uint8_t *)head_alts(h);
    for (uint32_t k = 0; k < h->n_alts; k++) {
        size_t sz = alt_size((const jc_alt *)p);
        jc_alt *x = (jc_alt *)(out + at);
        memcpy(x, p, sz);
        p += sz;
        int r = alt_step(s, x, b);
        if (r == ST_OK && !keep(s, o, &at, x))
            return false;
        if (r != ST_FORK)
            continue;
        memcpy(tmpl, x, alt_size(x));
        const jc_node *u = &s->nodes[x->node];
        for (uint32_t i = 0; i < u->n; i++) {
            x = (jc_alt *)(out + at);
            memcpy(x, tmpl, alt_size((const jc_alt *)tmpl));
            x->node = s->leaves[u->first + i];
            if (alt_step(s, x, b) == ST_OK && !keep(s, o, &at, x))
                return false;
        }
    }
    if (o->n_alts == 0)
        return false;
    o->used = (uint32_t)at;
    memcpy(h, out, at);
    return true;
}

/* --- API -------------------------------------------------------------------------------------- */

size_t jc_state_size(const jc_schema *s)
{
    return sizeof(jc_head) + (size_t)s->max_alts * ALT_MAX_BYTES;
}

void jc_state_init(const jc_schema *s, void *st)
{
    jc_head *h = st;
    jc_alt *a = head_alts(h);
    memset(a, 0, sizeof *a);
    lex_reset(a, LX_VALUE, s->root);
    h->n_alts = 1;
    h->used = sizeof *h + sizeof *a;
}

void jc_state_copy(const jc_schema *s, void *dst, const void *src)
{
    (void)s;
    memcpy(dst, src, ((const jc_head *)src)->used);
}

size_t jc_state_used(const void *st)
{
    return ((const jc_head *)st)->used;
}

bool jc_feed(const jc_schema *s, void *st, const uint8_t *bytes, size_t n)
{
    jc_head *h = st;
    for (size_t i = 0; i < n; i++) {
        if (h->n_alts == 1) {
            jc_alt *a = head_alts(h);
            int r = alt_step(s, a, bytes[i]);
            if (r == ST_OK) {
                h->used = (uint32_t)(sizeof *h + alt_size(a));
                continue;
            }
            if (r == ST_REJECT)
                return false;
        }
        if (!feed_alts(s, h, bytes[i]))
            return false;
    }
    return true;
}

bool jc_done(const jc_schema *s, const void *st)
{
    const jc_head *h = st;
    const uint8_t *p = (const uint8_t *)(h + 1);
    for (uint32_t k = 0; k < h->n_alts; k++) {
        const jc_alt *a = (const jc_alt *)p;
        if (a->depth == 0 && (a->kind == LX_NONE || (a->kind == LX_NUM && num_can_end(s, a)) ||
                              (a->kind == LX_LIT && lit_can_end(s, a))))
            return true;
        p += alt_size(a);
    }
    return false;
}

bool jc_free_string(const jc_schema *s, const void *st)
{
    const jc_head *h = st;
    const uint8_t *p = (const uint8_t *)(h + 1);
    for (uint32_t k = 0; k < h->n_alts; k++) {
        const jc_alt *a = (const jc_alt *)p;
        bool free_str = a->kind == LX_STR && !s->nodes[a->node].has_len &&
                        !s->nodes[a->node].pattern;
        bool free_key = a->kind == LX_KEY && a->lo == a->hi;
        if (!(free_str || free_key) || a->sub || a->utf8)
            return false;
        p += alt_size(a);
    }
    return h->n_alts > 0;
}
