/* A run of compressed node blocks spliced into a gzipped list, in one pass of C.

   kcms/apis/metrics/gzblocks.py holds the rules (GzipList.blocks) and the same loop in Python,
   which runs where this is not built. There, each block costs two crc32_combine calls, and each
   raises x to the block's length in bits again: ~0.4 us a call, 4.1 of a 5000-node list's ~15 ms
   in NodeBlocks.items. Here each block brings that power, made once when it was compressed
   (CompressedBlock.shift), and a combine is one product modulo the CRC-32 polynomial.

   splice(run, pieces, stamp, crc, stamps) -> (crc, stamps, length)
     run     CompressedBlock tuples: (lead, rest, crc, stamps, length, shift), in order;
     pieces  the list's pieces: each block's lead, then stamp, then its rest are appended;
     crc, stamps  the list's CRC-32 and stamp positions so far, as gzblocks keeps them;
     returns both with every block of the run combined in, and the run's length in bytes.

   acyclic(obj) -> obj
     obj, no longer tracked by the cyclic garbage collector (blocks.py's node blocks). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define POLY 0xEDB88320u /* CRC-32, bit-reflected: x^0 is the top bit */

/* crc * shift and stamps * shift modulo POLY, in one pass over shift's 32 bits (the two products
   share their multiplier). Without branches: shift's bits are as likely set as not. */
static void
times_shift(uint32_t shift, uint32_t *crc, uint32_t *stamps)
{
    uint32_t a = *crc, b = *stamps, pa = 0, pb = 0;
    for (int bit = 31; bit >= 0; bit--) {
        uint32_t take = 0u - ((shift >> bit) & 1u);
        pa ^= a & take;
        pb ^= b & take;
        a = (a >> 1) ^ (POLY & (0u - (a & 1u)));
        b = (b >> 1) ^ (POLY & (0u - (b & 1u)));
    }
    *crc = pa;
    *stamps = pb;
}

static int
as_u32(PyObject *v, uint32_t *out)
{
    unsigned long x;
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "a CRC must be an int");
        return 0;
    }
    x = PyLong_AsUnsignedLong(v);
    if (x == (unsigned long)-1 && PyErr_Occurred())
        return 0;
    if (x > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "a CRC must fit in 32 bits");
        return 0;
    }
    *out = (uint32_t)x;
    return 1;
}

PyDoc_STRVAR(splice_doc,
             "splice(run, pieces, stamp, crc, stamps) -> (crc, stamps, length)\n"
             "\nSee kcms/apis/metrics/gzblocks.py (GzipList.blocks): the same result as its Python loop.");

static PyObject *
splice(PyObject *self, PyObject *args)
{
    PyObject *run, *pieces, *stamp, *crc_in, *stamps_in;
    uint32_t crc, stamps;
    Py_ssize_t length = 0;
    if (!PyArg_ParseTuple(args, "O!O!O!OO:splice", &PyList_Type, &run, &PyList_Type, &pieces, &PyBytes_Type,
                          &stamp, &crc_in, &stamps_in))
        return NULL;
    if (!as_u32(crc_in, &crc) || !as_u32(stamps_in, &stamps))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(run);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *block = PyList_GET_ITEM(run, i);
        uint32_t block_crc, block_stamps, shift;
        if (!PyTuple_Check(block) || PyTuple_GET_SIZE(block) != 6) {
            PyErr_SetString(PyExc_TypeError, "a run holds CompressedBlock tuples of 6 fields");
            return NULL;
        }
        PyObject *lead = PyTuple_GET_ITEM(block, 0), *rest = PyTuple_GET_ITEM(block, 1);
        Py_ssize_t block_length = PyLong_AsSsize_t(PyTuple_GET_ITEM(block, 4));
        if (block_length == -1 && PyErr_Occurred())
            return NULL;
        if (!PyBytes_Check(lead) || !PyBytes_Check(rest) || block_length < 0) {
            PyErr_SetString(PyExc_TypeError, "a block's lead and rest are bytes, its length >= 0");
            return NULL;
        }
        if (!as_u32(PyTuple_GET_ITEM(block, 2), &block_crc) || !as_u32(PyTuple_GET_ITEM(block, 3), &block_stamps)
            || !as_u32(PyTuple_GET_ITEM(block, 5), &shift))
            return NULL;
        times_shift(shift, &crc, &stamps);
        crc ^= block_crc;
        stamps ^= block_stamps;
        length += block_length;
        if (PyList_Append(pieces, lead) < 0 || PyList_Append(pieces, stamp) < 0 || PyList_Append(pieces, rest) < 0)
            return NULL;
    }
    return Py_BuildValue("(kkn)", (unsigned long)crc, (unsigned long)stamps, length);
}

PyDoc_STRVAR(acyclic_doc,
             "acyclic(obj) -> obj\n"
             "\n``obj``, no longer tracked by the cyclic garbage collector. Only for an object that no reference\n"
             "cycle can pass through (nothing it refers to refers back to it), as a msgspec Struct with\n"
             "gc=False: the collector would find nothing to free there, and need not walk it.");

/* A node block and its two tuples live for a resolution, and rendering ahead makes thousands
   during a cycle: until the cycle's heap freeze, every young collection walked each block's ~60
   references (see blocks.py, _NodeBlock). */
static PyObject *
acyclic(PyObject *self, PyObject *obj)
{
    if (PyObject_GC_IsTracked(obj))
        PyObject_GC_UnTrack(obj);
    return Py_NewRef(obj);
}

static PyMethodDef methods[] = {
    {"splice", splice, METH_VARARGS, splice_doc},
    {"acyclic", acyclic, METH_O, acyclic_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kcms.apis.metrics._gzsplice",
    "A run of compressed node blocks spliced into a gzipped list; node blocks off the cyclic collector (see _gzsplice.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__gzsplice(void)
{
    return PyModule_Create(&module);
}
