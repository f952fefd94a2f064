/* langflow_sandbox_createos._createos: multi-phase init, module state,
 * exception types, fork hook. The model is CPython's Modules/_sqlite/module.c. */
#include "module.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>

#include "ops.h"

/* The package version, from langflow_sandbox_createos/__init__.py (setup.py defines it). */
#ifndef COS_VERSION
#error "COS_VERSION is not defined: build through setup.py"
#endif

/* libcurl's global init is process-wide by its own design; pthread_once makes
 * it happen once whatever the number of interpreters importing us. */
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_global_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static cos_state *get_state(PyObject *module)
{
    return (cos_state *)PyModule_GetState(module);
}

PyObject *cos_raise(cos_state *st, const cos_err *err)
{
    PyObject *type, *msg = NULL, *exc = NULL, *v;

    switch (err->kind) {
    case COS_E_NOMEM:
        return PyErr_NoMemory();
    case COS_E_OS:
        /* OSError(errno, what failed): "[Errno 11] could not start ..." */
        v = Py_BuildValue("(is)", err->os_errno, err->msg);
        if (v != NULL)
            PyErr_SetObject(PyExc_OSError, v);
        Py_XDECREF(v);
        return NULL;
    case COS_E_VALUE:
        PyErr_SetString(PyExc_ValueError, err->msg);
        return NULL;
    case COS_E_ABORTED:
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "native call interrupted");
        return NULL;
    case COS_E_CONFIG:
        type = st->ConfigError;
        break;
    case COS_E_NOTFOUND:
        type = st->NotFoundError;
        break;
    case COS_E_CONFLICT:
        type = st->ConflictError;
        break;
    case COS_E_TRANSIENT:
        type = st->TransientError;
        break;
    case COS_E_DEADLINE:
        type = st->DeadlineError;
        break;
    case COS_E_PROTOCOL:
        type = st->ProtocolError;
        break;
    case COS_E_UNAVAILABLE:
    case COS_E_CLOSED:
        type = st->UnavailableError;
        break;
    default:
        type = st->CreateOSError;
        break;
    }
    msg = PyUnicode_DecodeUTF8(err->msg, (Py_ssize_t)strlen(err->msg), "replace");
    if (msg == NULL)
        goto error;
    exc = PyObject_CallFunctionObjArgs(type, msg, NULL);
    if (exc == NULL)
        goto error;
#define SET(name, value)                                                                           \
    do {                                                                                           \
        v = (value);                                                                               \
        if (v == NULL || PyObject_SetAttrString(exc, name, v) < 0) {                               \
            Py_XDECREF(v);                                                                         \
            goto error;                                                                            \
        }                                                                                          \
        Py_DECREF(v);                                                                              \
    } while (0)
#define OPT_STR(s)                                                                                 \
    ((s)[0] ? PyUnicode_DecodeUTF8((s), (Py_ssize_t)strlen(s), "replace") : Py_NewRef(Py_None))
    SET("status", err->status > 0 ? PyLong_FromLong(err->status) : Py_NewRef(Py_None));
    SET("request_id", OPT_STR(err->request_id));
    SET("transient", PyBool_FromLong(cos_kind_is_transient(err->kind)));
    SET("retry_after",
        err->has_retry_after ? PyFloat_FromDouble(err->retry_after) : Py_NewRef(Py_None));
    SET("code", OPT_STR(err->code));
    SET("sandbox_id", OPT_STR(err->sandbox_id));
#undef SET
#undef OPT_STR
    PyErr_SetObject(type, exc);
error:
    Py_XDECREF(msg);
    Py_XDECREF(exc);
    return NULL;
}

PyObject *cos_alloc(PyTypeObject *tp)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    return alloc(tp, 0);
}

void cos_free(PyObject *self)
{
    freefunc free_ = (freefunc)PyType_GetSlot(Py_TYPE(self), Py_tp_free);
    free_(self);
}

PyObject *cos_type_name(PyObject *o)
{
    PyObject *name = PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__name__");
    if (name == NULL || !PyUnicode_Check(name)) {
        PyErr_Clear();
        Py_XDECREF(name);
        name = PyUnicode_FromString("?");
    }
    return name;
}

