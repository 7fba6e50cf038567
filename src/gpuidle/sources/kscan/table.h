/* Interned strings: open addressing over (bytes, length), ids in order of first appearance. */
#ifndef GPUIDLE_KSCAN_TABLE_H
#define GPUIDLE_KSCAN_TABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

int table_init(Table *t);
void table_free(Table *t);
/* The id of p[:n]; `copy`: p is scratch memory, keep a copy if the string is new. -1 when out of memory. */
int32_t intern(Table *t, const char *p, Py_ssize_t n, int copy);

#endif
