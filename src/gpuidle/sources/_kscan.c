/* Kineto event chunks straight to columns, with no Python object per event.
 *
 * scan(b"[{...}, {...}]") reads the fields the model uses into typed arrays and interns the strings (category,
 * phase, name, string pids and tids) in the order they first appear. It reads a strict subset of what the typed
 * decoder (msgspec, kineto_events.Event) accepts: anything else -- bad syntax, a type the decoder would refuse or
 * coerce, a duplicated field, an integer past int64, deep nesting -- returns None, and the caller decodes the
 * chunk the general way, which gives that chunk's values or its error. The scan itself runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef const unsigned char *Ptr;

enum { OK = 0, FALLBACK = -1, NOMEM = -2 };
#define MAX_DEPTH 64

/* --- interned strings: open addressing over (bytes, length), ids in order of first appearance --- */

typedef struct {
    uint64_t hash;
    const char *p;
    Py_ssize_t len;
    int32_t id;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask, used;
    const char **order_p; /* id -> bytes */
    Py_ssize_t *order_len;
    char **owned; /* copies of strings that held escapes */
    size_t n_owned, owned_cap;
} Table;

static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

static int table_init(Table *t) {
    memset(t, 0, sizeof *t);
    t->mask = 1023;
    t->slots = calloc(t->mask + 1, sizeof(Slot));
    t->order_p = malloc((t->mask + 1) / 2 * sizeof(char *));
    t->order_len = malloc((t->mask + 1) / 2 * sizeof(Py_ssize_t));
    return t->slots && t->order_p && t->order_len ? OK : NOMEM;
}

static void table_free(Table *t) {
    for (size_t i = 0; i < t->n_owned; i++) free(t->owned[i]);
    free(t->owned);
    free(t->slots);
    free(t->order_p);
    free(t->order_len);
}