static PyObject *after_fork_child(PyObject *module, PyObject *unused)
{
    cos_state *st = get_state(module);
    Py_ssize_t i, n;
    (void)unused;
    if (st->clients == NULL)
        Py_RETURN_NONE;
    n = COS_LIST_SIZE(st->clients);
    for (i = 0; i < n; i++) {
        /* calling a weakref gives a new reference to its object, or None */
        PyObject *obj = PyObject_CallNoArgs(COS_LIST_ITEM(st->clients, i));
        if (obj != NULL && obj != Py_None)
            cos_client_after_fork(obj);
        Py_XDECREF(obj);
    }
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"_after_fork_child", after_fork_child, METH_NOARGS,
     "Registered with os.register_at_fork: clients forget the parent's connections and thread."},
    {NULL, NULL, 0, NULL},
};

static PyObject *new_exception(PyObject *module, const char *name, const char *doc, PyObject *base,
                               int transient)
{
    char qualname[128];
    PyObject *dict = NULL, *exc = NULL;
    static const char *const none_attrs[] = {"status", "request_id", "retry_after", "code",
                                             "sandbox_id"};
    size_t i;

    snprintf(qualname, sizeof qualname, "langflow_sandbox_createos._createos.%s", name);
    if ((dict = PyDict_New()) == NULL)
        goto error;
    for (i = 0; i < sizeof none_attrs / sizeof none_attrs[0]; i++)
        if (PyDict_SetItemString(dict, none_attrs[i], Py_None) < 0)
            goto error;
    if (PyDict_SetItemString(dict, "transient", transient ? Py_True : Py_False) < 0)
        goto error;
    exc = PyErr_NewExceptionWithDoc(qualname, doc, base, dict);
    if (exc != NULL && PyModule_AddObjectRef(module, name, exc) < 0)
        Py_CLEAR(exc);
error:
    Py_XDECREF(dict);
    return exc;
}

static int check_curl(void)
{
    const curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    CURL *probe;
    if (info == NULL || info->version_num < LIBCURL_VERSION_NUM) {
        PyErr_Format(PyExc_ImportError,
                     "_createos was built against libcurl %s but the runtime libcurl is %s: "
                     "install a libcurl at least as new",
                     LIBCURL_VERSION, info ? info->version : "unknown");
        return -1;
    }
    if (!(info->features & CURL_VERSION_SSL)) {
        PyErr_SetString(PyExc_ImportError, "the runtime libcurl has no TLS support");
        return -1;
    }
    pthread_once(&curl_once, curl_global_once);
    probe = curl_easy_init();
    if (probe == NULL) {
        PyErr_SetString(PyExc_ImportError, "libcurl could not be initialised");
        return -1;
    }
    curl_easy_cleanup(probe);
    return 0;
}

static int register_fork_hook(PyObject *module)
{
    PyObject *os = NULL, *reg = NULL, *hook = NULL, *args = NULL, *kwargs = NULL, *res = NULL;
    int rc = -1;
    if ((os = PyImport_ImportModule("os")) == NULL)
        goto error;
    reg = PyObject_GetAttrString(os, "register_at_fork");
    if (reg == NULL) {
        /* platforms without fork: the pid check in each call still guards */
        PyErr_Clear();
        rc = 0;
        goto error;
    }
    if ((hook = PyObject_GetAttrString(module, "_after_fork_child")) == NULL ||
        (args = PyTuple_New(0)) == NULL ||
        (kwargs = Py_BuildValue("{s:O}", "after_in_child", hook)) == NULL ||
        (res = PyObject_Call(reg, args, kwargs)) == NULL)
        goto error;
    rc = 0;
error:
    Py_XDECREF(os);
    Py_XDECREF(reg);
    Py_XDECREF(hook);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(res);
    return rc;
}

/* What the headers the module was built with allow (compat.h), by name. */
static int add_build_features(PyObject *module)
{
    static const struct {
        const char *name;
        int have;
    } features[] = {
        {"quick_exit", COS_HAVE_QUICK_EXIT},
        {"json_keys_with_nul", COS_HAVE_JSON_KEYLEN},
    };
    PyObject *set = PyFrozenSet_New(NULL), *name;
    size_t i;
    int rc = -1;

    if (set == NULL)
        goto done;
    for (i = 0; i < sizeof features / sizeof features[0]; i++) {
        int added;
        if (!features[i].have)
            continue;
        if ((name = PyUnicode_FromString(features[i].name)) == NULL)
            goto done;
        added = PySet_Add(set, name); /* allowed on a frozenset nobody else has seen */
        Py_DECREF(name);
        if (added < 0)
            goto done;
    }
    rc = PyModule_AddObjectRef(module, "build_features", set);
done:
    Py_XDECREF(set);
    return rc;
}

