/* Interned strings (see table.h). */
#include "table.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

/* The key, set once a process from os.urandom: names cannot be built to collide without it. The default is only
 * for a table used before the module's start (none is). `mul` and `last` are odd: a product with them loses no
 * low bit, and no factor is forced to zero. */
static uint64_t start = 0x243F6A8885A308D3ULL, mul = 0x13198A2E03707345ULL, last = 0xA4093822299F31D1ULL;

void table_key(const unsigned char key[KEY_BYTES]) {
    memcpy(&start, key, 8);
    memcpy(&mul, key + 8, 8);
    memcpy(&last, key + 16, 8);
    mul |= 1;
    last |= 1;
}

#ifdef __SIZEOF_INT128__
/* The 128-bit product folded to 64 bits: neither factor can be recovered from it (wyhash's mixing step). */
static inline uint64_t fold(uint64_t a, uint64_t b) {
    __extension__ unsigned __int128 r = (unsigned __int128)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}
#else
static inline uint64_t fold(uint64_t a, uint64_t b) {
    uint64_t lo = a * b, hi = (a >> 32) * (b >> 32); /* the high product's upper half, roughly */
    return lo ^ hi ^ (lo >> 29);
}
#endif

/* Eight bytes at a time, each word folded into the state with the keyed multiplier; the last word padded with
 * zeros; the length folded in on its own at the end, so that no string and a shorter one padded with NULs can
 * share a state that only the length tells apart (it once shared the first word's: "" and "\x01" hashed alike). */
uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = start, len = (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = fold(h ^ w, mul);
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = fold(h ^ w, mul);
    return fold(h ^ len, last);
}

int table_init(Table *t) {
    memset(t, 0, sizeof *t);
    t->mask = 1023;
    t->slots = calloc(t->mask + 1, sizeof(Slot));
    t->order_p = malloc((t->mask + 1) / 2 * sizeof(char *));
    t->order_len = malloc((t->mask + 1) / 2 * sizeof(Py_ssize_t));
    return t->slots && t->order_p && t->order_len ? OK : NOMEM;
}

void table_free(Table *t) {
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

int intern(Table *t, const char *p, Py_ssize_t n, int copy, int32_t *id) {
    uint64_t h = hash_bytes(p, n);
    size_t j = h & t->mask;
    for (int probes = 0;; probes++) {
        Slot *s = &t->slots[j];
        if (!s->p) break;
        if (s->hash == h && s->len == n && memcmp(s->p, p, (size_t)n) == 0) {
            *id = s->id;
            return OK;
        }
        if (probes == PROBE_LIMIT) return FALLBACK;
        j = (j + 1) & t->mask;
    }
    if (copy) {
        if (t->n_owned == t->owned_cap) {
            size_t cap = t->owned_cap ? 2 * t->owned_cap : 64;
            char **owned = realloc(t->owned, cap * sizeof(char *));
            if (!owned) return NOMEM;
            t->owned = owned;
            t->owned_cap = cap;
        }
        char *c = malloc((size_t)n + 1);
        if (!c) return NOMEM;
        memcpy(c, p, (size_t)n);
        t->owned[t->n_owned++] = c;
        p = c;
    }
    Slot *s = &t->slots[j];
    s->hash = h;
    s->p = p;
    s->len = n;
    s->id = (int32_t)t->used;
    *id = s->id; /* read before a grow frees the slots */
    t->order_p[t->used] = p;
    t->order_len[t->used] = n;
    t->used++;
    if (t->used * 2 > t->mask) return table_grow(t);
    return OK;
}
