/* A response body decrypted straight into the bytes object that is handed on (see http11.py).

Why: a kubelet body (~32 kB at 30 pods) came to the decoder through three copies: OpenSSL
decrypting into the connection's read buffer, httptools' on_body making a bytes of each piece, and
the join of the pieces. The decoder's template path wants an exact bytes object, so the pieces
cannot simply be decrypted into a bytearray and handed on without one more copy.

BodyBuffer(n) owns a new bytes object of n bytes that nothing else has seen yet, and exports its
memory as a writable buffer (memoryview(BodyBuffer), SSLSocket.recv_into) while it is being
filled. take() hands the bytes object over, once: only when no view of it is open, and no view can
be opened afterwards. So a bytes object is never written after anything else holds it; writing a
new bytes object's memory before it is shared is how CPython fills its own. Its hash is computed
on first use (the object is new), so it is that of the bytes taken.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *bytes; /* NULL once taken */
    Py_ssize_t exports; /* views open on it */
} BodyBuffer;

static PyObject *
body_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t n;
    static char *keywords[] = {"size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:BodyBuffer", keywords, &n))
        return NULL;
    if (n < 1) {
        /* size 0 would be the shared empty bytes object, which must never be written */
        PyErr_SetString(PyExc_ValueError, "BodyBuffer needs a size of at least 1");
        return NULL;
    }
    BodyBuffer *self = (BodyBuffer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->bytes = PyBytes_FromStringAndSize(NULL, n);
    if (self->bytes == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->exports = 0;
    return (PyObject *)self;
}

static void
body_dealloc(BodyBuffer *self)
{
    Py_XDECREF(self->bytes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
body_getbuffer(BodyBuffer *self, Py_buffer *view, int flags)
{
    if (self->bytes == NULL) {
        PyErr_SetString(PyExc_BufferError, "the body has been taken");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->bytes), PyBytes_GET_SIZE(self->bytes), 0,
                          flags) < 0)
        return -1;
    self->exports++;
    return 0;
}

static void
body_releasebuffer(BodyBuffer *self, Py_buffer *view)
{
    self->exports--;
}

PyDoc_STRVAR(take_doc, "take() -> bytes\n\n"
                       "The bytes object, once; BufferError while a view of it is open or when it was taken.");

static PyObject *
body_take(BodyBuffer *self, PyObject *unused)
{
    if (self->bytes == NULL) {
        PyErr_SetString(PyExc_BufferError, "the body has been taken");
        return NULL;
    }
    if (self->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "a view of the body is still open");
        return NULL;
    }
    PyObject *bytes = self->bytes;
    self->bytes = NULL;
    return bytes;
}

static Py_ssize_t
body_length(BodyBuffer *self)
{
    return self->bytes == NULL ? 0 : PyBytes_GET_SIZE(self->bytes);
}

static PyMethodDef body_methods[] = {
    {"take", (PyCFunction)body_take, METH_NOARGS, take_doc},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs body_as_buffer = {
    (getbufferproc)body_getbuffer,
    (releasebufferproc)body_releasebuffer,
};

static PySequenceMethods body_as_sequence = {
    .sq_length = (lenfunc)body_length,
};

PyDoc_STRVAR(body_doc, "BodyBuffer(size)\n\n"
                       "A new bytes object of size bytes, writable through the buffer protocol until take() "
                       "hands it over (see _bodybuffer.c).");

static PyTypeObject BodyBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kcms.collector._bodybuffer.BodyBuffer",
    .tp_basicsize = sizeof(BodyBuffer),
    .tp_dealloc = (destructor)body_dealloc,
    .tp_as_sequence = &body_as_sequence,
    .tp_as_buffer = &body_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = body_doc,
    .tp_methods = body_methods,
    .tp_new = body_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kcms.collector._bodybuffer",
    "A response body decrypted straight into the bytes object handed on (see _bodybuffer.c).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__bodybuffer(void)
{
    if (PyType_Ready(&BodyBufferType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "BodyBuffer", (PyObject *)&BodyBufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
