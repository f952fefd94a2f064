/* The binding's shared declarations: module state and the pieces module.c,
 * client.c, execresult.c and pyjson.c give each other. Only these four files
 * include Python. */
#ifndef COS_MODULE_H
#define COS_MODULE_H

#define PY_SSIZE_T_CLEAN
/* setup.py defines Py_LIMITED_API=0x030A0000 (the stable ABI of CPython 3.10, one
 * cp310-abi3 wheel for 3.10 and later) unless CREATEOS_FULL_API=1 asks for a
 * version-specific build; the code below serves both (docs/native-client.md,
 * "The stable ABI"). */
#include <Python.h>

#if PY_VERSION_HEX < 0x030C0000
/* Python 3.12 names member types Py_T_* in Python.h and deprecates
 * structmember.h (T_OBJECT and friends); 3.10 and 3.11 have the old names only */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
#endif

/* The few accessors the Limited API has only as functions: macros (no checks)
 * in a version-specific build, the checked functions in the abi3 one. */
#ifdef Py_LIMITED_API
#define COS_TUPLE_SIZE(t) PyTuple_Size(t)
#define COS_TUPLE_ITEM(t, i) PyTuple_GetItem((t), (i))
#define COS_LIST_SIZE(l) PyList_Size(l)
#define COS_LIST_ITEM(l, i) PyList_GetItem((l), (i))
#define COS_LIST_SET(l, i, v) ((void)PyList_SetItem((l), (i), (v)))
#define COS_FLOAT_VALUE(f) PyFloat_AsDouble(f)
#define COS_UNICODE_LENGTH(s) PyUnicode_GetLength(s)
#define COS_BYTES_DATA(b) PyBytes_AsString(b)
#else
#define COS_TUPLE_SIZE(t) PyTuple_GET_SIZE(t)
#define COS_TUPLE_ITEM(t, i) PyTuple_GET_ITEM((t), (i))
#define COS_LIST_SIZE(l) PyList_GET_SIZE(l)
#define COS_LIST_ITEM(l, i) PyList_GET_ITEM((l), (i))
#define COS_LIST_SET(l, i, v) PyList_SET_ITEM((l), (i), (v))
#define COS_FLOAT_VALUE(f) PyFloat_AS_DOUBLE(f)
#define COS_UNICODE_LENGTH(s) PyUnicode_GET_LENGTH(s)
#define COS_BYTES_DATA(b) PyBytes_AS_STRING(b)
#endif
/* The buffer protocol joined the Limited API in 3.11: a 3.10 abi3 build takes
 * bytes as they are and copies other bytes-like objects (client.c, upload). */
#if !defined(Py_LIMITED_API) || Py_LIMITED_API + 0 >= 0x030B0000
#define COS_HAVE_BUFFER_API 1
#else
#define COS_HAVE_BUFFER_API 0
#endif

/* setup.py's self-contained build (CREATEOS_STATIC_PREFIX) looks for the system
 * CA bundle itself (client.c, ca_probe); a build on the system libcurl keeps
 * that libcurl's own default. */
#ifndef COS_CA_PROBE
#define COS_CA_PROBE 0
#endif

#include <jansson.h>

#include "common.h"
#include "compat.h"

typedef struct {
    PyObject *CreateOSError;
    PyObject *UnavailableError;
    PyObject *ConfigError;
    PyObject *NotFoundError;
    PyObject *ConflictError;
    PyObject *TransientError;
    PyObject *DeadlineError;
    PyObject *ProtocolError;
    PyTypeObject *ClientType;
    PyTypeObject *ExecResultType;
    PyObject *clients; /* list of weakrefs to live clients, for fork handling */
} cos_state;

/* Set the Python exception for a core error; returns NULL. */
PyObject *cos_raise(cos_state *st, const cos_err *err);
/* Add Client and ExecResult to the module (state filled). */
int cos_client_add_types(PyObject *module, cos_state *st);

/* execresult.c */
int cos_execresult_add_type(PyObject *module, cos_state *st);
/* A new ExecResult from an exec's output; sandbox_id may be NULL or "". */
PyObject *cos_make_result(cos_state *st, cos_exec_out *x, const char *sandbox_id);
/* UTF-8 (invalid sequences replaced) -> str; s may be NULL when n is 0. */
PyObject *cos_decode(const char *s, size_t n);

/* pyjson.c: conversions; NULL with a Python exception set */
/* A server's answer as Python values; every string and key has runs of secret (the API
 * key) redacted (cos_redact), and is otherwise kept (NUL included). */
PyObject *cos_json_to_py(json_t *j, const char *secret);
/* A JSON object (want_object) or array from a Python value, or NULL for None
 * (then *ok is 1); *ok is 0 with an exception set on error. */
json_t *cos_arg_json(PyObject *o, int want_object, const char *what, int *ok);
/* A sequence of str as a JSON array (args, egress rules); as cos_arg_json. */
json_t *cos_arg_str_list(PyObject *o, const char *what, int *ok);
/* In a forked child: drop the engine inherited from the parent. */
void cos_client_after_fork(PyObject *client);
/* tp_alloc and tp_free of a heap type, as the Limited API reaches them. */
PyObject *cos_alloc(PyTypeObject *tp);
void cos_free(PyObject *self);
/* The name of o's type (new reference; tp_name is out of the Limited API's reach). */
PyObject *cos_type_name(PyObject *o);

#endif
