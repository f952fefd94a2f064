/* The binding's shared declarations: module state and the pieces module.c,
 * client.c, execresult.c and pyjson.c give each other. Only these four files
 * include Python. */
#ifndef COS_MODULE_H
#define COS_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030C0000
/* Python 3.12 names member types Py_T_* in Python.h and deprecates
 * structmember.h (T_OBJECT and friends); 3.10 and 3.11 have the old names only */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
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
PyObject *cos_json_to_py(json_t *j);
/* A JSON object (want_object) or array from a Python value, or NULL for None
 * (then *ok is 1); *ok is 0 with an exception set on error. */
json_t *cos_arg_json(PyObject *o, int want_object, const char *what, int *ok);
/* A sequence of str as a JSON array (args, egress rules); as cos_arg_json. */
json_t *cos_arg_str_list(PyObject *o, const char *what, int *ok);
/* In a forked child: drop the engine inherited from the parent. */
void cos_client_after_fork(PyObject *client);

#endif
