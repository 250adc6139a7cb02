/* pyrds.kernel._fastcall: the kernel backend's data calls without a Python frame (issue 10, part 1).
 *
 * A FastCall object stands in for one data call of one RDSSocket (pyrds/kernel/socket.py, _data_calls). It
 * does no socket work of its own: for the argument shapes below it calls the stdlib's C method on one of the
 * socket's two views directly, and for every other shape it calls the pure-Python closure ("fallback") that
 * holds pyrds's rules, so behaviour is defined once, in Python, and this file only skips a frame where the
 * closure would do nothing but forward the call:
 *
 *   recv(bufsize[, flags]), recvfrom(...)       flags absent, or an int without MSG_TRUNC
 *   recv_into(buffer[, nbytes[, flags]]), ...    the same (MSG_TRUNC needs the clamp, which stays in Python)
 *   sendto(data[, flags], address)               address is the very object of the last route learned, or
 *                                                a tuple of exact str/int equal to it when its host is a literal IP
 *   sendmsg(buffers, ancdata, flags, address)    ancdata an empty tuple or list; address as for sendto, or
 *                                                absent/None (the AF_INET6 view's sendmsg, as in Python)
 *
 * The last route is shared with the Python side through a one-element list, "state", whose item is the tuple
 * (address object, view's sendto, view's sendmsg, numeric address, view, host is a literal IP) that the closure
 * replaces whole when it learns a destination; this object only reads it. No keyword arguments on the fast path (the closures take
 * sendmsg's by keyword; the stdlib methods take none).
 *
 * Written for the CPython 3.11+ C API (vectorcall); no Limited API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

enum kind {
    K_RECV = 0,      /* recv, recvfrom: flags at position 1 */
    K_RECV_INTO = 1, /* recv_into, recvfrom_into: flags at position 2 */
    K_SENDTO = 2,
    K_SENDMSG = 3,
};

typedef struct {
    PyObject_HEAD
    int kind;
    PyObject *method;   /* the stdlib's method descriptor (socket.socket.recv, ...), called with a view as self */
    PyObject *view;     /* K_RECV*: the view to call it on; K_SENDMSG: the AF_INET6 view (no address); else NULL */
    PyObject *state;    /* K_SENDTO/K_SENDMSG: the one-element list holding the last route; else NULL */
    PyObject *fallback; /* the Python closure with the same signature: every other shape goes there */
    PyObject *name;     /* for repr */
    PyCFunction cfunc;  /* method's C function when it is a METH_VARARGS method descriptor, else NULL */
    PyTypeObject *owner; /* the type cfunc belongs to (a view must be an instance of it); with cfunc */
    vectorcallfunc vectorcall;
} FastCall;

static PyObject *
forward(FastCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* flags is an int (or an int subclass: bool, socket.MsgFlag; their value, as operator.index gives it, is what
 * the closure tests too) whose value fits a C long and has no MSG_TRUNC bit (a negative value has it) */
static int
plain_flags(PyObject *flags)
{
    if (!PyLong_Check(flags))
        return 0;
    int overflow = 0;
    long value = PyLong_AsLongAndOverflow(flags, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return (value & MSG_TRUNC) == 0;
}

/* the last route learned, or NULL (a borrowed reference valid while the caller holds no other Python code) */
static PyObject *
last_route(FastCall *self)
{
    if (!PyList_CheckExact(self->state) || PyList_GET_SIZE(self->state) != 1)
        return NULL;
    PyObject *entry = PyList_GET_ITEM(self->state, 0);
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 6)
        return NULL;
    return entry;
}

/* two exact str objects with the same code points. A reply's host is a new str per message (recvfrom makes one),
 * so this runs once per reply; compared by length, kind and memory, without PyUnicode_Compare's ordering. */
static int
same_str(PyObject *a, PyObject *b)
{
    if (!PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b))
        return 0;
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(a) < 0 || PyUnicode_READY(b) < 0) {
        PyErr_Clear();
        return 0;
    }
#endif
    Py_ssize_t length = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return length == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)length * (size_t)kind) == 0;
}

/* two exact int objects with the same value (a port, flowinfo or scope id: any value that fits a C long; a
 * larger one goes to the closure, which the stdlib then refuses with its own error) */
