/* The binding's shared declarations: module state and the pieces client.c
 * and module.c give each other. Only module.c and client.c include Python. */
#ifndef COS_MODULE_H
#define COS_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"

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
/* In a forked child: drop the engine inherited from the parent. */
void cos_client_after_fork(PyObject *client);

#endif
