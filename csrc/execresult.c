/* The ExecResult type: the immutable outcome of one exec, built from the C
 * core's cos_exec_out (or from keyword arguments, for tests and fakes). */
#include "module.h"

#include <stddef.h>

typedef struct {
    PyObject_HEAD
    PyObject *stdout_;
    PyObject *stderr_;
    PyObject *exit_code;
    PyObject *error;
    PyObject *exec_ms;
    PyObject *stdout_truncated;
    PyObject *stderr_truncated;
    PyObject *streamed;
    PyObject *sandbox_id;
    PyObject *timed_out;
} ExecResultObject;

#define ER_FIELDS(X)                                                                               \
    X(stdout_, "stdout")                                                                           \
    X(stderr_, "stderr")                                                                           \
    X(exit_code, "exit_code")                                                                      \
    X(error, "error")                                                                              \
    X(exec_ms, "exec_ms")                                                                          \
    X(stdout_truncated, "stdout_truncated")                                                        \
    X(stderr_truncated, "stderr_truncated")                                                        \
    X(streamed, "streamed")                                                                        \
    X(sandbox_id, "sandbox_id")                                                                    \
    X(timed_out, "timed_out")

/* clang-format off: one member per field, from the list above */
static PyMemberDef er_members[] = {
#define X(field, name) {name, Py_T_OBJECT_EX, offsetof(ExecResultObject, field), Py_READONLY, NULL},
    ER_FIELDS(X)
#undef X
        {NULL, 0, 0, 0, NULL},
};
/* clang-format on */

/* error, exec_ms and sandbox_id may be any object when built from Python:
 * the type takes part in garbage collection. */
static int er_traverse(ExecResultObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
#define X(field, name) Py_VISIT(self->field);
    ER_FIELDS(X)
#undef X
    return 0;
}

static int er_clear(ExecResultObject *self)
{
#define X(field, name) Py_CLEAR(self->field);
    ER_FIELDS(X)
#undef X
    return 0;
}

static void er_dealloc(ExecResultObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    er_clear(self);
    cos_free((PyObject *)self);
    Py_DECREF(tp);
}

/* ExecResult(**fields): also constructible from Python, for tests and fakes. */
static PyObject *er_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {
        "stdout",           "stderr",   "exit_code",  "error",     "exec_ms", "stdout_truncated",
        "stderr_truncated", "streamed", "sandbox_id", "timed_out", NULL};
    PyObject *so = NULL, *se = NULL, *error = Py_None, *exec_ms = Py_None, *sid = Py_None;
    int exit_code = -1, sot = 0, set = 0, streamed = 0, timed_out = 0;
    ExecResultObject *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$UUiOOpppOp", kw, &so, &se, &exit_code, &error,
                                     &exec_ms, &sot, &set, &streamed, &sid, &timed_out))
        return NULL;
    (void)sid;
    self = (ExecResultObject *)cos_alloc(tp);
    if (self == NULL)
        return NULL;
    self->stdout_ = so ? Py_NewRef(so) : PyUnicode_FromString("");
    self->stderr_ = se ? Py_NewRef(se) : PyUnicode_FromString("");
    self->exit_code = PyLong_FromLong(exit_code);
    self->error = Py_NewRef(error);
    self->exec_ms = Py_NewRef(exec_ms);
    self->stdout_truncated = PyBool_FromLong(sot);
    self->stderr_truncated = PyBool_FromLong(set);
    self->streamed = PyBool_FromLong(streamed);
    self->sandbox_id = Py_NewRef(sid ? sid : Py_None);
    self->timed_out = PyBool_FromLong(timed_out);
    if (!self->stdout_ || !self->stderr_ || !self->exit_code) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *er_repr(ExecResultObject *self)
{
    return PyUnicode_FromFormat(
        "ExecResult(exit_code=%R, stdout=<%zd chars%s>, stderr=<%zd chars%s>, error=%R, "
        "streamed=%R, timed_out=%R, sandbox_id=%R)",
        self->exit_code, COS_UNICODE_LENGTH(self->stdout_),
        self->stdout_truncated == Py_True ? ", truncated" : "", COS_UNICODE_LENGTH(self->stderr_),
        self->stderr_truncated == Py_True ? ", truncated" : "", self->error, self->streamed,
        self->timed_out, self->sandbox_id);
}

static PyType_Slot er_slots[] = {
    {Py_tp_dealloc, er_dealloc},
    {Py_tp_traverse, er_traverse},
    {Py_tp_clear, er_clear},
    {Py_tp_new, er_new},
    {Py_tp_repr, er_repr},
    {Py_tp_members, er_members},
    {Py_tp_doc, "The outcome of one exec: output (capped), exit code, and how it ended."},
    {0, NULL},
};

static PyType_Spec er_spec = {
    .name = "langflow_sandbox_createos._createos.ExecResult",
    .basicsize = sizeof(ExecResultObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = er_slots,
};

PyObject *cos_decode(const char *s, size_t n)
{
    return PyUnicode_DecodeUTF8(s ? s : "", (Py_ssize_t)n, "replace");
}

PyObject *cos_make_result(cos_state *st, cos_exec_out *x, const char *sandbox_id)
{
    ExecResultObject *r = (ExecResultObject *)cos_alloc(st->ExecResultType);
    if (r == NULL)
        return NULL;
    r->stdout_ = cos_decode(x->out[0].buf.data, x->out[0].buf.len);
    r->stderr_ = cos_decode(x->out[1].buf.data, x->out[1].buf.len);
    r->exit_code = PyLong_FromLongLong(x->has_exit ? x->exit_code : -1);
    r->error = x->error.len ? cos_decode(x->error.data, x->error.len) : Py_NewRef(Py_None);
    r->exec_ms = x->has_exec_ms ? PyFloat_FromDouble(x->exec_ms) : Py_NewRef(Py_None);
    r->stdout_truncated = PyBool_FromLong(x->out[0].truncated);
    r->stderr_truncated = PyBool_FromLong(x->out[1].truncated);
    r->streamed = PyBool_FromLong(x->streamed);
    r->sandbox_id = sandbox_id && sandbox_id[0] ? cos_decode(sandbox_id, strlen(sandbox_id))
                                                : Py_NewRef(Py_None);
    r->timed_out = PyBool_FromLong(x->timed_out);
    if (!r->stdout_ || !r->stderr_ || !r->exit_code || !r->error || !r->exec_ms || !r->sandbox_id) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

int cos_execresult_add_type(PyObject *module, cos_state *st)
{
    st->ExecResultType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &er_spec, NULL);
    if (st->ExecResultType == NULL ||
        PyModule_AddObjectRef(module, "ExecResult", (PyObject *)st->ExecResultType) < 0)
        return -1;
    return 0;
}
