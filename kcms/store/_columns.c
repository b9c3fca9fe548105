/* Two scrapes of a node compared a column at a time, in one pass of C.

   kcms/store/columns.py holds the rules and the same computation in Python (which runs where
   this is not built, and where this declines an input). Its ten passes of map() over a node's
   60 containers cost 16.4 us a scrape in a loop here, more in the process (a cold path every
   15 s), where this costs 1.6 us (the 60 rates made included).

   rates(new_times, old_times, new_cpu, old_cpu, max_nanocores):
     None   some reading is not newer, some counter went down, or some rate is over
            max_nanocores (delta > max_nanocores * span, compared exactly as Python compares an
            int with a float);
     False  an input this does not read (not a list of exact floats / ints, lengths that differ,
            none at all, a counter outside int64, a non-finite time): Python decides;
     (rates, within)  each series' CPU rate in nanocores, int(delta / span) with delta / span
            computed as Python's int / float (the int correctly rounded to a double), and
            whether every delta / span is at most max_nanocores (the history's own check).

   put_row(data, base, order, cpus, memory): one history row (kcms/store/history.py) written in
     place: int64 slot base + j of the bytearray ``data`` takes cpus[order[j]], slot base + n + j
     takes memory[order[j]] (n = len(order)). True when written; False, with nothing written, for
     an input this does not read (not a bytearray, a tuple of ints, lists of exact ints within
     int64; an index or the row outside them): Python writes it then. Putting the columns in row
     order with a getter, then making an array('q') of each, cost ~45 000 instructions a scrape of
     60 containers (array's per-item argument parsing alone ~30 000); this, ~8 000 (callgrind:
     bench/scrape_instructions.py, 37 000 fewer a scrape between the means of three runs each). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define TWO_63 9223372036854775808.0

static int
exact_floats(PyObject *list, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        if (!PyFloat_CheckExact(v) || !isfinite(PyFloat_AS_DOUBLE(v)))
            return 0;
    }
    return 1;
}

static int
as_int64(PyObject *v, long long *out)
{
    int overflow = 0;
    if (!PyLong_CheckExact(v))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(rates_doc,
             "rates(new_times, old_times, new_cpu, old_cpu, max_nanocores) -> (list[int], bool) | None | False\n"
             "\nSee kcms/store/columns.py: the same result, or False where Python must decide.");

static PyObject *
rates(PyObject *self, PyObject *args)
{
    PyObject *new_t, *old_t, *new_c, *old_c;
    long long most;
    if (!PyArg_ParseTuple(args, "O!O!O!O!L:rates", &PyList_Type, &new_t, &PyList_Type, &old_t, &PyList_Type,
                          &new_c, &PyList_Type, &old_c, &most))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(new_t);
    if (n == 0 || PyList_GET_SIZE(old_t) != n || PyList_GET_SIZE(new_c) != n || PyList_GET_SIZE(old_c) != n
        || most < 0 || most > (1LL << 53) || !exact_floats(new_t, n) || !exact_floats(old_t, n))
        Py_RETURN_FALSE;
    const double most_f = (double)most; /* exact: at most 2**53 */
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    int within = 1, refused = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long a, b;
        if (!as_int64(PyList_GET_ITEM(new_c, i), &a) || !as_int64(PyList_GET_ITEM(old_c, i), &b)
            || (b < 0 && a > LLONG_MAX + b) || (b > 0 && a < LLONG_MIN + b)) {
            Py_DECREF(out);
            Py_RETURN_FALSE; /* the difference leaves int64: Python's ints do not */
        }
        const long long delta = a - b;
        const double span = PyFloat_AS_DOUBLE(PyList_GET_ITEM(new_t, i)) - PyFloat_AS_DOUBLE(PyList_GET_ITEM(old_t, i));
        if (!(span > 0.0) || delta < 0) {
            refused = 1;
            break;
        }
        /* delta <= most * span, exactly: delta is an integer, so it is at most p when it is at
           most floor(p); floor(p) below 2**63 is an exact int64. */
        const double p = most_f * span;
        if (p < TWO_63 && delta > (long long)floor(p)) {
            refused = 1;
            break;
        }
        const double rate = (double)delta / span; /* int64 -> double rounds to nearest, as Python */
        if (rate > most_f)
            within = 0;
        /* delta <= most * span: rate is at most most (2**53) by a rounding, far below 2**63 */
        PyObject *r = PyLong_FromLongLong((long long)rate); /* truncated, as int() */
        if (r == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, r);
    }
    if (refused) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(NO)", out, within ? Py_True : Py_False);
}

PyDoc_STRVAR(put_row_doc,
             "put_row(data, base, order, cpus, memory) -> bool\n"
             "\nWrite one history row in place; False (nothing written) where Python must do it.");

static PyObject *
put_row(PyObject *self, PyObject *args)
{
    PyObject *data, *order, *cpus, *memory;
    Py_ssize_t base;
    if (!PyArg_ParseTuple(args, "OnOOO:put_row", &data, &base, &order, &cpus, &memory))
        return NULL;
    if (!PyByteArray_CheckExact(data) || !PyTuple_CheckExact(order) || !PyList_CheckExact(cpus)
        || !PyList_CheckExact(memory) || base < 0)
        Py_RETURN_FALSE;
    const Py_ssize_t n = PyTuple_GET_SIZE(order);
    const Py_ssize_t slots = PyByteArray_GET_SIZE(data) / (Py_ssize_t)sizeof(long long);
    if (n == 0 || base > slots || 2 * n > slots - base)
        Py_RETURN_FALSE;
    long long *row = PyMem_Malloc(2 * (size_t)n * sizeof(long long));
    if (row == NULL)
        return PyErr_NoMemory();
    const Py_ssize_t nc = PyList_GET_SIZE(cpus), nm = PyList_GET_SIZE(memory);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *at = PyTuple_GET_ITEM(order, j);
        long long i;
        if (!as_int64(at, &i) || i < 0 || i >= nc || i >= nm || !as_int64(PyList_GET_ITEM(cpus, i), &row[j])
            || !as_int64(PyList_GET_ITEM(memory, i), &row[n + j])) {
            PyMem_Free(row);
            Py_RETURN_FALSE;
        }
    }
    /* validated whole before any byte is written: a refusal leaves the row as it was */
    memcpy(PyByteArray_AS_STRING(data) + base * (Py_ssize_t)sizeof(long long), row, 2 * (size_t)n * sizeof(long long));
    PyMem_Free(row);
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"rates", rates, METH_VARARGS, rates_doc},
    {"put_row", put_row, METH_VARARGS, put_row_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kcms.store._columns",
    "Two scrapes of a node compared, and a history row written, a column at a time (see _columns.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__columns(void)
{
    return PyModule_Create(&module);
}
