/* JSON tokens (see json.h). */
#include "json.h"

#include <math.h>
#include <string.h>

int hex4(Ptr p, unsigned *out) {
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

int string_span(Ptr p, Ptr lim, Ptr *end, Ptr *lo, Py_ssize_t *n, int *escaped) {
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

int put_utf8(char *o, unsigned v) {
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

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#ifdef __SIZEOF_INT128__
__extension__ typedef unsigned __int128 U128; /* GCC and Clang */

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
int number(Ptr *pp, int *is_int, int64_t *ival, double *dval) {
    Ptr p = *pp;
    int neg = *p == '-';
    if (neg) p++;
    uint64_t m = 0; /* the significant digits, at most 19 */
    int digits = 0, exact = 1;
    int64_t exp10 = 0; /* counts digits: a text of 2^31 of them must not wrap it */
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
        int64_t zeros = 0; /* held back: trailing zeros ("8e15" written "8000000000000000.0") add no digit */
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
        int64_t e = 0;
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
        d = scaled(m, (int)exp10);
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

int skip_value(Ptr *pp, Ptr lim, int depth) {
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

/* An integer field: an integer within int64 (anything else is the general decoder's to judge). */
int int_field(Ptr *pp, int64_t *out) {
    int is_int;
    double d;
    if (number(pp, &is_int, out, &d) != OK || !is_int) return FALLBACK;
    return OK;
}

int int_arg(Ptr *pp, int64_t *out) {
    Ptr p = *pp;
    if (*p != '"') return int_field(pp, out);
    p++;
    int neg = *p == '-';
    if (neg) p++;
    if (!(*p >= '0' && *p <= '9')) return FALLBACK;
    int64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        int d = *p - '0';
        if (v > (INT64_MAX - d) / 10) return FALLBACK; /* past int64 (its least value too): the decoder's */
        v = v * 10 + d;
    }
    if (*p != '"') return FALLBACK; /* a sign, a space, a base, an escape: the decoder coerces those */
    *out = neg ? -v : v;
    *pp = p + 1;
    return OK;
}

int str_field(Ptr *pp, Ptr lim) {
    Ptr lo, end;
    Py_ssize_t n;
    int esc;
    if (**pp != '"' || string_span(*pp, lim, &end, &lo, &n, &esc) != OK) return FALLBACK;
    for (Ptr q = lo; q < lo + n; q++)
        if (*q >= 0x80) return FALLBACK; /* the decoder checks its UTF-8; leave that to it */
    *pp = end;
    return OK;
}
