/* JSON tokens, read in place: whitespace, strings, numbers, and values skipped with their syntax checked.
 *
 * Each returns OK, or FALLBACK where the text is not JSON or holds what the typed decoder would judge differently
 * (the caller then leaves the chunk to it). The text ends with a NUL, which no token accepts.
 */
#ifndef GPUIDLE_KSCAN_JSON_H
#define GPUIDLE_KSCAN_JSON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "status.h"

typedef const unsigned char *Ptr;

#define MAX_DEPTH 64

static inline Ptr ws(Ptr p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
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

int hex4(Ptr p, unsigned *out);
/* A string at p (its opening quote). Sets *end past the closing quote, *lo and *n to its raw bytes, *escaped. */
int string_span(Ptr p, Ptr lim, Ptr *end, Ptr *lo, Py_ssize_t *n, int *escaped);
/* Code point v as UTF-8 at o; the bytes written. */
int put_utf8(char *o, unsigned v);
/* A number at *pp: *is_int with *ival, and its nearest double *dval (see json.c). */
int number(Ptr *pp, int *is_int, int64_t *ival, double *dval);
/* Any value at *pp, its syntax checked, nesting below MAX_DEPTH. */
int skip_value(Ptr *pp, Ptr lim, int depth);
/* An integer within int64. */
int int_field(Ptr *pp, int64_t *out);
/* An integer argument: an integer within int64, or a string of one (ROCm writes "bytes":"616"), read as the
 * decoder coerces it: an optional '-' and decimal digits, nothing else, within int64. */
int int_arg(Ptr *pp, int64_t *out);
/* A string of ASCII (the decoder checks other strings' UTF-8: left to it). */
int str_field(Ptr *pp, Ptr lim);

#endif
