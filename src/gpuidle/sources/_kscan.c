/* Kineto event chunks straight to columns, with no Python object per event.
 *
 * scan(b"[{...}, {...}]") reads the fields the model uses into typed arrays and interns the strings (category,
 * phase, name, string pids and tids) in the order they first appear. It reads a strict subset of what the typed
 * decoder (msgspec, kineto_events.Event) accepts, and the integer arguments written as strings of digits that its
 * per-event coercion reads (ROCm's "bytes":"616"): anything else -- bad syntax, a type the decoder would refuse or
 * coerce, a duplicated field, an integer past int64, deep nesting -- returns None, and the caller decodes the
 * chunk the general way, which gives that chunk's values or its error. The scan itself runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kscan/json.h"
#include "kscan/table.h"

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

/* --- a chunk --- */

typedef struct {
    Ptr base, end; /* the text, and its end (a NUL there) */
    Table strings;
    Cols cols;
    char *scratch; /* a string's bytes with its escapes undone */
    size_t scratch_cap;
    int32_t empty; /* the id of "", every missing string's value */
} Scan;

/* The id of the string at p (validated by string_span); its escapes undone first. */
static int string_id(Scan *s, Ptr *pp, int32_t *id) {
    Ptr lim = s->end;
    Ptr lo, end;
    Py_ssize_t n;
    int escaped;
    if (**pp != '"' || string_span(*pp, lim, &end, &lo, &n, &escaped) != OK) return FALLBACK;
    *pp = end;
    if (!escaped) return intern(&s->strings, (const char *)lo, n, 0, id);
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
    return intern(&s->strings, s->scratch, o - s->scratch, 1, id);
}

#define KEY(lit) (n == sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)

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
        if (KEY("correlation")) bit = 1, rc = int_arg(&p, &c->corr[row]);
        else if (KEY("device")) bit = 2, rc = int_arg(&p, &c->device[row]);
        else if (KEY("stream")) /* a string stream (ROCm's "0x0") reads as none: the tid names it */
            bit = 4, rc = *p == '"' ? str_field(&p, lim) : int_field(&p, &c->stream[row]);
        else if (KEY("bytes")) bit = 8, rc = int_arg(&p, &c->nbytes[row]);
        else if (KEY("Collective name")) bit = 16, rc = str_field(&p, lim);
        else if (KEY("Process Group Name")) bit = 32, rc = str_field(&p, lim);
        else if (KEY("dtype")) bit = 64, rc = str_field(&p, lim);
        else if (KEY("In msg nelems") || KEY("Out msg nelems") || KEY("Group size")) {
            int64_t ignored;
            bit = KEY("In msg nelems") ? 128 : KEY("Out msg nelems") ? 256 : 512;
            rc = int_arg(&p, &ignored);
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
    /* the scanner reads one byte past a token to end it: a NUL-terminated copy unless the object is bytes itself
     * (a subclass may export another buffer, without that NUL) */
    char *copy = NULL;
    Ptr base = view.buf;
    if (!PyBytes_CheckExact(arg)) {
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
    if (rc == OK) rc = intern(&s.strings, "", 0, 0, &s.empty);
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
        int bad = strings == NULL ? 2 : 0; /* 2: an error set (MemoryError); 1: the decoder's to word */
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

static PyObject *string_hash(PyObject *self, PyObject *arg) {
    (void)self;
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &p, &n) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(hash_bytes(p, n));
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(text) -> (n, strings, cat, ph, name, pid_s, tid_s, ts, dur, pid, tid, corr, device, stream, bytes, "
     "args_lo, args_hi) or None\n\nA chunk of Kineto events as columns (buffers of int32, float64 or int64); None "
     "when the chunk needs the general decoder."},
    {"string_hash", string_hash, METH_O,
     "string_hash(b) -> int\n\nThe keyed hash the scanner interns strings by (this process's key)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kscan", NULL, -1, methods, NULL, NULL, NULL, NULL};

/* The hash key from os.urandom, once a process: names cannot be built to collide without it. */
static int seed_key(void) {
    PyObject *os = PyImport_ImportModule("os");
    PyObject *key = os ? PyObject_CallMethod(os, "urandom", "i", KEY_BYTES) : NULL;
    Py_XDECREF(os);
    if (!key) return -1;
    int ok = PyBytes_Check(key) && PyBytes_GET_SIZE(key) == KEY_BYTES;
    if (ok) table_key((const unsigned char *)PyBytes_AS_STRING(key));
    Py_DECREF(key);
    if (!ok) PyErr_SetString(PyExc_RuntimeError, "os.urandom gave too few bytes");
    return ok ? 0 : -1;
}

PyMODINIT_FUNC PyInit__kscan(void) {
    if (PyType_Ready(&ColumnType) < 0 || seed_key() < 0) return NULL;
    return PyModule_Create(&module);
}
