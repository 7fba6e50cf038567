/* Interned strings: open addressing over (bytes, length), ids in order of first appearance. */
#ifndef GPUIDLE_KSCAN_TABLE_H
#define GPUIDLE_KSCAN_TABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The most slots one look-up may pass. A keyed hash keeps real probes short (at most half the slots are used,
 * so a run of PROBE_LIMIT is some 1e-9 per look-up); names built to collide end there, and the chunk goes to the
 * general decoder, whose cost is linear in its size. */
#define PROBE_LIMIT 256

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

#define KEY_BYTES 24
/* The process's hash key, once, before any table is used: KEY_BYTES random bytes. */
void table_key(const unsigned char key[KEY_BYTES]);
/* The keyed hash of p[:n] (exposed for tests). */
uint64_t hash_bytes(const char *p, Py_ssize_t n);
int table_init(Table *t);
void table_free(Table *t);
/* *id: the id of p[:n]; `copy`: p is scratch memory, keep a copy if the string is new. Returns OK, NOMEM, or
 * FALLBACK where the probe ran past PROBE_LIMIT slots. */
int intern(Table *t, const char *p, Py_ssize_t n, int copy, int32_t *id);

#endif
