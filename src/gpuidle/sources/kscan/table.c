/* Interned strings (see table.h). */
#include "table.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

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

int32_t intern(Table *t, const char *p, Py_ssize_t n, int copy) {
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