static int module_exec(PyObject *module)
{
    cos_state *st = get_state(module);
    char jv[32];

    if (check_curl() < 0)
        return -1;
#define EXC(field, name, doc, base, transient)                                                     \
    if ((st->field = new_exception(module, name, doc, base, transient)) == NULL)                   \
        return -1;
    EXC(CreateOSError, "CreateOSError", "Base of every error the native client raises.",
        PyExc_Exception, 0);
    EXC(UnavailableError, "UnavailableError",
        "Not retryable: non-429 4xx, or a refused configuration.", st->CreateOSError, 0);
    EXC(ConfigError, "ConfigError", "Refused before any request was sent.", st->UnavailableError,
        0);
    EXC(NotFoundError, "NotFoundError", "HTTP 404.", st->UnavailableError, 0);
    EXC(ConflictError, "ConflictError", "HTTP 409.", st->UnavailableError, 0);
    EXC(TransientError, "TransientError", "429, 5xx, or a transport failure.", st->CreateOSError,
        1);
    EXC(DeadlineError, "DeadlineError", "The call's whole deadline passed.", st->TransientError, 1);
    EXC(ProtocolError, "ProtocolError", "The server's answer is not the documented protocol.",
        st->CreateOSError, 0);
#undef EXC
    if (cos_client_add_types(module, st) < 0)
        return -1;
    if ((st->clients = PyList_New(0)) == NULL)
        return -1;
    snprintf(jv, sizeof jv, "%s", jansson_version_str());
    if (PyModule_AddStringConstant(module, "__version__", COS_VERSION) < 0 ||
        PyModule_AddStringConstant(module, "curl_version",
                                   curl_version_info(CURLVERSION_NOW)->version) < 0 ||
        PyModule_AddStringConstant(module, "jansson_version", jv) < 0 ||
        PyModule_AddStringConstant(module, "build_curl_version", LIBCURL_VERSION) < 0 ||
        PyModule_AddStringConstant(module, "build_jansson_version", JANSSON_VERSION) < 0 ||
        add_build_features(module) < 0 ||
        PyModule_AddObjectRef(module, "callers_drive", cos_callers_drive() ? Py_True : Py_False) <
            0 ||
        PyModule_AddIntConstant(module, "DEFAULT_MAX_OUTPUT_BYTES", (long)COS_DEFAULT_MAX_OUTPUT) <
            0 ||
        PyModule_AddIntConstant(module, "MAX_OUTPUT_BYTES_LIMIT", (long)COS_MAX_OUTPUT_LIMIT) < 0)
        return -1;
    return register_fork_hook(module);
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    cos_state *st = get_state(module);
    Py_VISIT(st->CreateOSError);
    Py_VISIT(st->UnavailableError);
    Py_VISIT(st->ConfigError);
    Py_VISIT(st->NotFoundError);
    Py_VISIT(st->ConflictError);
    Py_VISIT(st->TransientError);
    Py_VISIT(st->DeadlineError);
    Py_VISIT(st->ProtocolError);
    Py_VISIT(st->ClientType);
    Py_VISIT(st->ExecResultType);
    Py_VISIT(st->clients);
    return 0;
}

static int module_clear(PyObject *module)
{
    cos_state *st = get_state(module);
    Py_CLEAR(st->CreateOSError);
    Py_CLEAR(st->UnavailableError);
    Py_CLEAR(st->ConfigError);
    Py_CLEAR(st->NotFoundError);
    Py_CLEAR(st->ConflictError);
    Py_CLEAR(st->TransientError);
    Py_CLEAR(st->DeadlineError);
    Py_CLEAR(st->ProtocolError);
    Py_CLEAR(st->ClientType);
    Py_CLEAR(st->ExecResultType);
    Py_CLEAR(st->clients);
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "langflow_sandbox_createos._createos",
    .m_doc = "Native CreateOS control-plane client (libcurl + jansson).",
    .m_size = sizeof(cos_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__createos(void)
{
    return PyModuleDef_Init(&module_def);
}