static int
same_int(PyObject *a, PyObject *b)
{
    if (!PyLong_CheckExact(a) || !PyLong_CheckExact(b))
        return 0;
    int overflow_a = 0, overflow_b = 0;
    long value_a = PyLong_AsLongAndOverflow(a, &overflow_a);
    long value_b = PyLong_AsLongAndOverflow(b, &overflow_b);
    if (overflow_a || overflow_b || ((value_a == -1 || value_b == -1) && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return value_a == value_b;
}

/* address is the route's address object, or (the route's host is a literal IP: entry[5] is True) a tuple equal to
 * it made only of exact str and int, like the ones recvfrom returns: a server replying to each source. Only exact
 * types compare: a subclass could define its own equality; the closure decides for it. */
static int
same_destination(PyObject *entry, PyObject *address)
{
    PyObject *known = PyTuple_GET_ITEM(entry, 0);
    if (address == known)
        return 1;
    if (PyTuple_GET_ITEM(entry, 5) != Py_True || !PyTuple_CheckExact(address) || !PyTuple_CheckExact(known))
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(address);
    if (n != PyTuple_GET_SIZE(known) || (n != 2 && n != 4))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(address, i), *b = PyTuple_GET_ITEM(known, i);
        if (a == b)
            continue;
        if (!(i == 0 ? same_str(a, b) : same_int(a, b)))
            return 0;
    }
    return 1;
}

static int
empty_sequence(PyObject *obj)
{
    return (PyTuple_CheckExact(obj) && PyTuple_GET_SIZE(obj) == 0) ||
           (PyList_CheckExact(obj) && PyList_GET_SIZE(obj) == 0);
}

/* method(view, args...[, numeric]), as CPython calls s.recv(...) itself: for a METH_VARARGS method descriptor
 * (the socket's data calls), its C function with the arguments as a tuple, after the type check the
 * descriptor would make (a view of another type: the method's own vectorcall, which raises its TypeError);
 * else the method's own vectorcall. The route's numeric address stands in for the
 * user's address object. The view is held across the call: the closure may replace the route meanwhile, in
 * another thread, while the call waits with the GIL released (the tuple holds the numeric address). n <= 4. */
static PyObject *
call_on(FastCall *self, PyObject *view, PyObject *const *args, Py_ssize_t n, PyObject *numeric)
{
    Py_ssize_t total = numeric != NULL ? n + 1 : n;
    if (self->cfunc != NULL && PyObject_TypeCheck(view, self->owner)) {
        PyObject *tuple = PyTuple_New(total);
        if (tuple == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++)
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
        if (numeric != NULL)
            PyTuple_SET_ITEM(tuple, n, Py_NewRef(numeric));
        Py_INCREF(view);
        PyObject *result = self->cfunc(view, tuple);
        Py_DECREF(view);
        Py_DECREF(tuple);
        return result;
    }
    PyObject *stack[6];
    stack[0] = view;
    for (Py_ssize_t i = 0; i < n; i++)
        stack[i + 1] = args[i];
    if (numeric != NULL)
        stack[n + 1] = numeric;
    Py_INCREF(view);
    Py_XINCREF(numeric);
    PyObject *result = PyObject_Vectorcall(self->method, stack, (size_t)(total + 1), NULL);
    Py_XDECREF(numeric);
    Py_DECREF(view);
    return result;
}

static PyObject *
fastcall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastCall *self = (FastCall *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)
        return forward(self, args, nargsf, kwnames);
    switch (self->kind) {
    case K_RECV:
    case K_RECV_INTO: {
        Py_ssize_t flags_at = self->kind == K_RECV ? 1 : 2;
        if (nargs >= 1 && (nargs <= flags_at || (nargs == flags_at + 1 && plain_flags(args[flags_at]))))
            return call_on(self, self->view, args, nargs, NULL);
        break;
    }
    case K_SENDTO: {
        PyObject *entry = last_route(self);
        if (entry != NULL && (nargs == 2 || nargs == 3) && same_destination(entry, args[nargs - 1]))
            return call_on(self, PyTuple_GET_ITEM(entry, 4), args, nargs - 1, PyTuple_GET_ITEM(entry, 3));
        break;
    }
    case K_SENDMSG: {
        if (nargs < 1 || nargs > 4 || (nargs >= 2 && !empty_sequence(args[1])))
            break;
        if (nargs < 4 || args[3] == Py_None)
            return call_on(self, self->view, args, nargs < 4 ? nargs : 3, NULL);
        PyObject *entry = last_route(self);
        if (entry != NULL && same_destination(entry, args[3]))
            return call_on(self, PyTuple_GET_ITEM(entry, 4), args, 3, PyTuple_GET_ITEM(entry, 3));
        break;
    }
    }
    return forward(self, args, nargsf, kwnames);
}