static int table_grow(Table *t) {
    size_t cap = (t->mask + 1) * 2;
    Slot *slots = calloc(cap, sizeof(Slot));
    const char **op = realloc(t->order_p, cap / 2 * sizeof(char *));
    if (op) t->order_p = op;
    Py_ssize_t *ol = realloc(t->order_len, cap / 2 * sizeof(Py_ssize_t));
    if (ol) t->order_len = ol;
    if (!slots || !op || !ol) {
        free(slots);
        return NOMEM;
    }
    for (size_t i = 0; i <= t->mask; i++) {
        Slot *s = &t->slots[i];
        if (!s->p) continue;
        size_t j = s->hash & (cap - 1);
        while (slots[j].p) j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    free(t->slots);
    t->slots = slots;
    t->mask = cap - 1;
    return OK;
}

/* The id of p[:n]; `copy`: p is scratch memory, keep a copy if the string is new. -1 and NOMEM on failure. */
static int32_t intern(Table *t, const char *p, Py_ssize_t n, int copy) {
    uint64_t h = hash_bytes(p, n);
    size_t j = h & t->mask;
    for (;;) {
        Slot *s = &t->slots[j];
        if (!s->p) break;
        if (s->hash == h && s->len == n && memcmp(s->p, p, (size_t)n) == 0) return s->id;
        j = (j + 1) & t->mask;
    }
    if (copy) {
        if (t->n_owned == t->owned_cap) {
            size_t cap = t->owned_cap ? 2 * t->owned_cap : 64;
            char **owned = realloc(t->owned, cap * sizeof(char *));
            if (!owned) return -1;
            t->owned = owned;
            t->owned_cap = cap;
        }
        char *c = malloc((size_t)n + 1);
        if (!c) return -1;
        memcpy(c, p, (size_t)n);
        t->owned[t->n_owned++] = c;
        p = c;
    }
    Slot *s = &t->slots[j];
    s->hash = h;
    s->p = p;
    s->len = n;
    s->id = (int32_t)t->used;
    t->order_p[t->used] = p;
    t->order_len[t->used] = n;
    t->used++;
    if (t->used * 2 > t->mask && table_grow(t) != OK) return -1;
    return s->id;
}

/* --- columns --- */

typedef struct {
    int32_t *cat, *ph, *name, *pid_s, *tid_s;
    double *ts, *dur;
    int64_t *pid, *tid, *corr, *device, *stream, *nbytes, *args_lo, *args_hi;
    size_t n, cap;
} Cols;

#define INT32_COLS(X) X(cat) X(ph) X(name) X(pid_s) X(tid_s)
#define F64_COLS(X) X(ts) X(dur)
#define INT64_COLS(X) X(pid) X(tid) X(corr) X(device) X(stream) X(nbytes) X(args_lo) X(args_hi)

static void cols_free(Cols *c) {
#define FREE(f) free(c->f);
    INT32_COLS(FREE) F64_COLS(FREE) INT64_COLS(FREE)
#undef FREE
}

static int cols_grow(Cols *c, size_t text_len) {
    size_t cap = c->cap ? c->cap * 2 : text_len / 160 + 64; /* Kineto events take some 200 to 400 bytes */
    int ok = 1;
#define GROW(f)                                           \
    {                                                     \
        void *q = realloc(c->f, cap * sizeof *c->f);      \
        if (q) c->f = q; else ok = 0;                     \
    }
    INT32_COLS(GROW) F64_COLS(GROW) INT64_COLS(GROW)
#undef GROW
    if (!ok) return NOMEM;
    c->cap = cap;
    return OK;
}

/* --- JSON --- */

typedef struct {
    Ptr base, end; /* the text, and its end (a NUL there) */
    Table strings;
    Cols cols;
    char *scratch; /* a string's bytes with its escapes undone */
    size_t scratch_cap;
    int32_t empty; /* the id of "", every missing string's value */
} Scan;

static inline Ptr ws(Ptr p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

static int hex4(Ptr p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return FALLBACK;
        v = v * 16 + d;
    }
    *out = v;
    return OK;
}

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Past the bytes from q that need no attention in a string: all but '"', '\\' and control characters (the
 * text's closing NUL among them). Sixteen at a time where the text has sixteen left. */
static inline Ptr plain_run(Ptr q, Ptr lim) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
    while (q + 16 <= lim) {
        __m128i v = _mm_loadu_si128((const __m128i *)q);
        __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
        hit = _mm_or_si128(hit, _mm_cmpeq_epi8(_mm_max_epu8(v, control), control)); /* v <= 0x1F */
        int mask = _mm_movemask_epi8(hit);
        if (mask) return q + __builtin_ctz((unsigned)mask);
        q += 16;
    }
#else
    (void)lim;
#endif
    while (*q != '"' && *q != '\\' && *q >= 0x20) q++;
    return q;
}

/* A string at p (its opening quote). Sets *end past the closing quote, *lo and *n to its raw bytes, *escaped. */
static int string_span(Ptr p, Ptr lim, Ptr *end, Ptr *lo, Py_ssize_t *n, int *escaped) {
    Ptr q = ++p;
    *escaped = 0;
    for (;;) {
        q = plain_run(q, lim);
        unsigned char c = *q;
        if (c == '"') break;
        if (c < 0x20) return FALLBACK; /* a control character, or the end of the text */
        if (c == '\\') {
            *escaped = 1;
            unsigned char e = q[1];
            if (e == 'u') {
                unsigned v;
                if (hex4(q + 2, &v) != OK) return FALLBACK;
                if (v >= 0xD800 && v <= 0xDFFF) { /* only a high surrogate followed by a low one */
                    unsigned w;
                    if (v > 0xDBFF || q[6] != '\\' || q[7] != 'u' || hex4(q + 8, &w) != OK || w < 0xDC00 || w > 0xDFFF)
                        return FALLBACK;
                    q += 12;
                } else {
                    q += 6;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return FALLBACK;
            q += 2;
            continue;
        }
        q++;
    }
    *lo = p;
    *n = q - p;
    *end = q + 1;
    return OK;
}

static int put_utf8(char *o, unsigned v) {
    if (v < 0x80) { o[0] = (char)v; return 1; }
    if (v < 0x800) { o[0] = (char)(0xC0 | v >> 6); o[1] = (char)(0x80 | (v & 0x3F)); return 2; }
    if (v < 0x10000) {
        o[0] = (char)(0xE0 | v >> 12); o[1] = (char)(0x80 | (v >> 6 & 0x3F)); o[2] = (char)(0x80 | (v & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | v >> 18); o[1] = (char)(0x80 | (v >> 12 & 0x3F));
    o[2] = (char)(0x80 | (v >> 6 & 0x3F)); o[3] = (char)(0x80 | (v & 0x3F));
    return 4;
}

/* The id of the string at p (validated by string_span); its escapes undone first. */
static int string_id(Scan *s, Ptr *pp, int32_t *id) {
    Ptr lim = s->end;
    Ptr lo, end;
    Py_ssize_t n;
    int escaped;
    if (**pp != '"' || string_span(*pp, lim, &end, &lo, &n, &escaped) != OK) return FALLBACK;
    *pp = end;
    if (!escaped) {
        *id = intern(&s->strings, (const char *)lo, n, 0);
        return *id < 0 ? NOMEM : OK;
    }
    if ((size_t)n > s->scratch_cap) { /* undoing escapes never lengthens a string */
        char *b = realloc(s->scratch, (size_t)n);
        if (!b) return NOMEM;
        s->scratch = b;
        s->scratch_cap = (size_t)n;
    }
    char *o = s->scratch;
    for (Ptr q = lo; q < lo + n;) {
        if (*q != '\\') { *o++ = (char)*q++; continue; }
        unsigned char e = q[1];
        if (e == 'u') {
            unsigned v, w;
            hex4(q + 2, &v);
            q += 6;
            if (v >= 0xD800 && v <= 0xDBFF) {
                hex4(q + 2, &w);
                v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
                q += 6;
            }
            o += put_utf8(o, v);
            continue;
        }
        *o++ = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : (char)e;
        q += 2;
    }
    *id = intern(&s->strings, s->scratch, o - s->scratch, 1);
    return *id < 0 ? NOMEM : OK;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#ifdef __SIZEOF_INT128__
typedef unsigned __int128 U128;

static int bits128(U128 x) {
    uint64_t hi = (uint64_t)(x >> 64), lo = (uint64_t)x;
    return hi ? 128 - __builtin_clzll(hi) : lo ? 64 - __builtin_clzll(lo) : 0;
}

/* The double nearest (q + a fraction) * 2^e2, ties to even; q has at least 54 bits, `sticky`: the fraction is
 * not zero. */
static double rounded(U128 q, int sticky, int e2) {
    int shift = bits128(q) - 53;
    U128 mant = q >> shift, rest = q & (((U128)1 << shift) - 1), half = (U128)1 << (shift - 1);
    if (rest > half || (rest == half && (sticky || (mant & 1)))) mant++;
    if (mant >> 53) {
        mant >>= 1;
        shift++;
    }
    return ldexp((double)(uint64_t)mant, shift + e2);
}

/* m * 10^exp10, correctly rounded, for m < 2^64 and |exp10| <= 22 (-1: not here). Exact integer arithmetic on
 * 128 bits: the product itself, or the quotient of m shifted left by 10^-exp10, with its remainder. */
static double scaled(uint64_t m, int exp10) {
    if (m == 0) return 0.0;
    if (exp10 >= 19) return -1; /* 10^19 and up do not fit the 64-bit factor */
    if (exp10 >= 0) {
        U128 n = (U128)m * (uint64_t)POW10[exp10]; /* 10^18 and below are exact doubles */
        return bits128(n) <= 53 ? (double)(uint64_t)n : rounded(n, 0, 0);
    }
    U128 d = 1;
    for (int i = 0; i < -exp10; i++) d *= 10;
    int s = 127 - bits128(m);
    U128 n = (U128)m << s, q = n / d, r = n % d;
    while (bits128(q) < 54) { /* one more bit of the quotient */
        q = 2 * q + (2 * r >= d);
        r = 2 * r >= d ? 2 * r - d : 2 * r;
        s++;
    }
    return rounded(q, r != 0, -s);
}
#endif

/* A number at *pp in JSON's grammar. *is_int: no fraction or exponent, and then *ival holds it (FALLBACK if it
 * does not fit int64); *dval: its value as the nearest double, ties to even, as the decoder reads it (FALLBACK
 * where that cannot be had exactly: more than 19 significant digits, or a power of ten past 22). */
static int number(Ptr *pp, int *is_int, int64_t *ival, double *dval) {
    Ptr p = *pp;
    int neg = *p == '-';
    if (neg) p++;
    uint64_t m = 0; /* the significant digits, at most 19 */
    int digits = 0, exp10 = 0, exact = 1;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        for (; *p >= '0' && *p <= '9'; p++) {
            if (digits < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                exp10++; /* a digit past the 19th: its place counts, its value is lost unless zero */
                exact &= *p == '0';
            }
        }
    } else {
        return FALLBACK;
    }
    int frac = 0, has_exp = 0;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return FALLBACK;
        int zeros = 0; /* held back: trailing zeros ("8e15" written "8000000000000000.0") add no digit */
        for (; *p >= '0' && *p <= '9'; p++) {
            if (*p == '0') {
                zeros++;
                continue;
            }
            for (; zeros >= 0 && (digits < 19 || m == 0); zeros--) { /* leading zeros take no place in m */
                m = m * 10 + (zeros ? 0 : (uint64_t)(*p - '0'));
                digits += m != 0;
                exp10--;
            }
            exact &= zeros < 0;
            zeros = 0;
        }
        frac = 1;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        int eneg = 0;
        if (*p == '+' || *p == '-') eneg = *p++ == '-';
        if (!(*p >= '0' && *p <= '9')) return FALLBACK;
        int e = 0;
        for (; *p >= '0' && *p <= '9'; p++)
            if (e < 100000) e = e * 10 + (*p - '0');
        exp10 += eneg ? -e : e;
        has_exp = 1;
    }
    *pp = p;
    *is_int = !frac && !has_exp;
    if (*is_int) {
        if (!exact || exp10 != 0 || m > (uint64_t)INT64_MAX) return FALLBACK; /* past int64: the decoder judges */
        *ival = neg ? -(int64_t)m : (int64_t)m;
        *dval = (double)*ival; /* "-0" is the integer 0, as the decoder reads it */
        return OK;
    }
    if (!exact || exp10 < -22 || exp10 > 22) return FALLBACK;
    double d;
    if (m <= (1ULL << 53)) { /* both operands exact: one correctly rounded operation */
        d = exp10 < 0 ? (double)m / POW10[-exp10] : (double)m * POW10[exp10];
    } else {
#ifdef __SIZEOF_INT128__
        d = scaled(m, exp10);
        if (d < 0) return FALLBACK;
#else
        return FALLBACK;
#endif
    }
    *dval = neg ? -d : d;
    return OK;
}

/* A number in JSON's grammar, whatever its size, not read. */
static int skip_number(Ptr *pp) {
    Ptr q = *pp;
    if (*q == '-') q++;
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9') while (*q >= '0' && *q <= '9') q++;
    else return FALLBACK;
    if (*q == '.') {
        q++;
        if (!(*q >= '0' && *q <= '9')) return FALLBACK;
        while (*q >= '0' && *q <= '9') q++;
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!(*q >= '0' && *q <= '9')) return FALLBACK;
        while (*q >= '0' && *q <= '9') q++;
    }
    *pp = q;
    return OK;
}

static int skip_value(Ptr *pp, Ptr lim, int depth);

static int skip_container(Ptr *pp, Ptr lim, int depth, unsigned char close) {
    if (depth >= MAX_DEPTH) return FALLBACK;
    Ptr p = ws(*pp + 1);
    if (*p == close) { *pp = p + 1; return OK; }
    for (;;) {
        if (close == '}') {
            Ptr lo, end;
            Py_ssize_t n;
            int esc;
            if (*p != '"' || string_span(p, lim, &end, &lo, &n, &esc) != OK) return FALLBACK;
            p = ws(end);
            if (*p != ':') return FALLBACK;
            p = ws(p + 1);
        }
        if (skip_value(&p, lim, depth + 1) != OK) return FALLBACK;
        p = ws(p);
        if (*p == ',') { p = ws(p + 1); continue; }
        if (*p != close) return FALLBACK;
        *pp = p + 1;
        return OK;
    }
}

static int skip_value(Ptr *pp, Ptr lim, int depth) {
    Ptr p = *pp;
    switch (*p) {
    case '"': {
        Ptr lo, end;
        Py_ssize_t n;
        int esc;
        if (string_span(p, lim, &end, &lo, &n, &esc) != OK) return FALLBACK;
        *pp = end;
        return OK;
    }
    case '{': return skip_container(pp, lim, depth, '}');
    case '[': return skip_container(pp, lim, depth, ']');
    case 't': if (strncmp((const char *)p, "true", 4)) return FALLBACK; *pp = p + 4; return OK;
    case 'f': if (strncmp((const char *)p, "false", 5)) return FALLBACK; *pp = p + 5; return OK;
    case 'n': if (strncmp((const char *)p, "null", 4)) return FALLBACK; *pp = p + 4; return OK;
    default: return skip_number(pp);
    }
}

#define KEY(lit) (n == sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)

/* An integer field: an integer within int64 (anything else is the general decoder's to judge). */
static int int_field(Ptr *pp, int64_t *out) {
    int is_int;
    double d;
    if (number(pp, &is_int, out, &d) != OK || !is_int) return FALLBACK;
    return OK;
}

static int str_field(Ptr *pp, Ptr lim) {
    Ptr lo, end;
    Py_ssize_t n;
    int esc;
    if (**pp != '"' || string_span(*pp, lim, &end, &lo, &n, &esc) != OK) return FALLBACK;
    for (Ptr q = lo; q < lo + n; q++)
        if (*q >= 0x80) return FALLBACK; /* the decoder checks its UTF-8; leave that to it */
    *pp = end;
    return OK;
}

static int args(Scan *s, Ptr *pp, size_t row) {
    Cols *c = &s->cols;
    Ptr lim = s->end;
    Ptr p = ws(*pp + 1);
    unsigned seen = 0;
    if (*p == '}') { *pp = p + 1; return OK; }
    for (;;) {
        Ptr lo, end;
        Py_ssize_t n;
        int esc;
        if (*p != '"' || string_span(p, lim, &end, &lo, &n, &esc) != OK || esc) return FALLBACK;
        const char *k = (const char *)lo;
        p = ws(end);
        if (*p != ':') return FALLBACK;
        p = ws(p + 1);
        unsigned bit = 0;
        int rc;
        if (KEY("correlation")) bit = 1, rc = int_field(&p, &c->corr[row]);
        else if (KEY("device")) bit = 2, rc = int_field(&p, &c->device[row]);
        else if (KEY("stream")) /* a string stream (ROCm's "0x0") reads as none: the tid names it */
            bit = 4, rc = *p == '"' ? str_field(&p, lim) : int_field(&p, &c->stream[row]);
        else if (KEY("bytes")) bit = 8, rc = int_field(&p, &c->nbytes[row]);
        else if (KEY("Collective name")) bit = 16, rc = str_field(&p, lim);
        else if (KEY("Process Group Name")) bit = 32, rc = str_field(&p, lim);
        else if (KEY("dtype")) bit = 64, rc = str_field(&p, lim);
        else if (KEY("In msg nelems") || KEY("Out msg nelems") || KEY("Group size")) {
            int64_t ignored;
            bit = KEY("In msg nelems") ? 128 : KEY("Out msg nelems") ? 256 : 512;
            rc = int_field(&p, &ignored);
        } else if (KEY("Input Dims") || KEY("Input type")) {
            bit = KEY("Input Dims") ? 1024 : 2048;
            rc = skip_value(&p, lim, 2);
        } else {
            rc = skip_value(&p, lim, 2);
        }
        if (rc != OK || (seen & bit)) return FALLBACK;
        seen |= bit;
        p = ws(p);
        if (*p == ',') { p = ws(p + 1); continue; }
        if (*p != '}') return FALLBACK;
        *pp = p + 1;
        return OK;
    }
}

static int event(Scan *s, Ptr *pp) {
    Cols *c = &s->cols;
    Ptr lim = s->end;
    if (c->n == c->cap && cols_grow(c, (size_t)(s->end - s->base)) != OK) return NOMEM;
    size_t row = c->n;
    c->cat[row] = c->ph[row] = c->name[row] = s->empty;
    c->pid_s[row] = c->tid_s[row] = -1;
    c->ts[row] = c->dur[row] = NAN;
    c->pid[row] = c->tid[row] = 0;
    c->corr[row] = c->device[row] = c->stream[row] = c->nbytes[row] = -1;
    c->args_lo[row] = c->args_hi[row] = -1;
    Ptr p = ws(*pp + 1);
    unsigned seen = 0;
    if (*p == '}') goto done;
    for (;;) {
        Ptr lo, end;
        Py_ssize_t n;
        int esc, rc = OK, is_int;
        unsigned bit = 0;
        if (*p != '"' || string_span(p, lim, &end, &lo, &n, &esc) != OK || esc) return FALLBACK;
        const char *k = (const char *)lo;
        p = ws(end);
        if (*p != ':') return FALLBACK;
        p = ws(p + 1);
        if (KEY("ph") || KEY("cat") || KEY("name")) {
            int32_t *col = k[0] == 'p' ? c->ph : k[0] == 'c' ? c->cat : c->name;
            bit = k[0] == 'p' ? 1 : k[0] == 'c' ? 2 : 4;
            rc = string_id(s, &p, &col[row]);
        } else if (KEY("ts") || KEY("dur")) {
            int64_t i;
            bit = k[0] == 't' ? 8 : 16;
            rc = (*p == '-' || (*p >= '0' && *p <= '9')) ? number(&p, &is_int, &i, k[0] == 't' ? &c->ts[row] : &c->dur[row])
                                                         : FALLBACK;
        } else if (KEY("pid") || KEY("tid")) {
            int pid = k[0] == 'p';
            bit = pid ? 32 : 64;
            if (*p == '"') {
                rc = string_id(s, &p, pid ? &c->pid_s[row] : &c->tid_s[row]);
            } else {
                rc = int_field(&p, pid ? &c->pid[row] : &c->tid[row]);
            }
        } else if (KEY("args")) {
            bit = 128;
            if (strncmp((const char *)p, "null", 4) == 0) {
                p += 4;
            } else if (*p == '{') {
                c->args_lo[row] = p - s->base;
                rc = args(s, &p, row);
                c->args_hi[row] = p - s->base;
            } else {
                rc = FALLBACK;
            }
        } else {
            rc = skip_value(&p, lim, 1);
        }
        if (rc != OK) return rc;
        if (seen & bit) return FALLBACK;
        seen |= bit;
        p = ws(p);
        if (*p == ',') { p = ws(p + 1); continue; }
        if (*p != '}') return FALLBACK;
        break;
    }
done:
    *pp = p + 1;
    c->n++;
    return OK;
}

static int scan_array(Scan *s, Ptr p, Ptr end) {
    p = ws(p);
    if (*p != '[') return FALLBACK;
    p = ws(p + 1);
    if (*p == ']') return ws(p + 1) == end ? OK : FALLBACK;
    for (;;) {
        if (*p != '{') return FALLBACK;
        int rc = event(s, &p);
        if (rc != OK) return rc;
        p = ws(p);
        if (*p == ',') { p = ws(p + 1); continue; }
        if (*p != ']') return FALLBACK;
        return ws(p + 1) == end ? OK : FALLBACK;
    }
}

/* A column's values, handed to numpy without a copy: the scanner's own memory, exposed as a writable buffer
 * (np.frombuffer keeps the object alive) and freed with it. */
typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t len;
} Column;

static void column_dealloc(PyObject *self) {
    free(((Column *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static int column_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Column *c = (Column *)self;
    static char empty[1];
    return PyBuffer_FillInfo(view, self, c->data ? c->data : empty, c->len, 0, flags);
}

static PyBufferProcs column_buffer = {column_getbuffer, NULL};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpuidle.sources._kscan.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = column_dealloc,
    .tp_as_buffer = &column_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One column of a scanned chunk: raw values for np.frombuffer.",
};

/* The column *data (n values of size bytes) as a Column, which takes the memory (*data is then NULL). */
static PyObject *column(void **data, size_t n, size_t size) {
    Column *c = PyObject_New(Column, &ColumnType);
    if (!c) return NULL;
    void *fitted = n ? realloc(*data, n * size) : NULL; /* give back the unused capacity */
    if (n && !fitted) fitted = *data;
    if (!n) free(*data);
    c->data = fitted;
    c->len = (Py_ssize_t)(n * size);
    *data = NULL;
    return (PyObject *)c;
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    /* the scanner reads one byte past a token to end it: a NUL-terminated copy unless the object is bytes */
    char *copy = NULL;
    Ptr base = view.buf;
    if (!PyBytes_Check(arg)) {
        copy = malloc((size_t)view.len + 1);
        if (!copy) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
        memcpy(copy, view.buf, (size_t)view.len);
        copy[view.len] = 0;
        base = (Ptr)copy;
    }
    Scan s;
    memset(&s, 0, sizeof s);
    s.base = base;
    s.end = base + view.len;
    int rc = table_init(&s.strings);
    if (rc == OK && (s.empty = intern(&s.strings, "", 0, 0)) < 0) rc = NOMEM;
    if (rc == OK) {
        Py_BEGIN_ALLOW_THREADS
        rc = scan_array(&s, base, base + view.len);
        Py_END_ALLOW_THREADS
    }
    PyObject *out = NULL;
    if (rc == NOMEM) {
        PyErr_NoMemory();
    } else if (rc == FALLBACK) {
        out = Py_NewRef(Py_None);
    } else {
        PyObject *strings = PyList_New((Py_ssize_t)s.strings.used);
        int bad = strings == NULL;
        for (size_t i = 0; !bad && i < s.strings.used; i++) {
            PyObject *u = PyUnicode_DecodeUTF8(s.strings.order_p[i], s.strings.order_len[i], "strict");
            if (!u) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) { bad = 2; break; }
                PyErr_Clear(); /* not UTF-8: the general decoder words the error */
                bad = 1;
                break;
            }
            PyList_SET_ITEM(strings, (Py_ssize_t)i, u);
        }
        if (bad == 1) {
            Py_XDECREF(strings);
            out = Py_NewRef(Py_None);
        } else if (!bad) {
            Cols *c = &s.cols;
            out = Py_BuildValue("(nN" "NNNNN" "NN" "NNNNNNNN)", (Py_ssize_t)c->n, strings,
#define COL32(f) column((void **)&c->f, c->n, 4),
#define COL64(f) column((void **)&c->f, c->n, 8),
                                INT32_COLS(COL32) F64_COLS(COL64) INT64_COLS(COL64) NULL);
#undef COL32
#undef COL64
        } else {
            Py_XDECREF(strings);
        }
    }
    table_free(&s.strings);
    cols_free(&s.cols);
    free(s.scratch);
    free(copy);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(text) -> (n, strings, cat, ph, name, pid_s, tid_s, ts, dur, pid, tid, corr, device, stream, bytes, "
     "args_lo, args_hi) or None\n\nA chunk of Kineto events as columns (buffers of int32, float64 or int64); None "
     "when the chunk needs the general decoder."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kscan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kscan(void) {
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    return PyModule_Create(&module);
}