static PyObject *
fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"kind", "name", "fallback", "method", "view", "state", NULL};
    int kind;
    PyObject *name, *fallback, *method, *view = Py_None, *state = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iUOO|OO:FastCall", keywords, &kind, &name, &fallback,
                                     &method, &view, &state))
        return NULL;
    if (kind < K_RECV || kind > K_SENDMSG) {
        PyErr_SetString(PyExc_ValueError, "unknown FastCall kind");
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    int needs_view = kind == K_RECV || kind == K_RECV_INTO || kind == K_SENDMSG;
    int needs_state = kind == K_SENDTO || kind == K_SENDMSG;
    if (!PyCallable_Check(method)) {
        PyErr_SetString(PyExc_TypeError, "method must be callable");
        return NULL;
    }
    if (needs_view && view == Py_None) {
        PyErr_SetString(PyExc_TypeError, "this kind needs a view");
        return NULL;
    }
    if (needs_state && (!PyList_CheckExact(state) || PyList_GET_SIZE(state) != 1)) {
        PyErr_SetString(PyExc_TypeError, "state must be a list of one item");
        return NULL;
    }
    FastCall *self = (FastCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->kind = kind;
    self->name = Py_NewRef(name);
    self->fallback = Py_NewRef(fallback);
    self->method = Py_NewRef(method);
    if (Py_IS_TYPE(method, &PyMethodDescr_Type)) {
        PyMethodDef *def = ((PyMethodDescrObject *)method)->d_method;
        int calling = def->ml_flags & (METH_VARARGS | METH_KEYWORDS | METH_NOARGS | METH_O | METH_FASTCALL |
                                        METH_METHOD | METH_CLASS | METH_STATIC);
        if (calling == METH_VARARGS) {
            self->cfunc = def->ml_meth;
            self->owner = (PyTypeObject *)Py_NewRef(PyDescr_TYPE(method));
        }
    }
    self->view = needs_view ? Py_NewRef(view) : NULL;
    self->state = needs_state ? Py_NewRef(state) : NULL;
    self->vectorcall = fastcall_vectorcall;
    return (PyObject *)self;
}

static int
fastcall_traverse(FastCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->method);
    Py_VISIT(self->owner);
    Py_VISIT(self->view);
    Py_VISIT(self->state);
    Py_VISIT(self->fallback);
    Py_VISIT(self->name);
    return 0;
}

static int
fastcall_clear(FastCall *self)
{
    Py_CLEAR(self->method);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->view);
    Py_CLEAR(self->state);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->name);
    return 0;
}

static void
fastcall_dealloc(FastCall *self)
{
    PyObject_GC_UnTrack(self);
    fastcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
fastcall_repr(FastCall *self)
{
    return PyUnicode_FromFormat("<pyrds.kernel data call %U (C)>", self->name);
}

static PyObject *
fastcall_get_fallback(FastCall *self, void *closure)
{
    return Py_NewRef(self->fallback);
}

static PyObject *
fastcall_get_name(FastCall *self, void *closure)
{
    return Py_NewRef(self->name);
}

static PyGetSetDef fastcall_getset[] = {
    {"fallback", (getter)fastcall_get_fallback, NULL, "the Python closure every other call shape goes to", NULL},
    {"__name__", (getter)fastcall_get_name, NULL, "the data call's name", NULL},
    {NULL},
};

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pyrds.kernel._fastcall.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One data call of a kernel RDSSocket: the stdlib's C method for the common argument shapes, "
              "the Python fallback for every other.",
    .tp_new = fastcall_new,
    .tp_dealloc = (destructor)fastcall_dealloc,
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_repr = (reprfunc)fastcall_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_getset = fastcall_getset,
};

static int
fastcall_exec(PyObject *module)
{
    if (PyType_Ready(&FastCallType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "FastCall", (PyObject *)&FastCallType) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "RECV", K_RECV) < 0 ||
        PyModule_AddIntConstant(module, "RECV_INTO", K_RECV_INTO) < 0 ||
        PyModule_AddIntConstant(module, "SENDTO", K_SENDTO) < 0 ||
        PyModule_AddIntConstant(module, "SENDMSG", K_SENDMSG) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot fastcall_slots[] = {
    {Py_mod_exec, fastcall_exec},
    {0, NULL},
};

static struct PyModuleDef fastcall_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pyrds.kernel._fastcall",
    .m_doc = "The kernel backend's data calls without a Python frame (see pyrds/kernel/socket.py).",
    .m_size = 0,
    .m_slots = fastcall_slots,
};

PyMODINIT_FUNC
PyInit__fastcall(void)
{
    return PyModuleDef_Init(&fastcall_module);
}
