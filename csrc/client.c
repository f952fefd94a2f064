/* The Client type: argument parsing, GIL release around every network wait,
 * delivery of streamed output on the calling thread. The model is CPython's
 * Modules/_sqlite, one file per type: ExecResult is in execresult.c, the
 * Python <-> JSON conversion in pyjson.c. */
#include "module.h"

#include <math.h>
#include <stddef.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ops.h"

typedef struct {
    PyObject_HEAD
    cos_cfg cfg;
    cos_engine *eng;
    PyObject *base_url;
    PyObject *weakreflist;
    int closed;
    int ready; /* __init__ succeeded */
} ClientObject;

static cos_state *state_of(PyObject *self)
{
    return (cos_state *)PyModule_GetState(PyType_GetModule(Py_TYPE(self)));
}

void cos_client_after_fork(PyObject *obj)
{
    ClientObject *self = (ClientObject *)obj;
    cos_err err;
    if (self->eng == NULL || !cos_engine_forked(self->eng))
        return;
    /* abandon the parent's engine: its sockets and thread are not ours */
    cos_err_clear(&err);
    self->eng = self->closed ? NULL : cos_engine_new(&err);
}

static cos_engine *engine_of(ClientObject *self)
{
    if (self->closed) {
        cos_err err;
        cos_err_clear(&err);
        cos_err_set(&err, COS_E_CLOSED, "the client is closed");
        cos_raise(state_of((PyObject *)self), &err);
        return NULL;
    }
    if (!self->ready) {
        /* Client.__new__(Client), or an __init__ that failed */
        PyErr_SetString(PyExc_RuntimeError,
                        "the Client is not initialised (__init__ did not succeed)");
        return NULL;
    }
    cos_client_after_fork((PyObject *)self); /* a fork the hook did not see */
    if (self->eng == NULL)
        PyErr_NoMemory();
    return self->eng;
}

static int deliver(PyObject *on_output, cos_exec_out *xo)
{
    static const char *const names[2] = {"stdout", "stderr"};
    int s, rc = 0;
    for (s = 0; s < 2 && rc == 0; s++) {
        char *data;
        size_t len;
        PyObject *text, *res = NULL;
        if (cos_exec_out_take(xo, s, &data, &len) < 0) {
            PyErr_NoMemory();
            rc = -1;
        } else if (data != NULL) {
            text = cos_decode(data, len);
            free(data);
            if (text != NULL)
                res = PyObject_CallFunction(on_output, "sO", names[s], text);
            Py_XDECREF(text);
            rc = res != NULL ? 0 : -1;
            Py_XDECREF(res);
        }
    }
    return rc;
}

/* One native call: the error record and the context the C core runs with,
 * and the caller's thread state while the GIL is released. */
typedef struct {
    ClientObject *self;
    cos_err err;
    cos_ctx ctx;
    PyThreadState *ts;
    PyObject *on_output; /* streamed output goes here (NULL: kept for the result) */
} native_call;

/* Between waits (the C core calls it with the GIL released): take the GIL,
 * hand over output, notice Ctrl-C. Non-zero stops the call. */
static int py_slice(void *ud, cos_exec_out *xo)
{
    native_call *nc = ud;
    int stop = 0;
    PyEval_RestoreThread(nc->ts);
    if (xo != NULL && nc->on_output != NULL && deliver(nc->on_output, xo) < 0)
        stop = 1;
    if (!stop && PyErr_CheckSignals() < 0)
        stop = 1;
    nc->ts = PyEval_SaveThread();
    return stop;
}

/* Ready a call on this client: 0, or -1 with an exception (closed, not initialised). */
static int call_start(native_call *nc, ClientObject *self, PyObject *on_output)
{
    memset(nc, 0, sizeof *nc);
    nc->self = self;
    nc->on_output = on_output;
    nc->ctx.eng = engine_of(self);
    nc->ctx.cfg = &self->cfg;
    nc->ctx.slice = py_slice;
    nc->ctx.ud = nc;
    nc->ctx.err = &nc->err;
    nc->ctx.live_output = on_output != NULL;
    nc->ctx.watch_signals = cos_on_main_thread(); /* only there does Python run handlers */
    return nc->ctx.eng != NULL ? 0 : -1;
}

/* The GIL goes while the C core runs the call (nc->ctx) ... */
static void call_release(native_call *nc)
{
    nc->ts = PyEval_SaveThread();
}

/* ... and comes back with its outcome rc: 0, or -1 with the exception set
 * (KeyboardInterrupt or on_output's own when interrupted, else the core's). */
static int call_finish(native_call *nc, int rc)
{
    PyEval_RestoreThread(nc->ts);
    if (nc->ctx.aborted) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "native call interrupted");
        return -1;
    }
    if (rc < 0) {
        cos_raise(state_of((PyObject *)nc->self), &nc->err);
        return -1;
    }
    return 0;
}

/* call_finish, then the operation's JSON (taken) as a Python value, the key redacted
 * wherever the server echoed it (whoami, a view, a list row). */
static PyObject *json_outcome(native_call *nc, int rc, json_t *out)
{
    PyObject *result = call_finish(nc, rc) == 0 ? cos_json_to_py(out, nc->ctx.cfg->key) : NULL;
    json_decref(out);
    return result;
}

static int parse_timeout(PyObject *o, const char *what, long *ms, int allow_none)
{
    double t;
    if (o == NULL || o == Py_None) {
        if (allow_none)
            return 0;
        PyErr_Format(PyExc_TypeError, "%s is required", what);
        return -1;
    }
    t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(t) || t <= 0 || t > 30.0 * 86400.0) {
        PyErr_Format(PyExc_ValueError, "%s must be a positive number of seconds (at most 30 days)",
                     what);
        return -1;
    }
    *ms = (long)ceil(t * 1000.0);
    return 0;
}

/* A str argument without NUL bytes; sandbox ids also bounded and non-empty. */
static const char *arg_cstr(PyObject *o, const char *what, size_t maxlen)
{
    Py_ssize_t n;
    const char *s;
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be str", what);
        return NULL;
    }
    if ((s = PyUnicode_AsUTF8AndSize(o, &n)) == NULL)
        return NULL;
    if ((size_t)n != strlen(s) || n == 0 || (maxlen && (size_t)n >= maxlen)) {
        PyErr_Format(PyExc_ValueError, "%s must be a non-empty string without NUL bytes%s", what,
                     maxlen ? " (and short)" : "");
        return NULL;
    }
    return s;
}

#if COS_CA_PROBE
/* The self-contained wheel's libcurl knows one CA bundle path, Debian's; the
 * distributions its glibc 2.28 baseline covers keep the system bundle in one
 * of these (the first readable one wins; SSL_CERT_FILE and CURL_CA_BUNDLE come
 * first). When none is readable, libcurl's default stays: Debian's file and
 * /etc/ssl/certs. */
static const char *const ca_bundles[] = {
    "/etc/ssl/certs/ca-certificates.crt",                /* Debian, Ubuntu, Arch, Gentoo */
    "/etc/pki/tls/certs/ca-bundle.crt",                  /* RHEL, CentOS, Fedora, Amazon Linux */
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", /* RHEL/Fedora: what the above links to */
    "/etc/ssl/ca-bundle.pem",                            /* openSUSE, SLES */
    "/etc/pki/tls/cacert.pem",                           /* OpenELEC */
    "/etc/ssl/cert.pem",                                 /* Alpine, Void */
};

static const char *ca_probe(void)
{
    size_t i;
    for (i = 0; i < sizeof ca_bundles / sizeof ca_bundles[0]; i++)
        if (access(ca_bundles[i], R_OK) == 0)
            return ca_bundles[i];
    return NULL;
}
#endif

static PyObject *client_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    ClientObject *self = (ClientObject *)cos_alloc(tp);
    (void)args;
    (void)kwds;
    return (PyObject *)self;
}

static void free_cfg(cos_cfg *cfg)
{
    free(cfg->base);
    if (cfg->key) {
        cos_wipe(cfg->key, strlen(cfg->key));
        free(cfg->key);
    }
    free(cfg->user_agent);
    free(cfg->ca_file);
    memset(cfg, 0, sizeof *cfg);
}

static int track(ClientObject *self)
{
    cos_state *st = state_of((PyObject *)self);
    PyObject *ref, *live;
    Py_ssize_t i;
    if ((live = PyList_New(0)) == NULL)
        return -1;
    for (i = 0; i < COS_LIST_SIZE(st->clients); i++) {
        PyObject *r = COS_LIST_ITEM(st->clients, i), *obj = PyObject_CallNoArgs(r);
        int dead = obj == Py_None;
        Py_XDECREF(obj);
        if (obj == NULL || (!dead && PyList_Append(live, r) < 0))
            goto error;
    }
    if ((ref = PyWeakref_NewRef((PyObject *)self, NULL)) == NULL)
        goto error;
    if (PyList_Append(live, ref) < 0) {
        Py_DECREF(ref);
        goto error;
    }
    Py_DECREF(ref);
    ref = st->clients;
    st->clients = live;
    Py_DECREF(ref);
    return 0;
error:
    Py_DECREF(live);
    return -1;
}

static int client_init(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"base_url",        "api_key",    "connect_timeout",
                         "control_timeout", "user_agent", NULL};
    PyObject *url_o, *key_o, *ct = NULL, *cto = NULL, *ua_o = Py_None;
    const char *url, *key, *ua = NULL, *ca;
    Py_ssize_t url_len = 0, key_len = 0;
    long connect_ms = 10000, control_ms = 60000;
    char default_ua[128];
    cos_err err;

    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UU|$OOO", kw, &url_o, &key_o, &ct, &cto, &ua_o))
        return -1;
    if (parse_timeout(ct, "connect_timeout", &connect_ms, 1) < 0 ||
        parse_timeout(cto, "control_timeout", &control_ms, 1) < 0)
        return -1;
    cos_err_clear(&err);
    url = PyUnicode_AsUTF8AndSize(url_o, &url_len);
    key = url ? PyUnicode_AsUTF8AndSize(key_o, &key_len) : NULL;
    if (url == NULL || key == NULL || strlen(url) != (size_t)url_len ||
        strlen(key) != (size_t)key_len) {
        /* neither the key nor the URL is quoted in the error */
        PyErr_Clear();
        cos_err_set(&err, COS_E_CONFIG,
                    "the base URL (CREATEOS_SANDBOX_BASE_URL) and the API key must be text without "
                    "NUL characters");
        goto config_error;
    }
    if (cos_check_key(key, &err) < 0 || cos_check_base_url(url, &self->cfg.base, &err) < 0)
        goto config_error;
    if (ua_o != Py_None) {
        if ((ua = arg_cstr(ua_o, "user_agent", 256)) == NULL)
            goto error;
        for (const char *p = ua; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7F) {
                PyErr_SetString(PyExc_ValueError, "user_agent must be printable ASCII");
                goto error;
            }
    } else {
        snprintf(default_ua, sizeof default_ua, "langflow-sandbox-createos/" COS_VERSION " libcurl/%s",
                 curl_version_info(CURLVERSION_NOW)->version);
        ua = default_ua;
    }
    ca = getenv("SSL_CERT_FILE");
    if (ca == NULL || ca[0] == '\0')
        ca = getenv("CURL_CA_BUNDLE");
#if COS_CA_PROBE
    if (ca == NULL || ca[0] == '\0')
        ca = ca_probe();
#endif
    self->cfg.key = strdup(key);
    self->cfg.user_agent = strdup(ua);
    self->cfg.ca_file = ca && ca[0] ? strdup(ca) : NULL;
    self->cfg.plain_http = strncmp(self->cfg.base, "http://", 7) == 0;
    self->cfg.connect_ms = connect_ms;
    self->cfg.control_ms = control_ms;
    if (!self->cfg.key || !self->cfg.user_agent || (ca && ca[0] && !self->cfg.ca_file)) {
        PyErr_NoMemory();
        goto error;
    }
    if ((self->eng = cos_engine_new(&err)) == NULL) {
        cos_raise(state_of((PyObject *)self), &err);
        goto error;
    }
    if ((self->base_url = PyUnicode_FromString(self->cfg.base)) == NULL || track(self) < 0)
        goto error;
    self->ready = 1;
    return 0;
config_error:
    cos_raise(state_of((PyObject *)self), &err);
error:
    /* nothing half-made stays: the object is unusable, or __init__ may run again */
    if (self->eng != NULL) {
        cos_engine_free(self->eng); /* never started: no thread to join */
        self->eng = NULL;
    }
    free_cfg(&self->cfg);
    Py_CLEAR(self->base_url);
    return -1;
}

static void client_close_engine(ClientObject *self)
{
    cos_engine *e = self->eng;
    self->eng = NULL;
    if (e == NULL)
        return;
    if (!cos_engine_forked(e)) {
        Py_BEGIN_ALLOW_THREADS
        cos_engine_free(e); /* waits for background deletes (each bounded) */
        Py_END_ALLOW_THREADS
    }
}

static int client_traverse(ClientObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->base_url);
    return 0;
}

static int client_clear(ClientObject *self)
{
    Py_CLEAR(self->base_url);
    return 0;
}

static void client_dealloc(ClientObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    client_close_engine(self);
    free_cfg(&self->cfg);
    client_clear(self);
    cos_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *client_repr(ClientObject *self)
{
    return PyUnicode_FromFormat("<createos Client base_url=%R%s>",
                                self->base_url ? self->base_url : Py_None,
                                self->closed ? " closed" : "");
}

/* Strings parsed from keyword arguments are used without the GIL. The kwargs
 * dict may be the caller's own (PyObject_Call passes it through), which
 * another thread could change during the call: the methods that keep such
 * strings parse from a copy, which holds a reference on every value until the
 * call returns. */
typedef PyObject *(*kw_method)(ClientObject *, PyObject *, PyObject *);

static PyObject *with_own_kwds(kw_method impl, ClientObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *own = NULL, *result = NULL;
    if (kwds == NULL || (own = PyDict_Copy(kwds)) != NULL)
        result = impl(self, args, own);
    Py_XDECREF(own);
    return result;
}

/* A mapping argument as a JSON object (None refused); NULL with an exception. */
static json_t *arg_mapping(PyObject *o, const char *what)
{
    int ok;
    json_t *j = cos_arg_json(o, 1, what, &ok);
    if (ok && j == NULL)
        PyErr_Format(PyExc_TypeError, "%s must be a mapping", what);
    return j;
}

/* ------------------------------------------------------------- operations */

typedef int (*op_plain)(cos_ctx *, json_t **);
typedef int (*op_id)(cos_ctx *, const char *, json_t **);

static PyObject *run_plain(ClientObject *self, op_plain fn)
{
    native_call nc;
    json_t *out = NULL;
    int rc;
    if (call_start(&nc, self, NULL) < 0)
        return NULL;
    call_release(&nc);
    rc = fn(&nc.ctx, &out);
    return json_outcome(&nc, rc, out);
}

static PyObject *run_id(ClientObject *self, PyObject *id_o, op_id fn)
{
    native_call nc;
    json_t *out = NULL;
    const char *id;
    int rc;
    if ((id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL || call_start(&nc, self, NULL) < 0)
        return NULL;
    call_release(&nc);
    rc = fn(&nc.ctx, id, &out);
    return json_outcome(&nc, rc, out);
}

static PyObject *c_whoami(ClientObject *self, PyObject *unused)
{
    (void)unused;
    return run_plain(self, cos_op_whoami);
}

static PyObject *c_shapes(ClientObject *self, PyObject *unused)
{
    (void)unused;
    return run_plain(self, cos_op_shapes);
}

static PyObject *c_rootfs(ClientObject *self, PyObject *unused)
{
    (void)unused;
    return run_plain(self, cos_op_rootfs);
}

static PyObject *c_get(ClientObject *self, PyObject *id)
{
    return run_id(self, id, cos_op_get);
}

static PyObject *c_delete(ClientObject *self, PyObject *id)
{
    return run_id(self, id, cos_op_delete);
}

static PyObject *c_pause(ClientObject *self, PyObject *id)
{
    return run_id(self, id, cos_op_pause);
}

static PyObject *c_get_egress(ClientObject *self, PyObject *id)
{
    return run_id(self, id, cos_op_get_egress);
}

static PyObject *c_create(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"spec", "timeout", NULL};
    PyObject *spec_o, *timeout_o = Py_None, *result = NULL;
    json_t *spec = NULL, *out = NULL;
    long timeout_ms = 0;
    native_call nc;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O", kw, &spec_o, &timeout_o) ||
        parse_timeout(timeout_o, "timeout", &timeout_ms, 1) < 0 ||
        (spec = arg_mapping(spec_o, "spec")) == NULL || call_start(&nc, self, NULL) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_create(&nc.ctx, spec, timeout_ms, &out);
    result = json_outcome(&nc, rc, out);
done:
    json_decref(spec);
    return result;
}

static PyObject *list_impl(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"prefix", "status", NULL};
    PyObject *prefix_o = Py_None, *status_o = Py_None;
    const char *prefix = NULL, *status = NULL;
    json_t *out = NULL;
    native_call nc;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OO", kw, &prefix_o, &status_o) ||
        (prefix_o != Py_None && (prefix = arg_cstr(prefix_o, "prefix", 0)) == NULL) ||
        (status_o != Py_None && (status = arg_cstr(status_o, "status", 64)) == NULL) ||
        call_start(&nc, self, NULL) < 0)
        return NULL;
    call_release(&nc);
    rc = cos_op_list(&nc.ctx, prefix, status, &out);
    return json_outcome(&nc, rc, out);
}

static PyObject *c_list(ClientObject *self, PyObject *args, PyObject *kwds)
{
    return with_own_kwds(list_impl, self, args, kwds);
}

static PyObject *resume_impl(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"sandbox_id", "wait", NULL};
    PyObject *id_o, *wait_o = Py_None;
    const char *id;
    long wait_ms = -1;
    json_t *out = NULL;
    native_call nc;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$O", kw, &id_o, &wait_o) ||
        (id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL ||
        parse_timeout(wait_o, "wait", &wait_ms, 1) < 0 || call_start(&nc, self, NULL) < 0)
        return NULL;
    call_release(&nc);
    rc = cos_op_resume(&nc.ctx, id, wait_ms, &out);
    return json_outcome(&nc, rc, out);
}

static PyObject *c_resume(ClientObject *self, PyObject *args, PyObject *kwds)
{
    return with_own_kwds(resume_impl, self, args, kwds);
}

static PyObject *fork_impl(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"sandbox_id", "spec", NULL};
    PyObject *id_o, *spec_o = Py_None, *result = NULL;
    const char *id;
    json_t *spec = NULL, *out = NULL;
    native_call nc;
    int ok, rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kw, &id_o, &spec_o) ||
        (id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL)
        goto done;
    spec = cos_arg_json(spec_o, 1, "spec", &ok); /* None: an empty spec */
    if (!ok || call_start(&nc, self, NULL) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_fork(&nc.ctx, id, spec, &out);
    result = json_outcome(&nc, rc, out);
done:
    json_decref(spec);
    return result;
}

static PyObject *c_fork(ClientObject *self, PyObject *args, PyObject *kwds)
{
    return with_own_kwds(fork_impl, self, args, kwds);
}

static PyObject *c_patch(ClientObject *self, PyObject *args)
{
    PyObject *id_o, *fields_o, *result = NULL;
    const char *id;
    json_t *fields = NULL, *out = NULL;
    native_call nc;
    int rc;

    if (!PyArg_ParseTuple(args, "OO", &id_o, &fields_o) ||
        (id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL ||
        (fields = arg_mapping(fields_o, "fields")) == NULL || call_start(&nc, self, NULL) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_patch(&nc.ctx, id, fields, &out);
    result = json_outcome(&nc, rc, out);
done:
    json_decref(fields);
    return result;
}

static PyObject *c_put_egress(ClientObject *self, PyObject *args)
{
    PyObject *id_o, *rules_o, *result = NULL;
    const char *id;
    json_t *rules = NULL, *out = NULL;
    native_call nc;
    int ok = 0, rc;

    if (!PyArg_ParseTuple(args, "OO", &id_o, &rules_o) ||
        (id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL)
        goto done;
    if (PyUnicode_Check(rules_o)) {
        PyErr_SetString(PyExc_TypeError, "rules must be a sequence of str or None, not str");
        goto done;
    }
    rules = cos_arg_str_list(rules_o, "rules", &ok); /* None: no rules */
    if (!ok || call_start(&nc, self, NULL) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_put_egress(&nc.ctx, id, rules, &out);
    result = json_outcome(&nc, rc, out);
done:
    json_decref(rules);
    return result;
}

static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
                            : "of an unknown type";
}

/* The file to stream, opened for reading without ever freezing the interpreter:
 * the open runs with the GIL released, and with O_NONBLOCK, so a FIFO without a
 * writer (or a device) cannot block it; what is not a regular file (a streamed
 * upload declares its size) is refused before any read. NULL with OSError set,
 * naming the file. */
static FILE *open_regular_file(const char *path, PyObject *name, long long *size)
{
    struct stat st;
    FILE *fp = NULL;
    PyObject *msg = NULL, *exc = NULL;
    int fd, flags, err = 0;

    Py_BEGIN_ALLOW_THREADS
    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0)
        err = errno;
    else if (S_ISREG(st.st_mode) &&
             ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 ||
              (fp = fdopen(fd, "rb")) == NULL))
        err = errno;
    if (fp == NULL && fd >= 0)
        close(fd);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, name);
    } else if (fp == NULL) {
        msg = PyUnicode_FromFormat(
            "not a regular file (it is %s): upload(file=) streams regular files only",
            file_kind(st.st_mode));
        if (msg != NULL)
            exc = PyObject_CallFunction(PyExc_OSError, "iOO", S_ISDIR(st.st_mode) ? EISDIR : EINVAL,
                                        msg, name);
        if (exc != NULL)
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    } else {
        *size = (long long)st.st_size;
    }
    Py_XDECREF(msg);
    Py_XDECREF(exc);
    return fp;
}

static PyObject *upload_impl(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"sandbox_id", "path", "data", "file", NULL};
    PyObject *id_o, *path_o, *data_o = Py_None, *file_o = Py_None, *fspath = NULL, *result = NULL;
    const char *id, *path;
#if COS_HAVE_BUFFER_API
    Py_buffer buf = {0};
#else
    struct {
        char *buf;
        Py_ssize_t len;
        PyObject *obj; /* bytes: the caller's own, or a copy of another bytes-like object */
    } buf = {0};
    PyObject *view;
#endif
    FILE *fp = NULL;
    long long size = 0;
    native_call nc;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O$O", kw, &id_o, &path_o, &data_o, &file_o) ||
        (id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL ||
        (path = arg_cstr(path_o, "path", 4096)) == NULL)
        goto done;
    if ((data_o == Py_None) == (file_o == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "upload needs exactly one of data= or file=");
        goto done;
    }
    if (data_o != Py_None) {
#if COS_HAVE_BUFFER_API
        if (PyObject_GetBuffer(data_o, &buf, PyBUF_SIMPLE) < 0)
            goto done;
#else
        /* what PyObject_GetBuffer accepts, as memoryview() does; not bytes: copied */
        if (PyBytes_Check(data_o)) {
            buf.obj = Py_NewRef(data_o);
        } else if ((view = PyMemoryView_FromObject(data_o)) != NULL) {
            buf.obj = PyBytes_FromObject(view);
            Py_DECREF(view);
        }
        if (buf.obj == NULL || PyBytes_AsStringAndSize(buf.obj, &buf.buf, &buf.len) < 0)
            goto done;
#endif
    } else if (!PyUnicode_FSConverter(file_o, &fspath) ||
               (fp = open_regular_file(COS_BYTES_DATA(fspath), file_o, &size)) == NULL) {
        goto done;
    }
    if (call_start(&nc, self, NULL) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_upload(&nc.ctx, id, path, buf.buf, (size_t)buf.len, fp, size);
    if (call_finish(&nc, rc) == 0)
        result = Py_NewRef(Py_None);
done:
#if COS_HAVE_BUFFER_API
    if (buf.obj)
        PyBuffer_Release(&buf);
#else
    Py_XDECREF(buf.obj);
#endif
    if (fp)
        fclose(fp);
    Py_XDECREF(fspath);
    return result;
}

static PyObject *c_upload(ClientObject *self, PyObject *args, PyObject *kwds)
{
    return with_own_kwds(upload_impl, self, args, kwds);
}

static PyObject *download_impl(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"sandbox_id", "path", "max_bytes", NULL};
    PyObject *id_o, *path_o, *result = NULL;
    const char *id, *path;
    Py_ssize_t max_bytes;
    cos_buf out = {0};
    native_call nc;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO$n", kw, &id_o, &path_o, &max_bytes) ||
        (id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL ||
        (path = arg_cstr(path_o, "path", 4096)) == NULL)
        goto done;
    if (max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must be >= 0");
        goto done;
    }
    if (call_start(&nc, self, NULL) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_download(&nc.ctx, id, path, (size_t)max_bytes, &out);
    if (call_finish(&nc, rc) == 0)
        result = PyBytes_FromStringAndSize(out.data ? out.data : "", (Py_ssize_t)out.len);
done:
    cos_buf_free(&out);
    return result;
}

static PyObject *c_download(ClientObject *self, PyObject *args, PyObject *kwds)
{
    return with_own_kwds(download_impl, self, args, kwds);
}

/* Shared by exec and run_program: everything the exec request needs. */
typedef struct {
    cos_exec_args a;
    Py_ssize_t max_output;
    PyObject *on_output;
} exec_params;

static int parse_exec_common(exec_params *p, PyObject *cmd_o, PyObject *args_o, PyObject *stdin_o,
                             PyObject *env_o, PyObject *timeout_o, Py_ssize_t max_output,
                             PyObject *on_output)
{
    int ok;
    memset(p, 0, sizeof *p);
    if ((p->a.cmd = arg_cstr(cmd_o, "cmd", 0)) == NULL ||
        parse_timeout(timeout_o, "timeout", &p->a.timeout_ms, 0) < 0)
        return -1;
    if (stdin_o != NULL && stdin_o != Py_None) {
        Py_ssize_t n;
        if (!PyUnicode_Check(stdin_o)) {
            PyErr_SetString(PyExc_TypeError, "stdin must be str or None");
            return -1;
        }
        if ((p->a.stdin_data = PyUnicode_AsUTF8AndSize(stdin_o, &n)) == NULL)
            return -1;
        p->a.stdin_len = (size_t)n; /* NUL bytes included */
    }
    if (max_output < 0 || (size_t)max_output > COS_MAX_OUTPUT_LIMIT) {
        PyErr_Format(PyExc_ValueError, "max_output_bytes must be between 0 and %zu (1 GiB)",
                     COS_MAX_OUTPUT_LIMIT);
        return -1;
    }
    if (on_output != NULL && on_output != Py_None && !PyCallable_Check(on_output)) {
        PyErr_SetString(PyExc_TypeError, "on_output must be callable or None");
        return -1;
    }
    if (args_o != NULL && PyUnicode_Check(args_o)) {
        PyErr_SetString(PyExc_TypeError, "args must be a sequence of str, not str");
        return -1;
    }
    p->max_output = max_output;
    p->on_output = on_output == Py_None ? NULL : on_output;
    p->a.args = cos_arg_str_list(args_o, "args", &ok);
    if (!ok)
        return -1;
    p->a.env = cos_arg_json(env_o, 1, "env", &ok);
    if (!ok) {
        json_decref(p->a.args);
        return -1;
    }
    return 0;
}

static void free_exec_params(exec_params *p)
{
    json_decref(p->a.args);
    json_decref(p->a.env);
}

/* The output not yet handed to on_output goes now, then the result. */
static PyObject *finish_exec(ClientObject *self, exec_params *p, cos_exec_out *xo, const char *sid)
{
    if (p->on_output != NULL && deliver(p->on_output, xo) < 0)
        return NULL;
    return cos_make_result(state_of((PyObject *)self), xo, sid);
}

static PyObject *exec_impl(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"sandbox_id",       "cmd",    "args",      "stdin", "env", "timeout",
                         "max_output_bytes", "stream", "on_output", NULL};
    PyObject *id_o, *cmd_o, *args_o = NULL, *stdin_o = Py_None, *env_o = Py_None, *timeout_o = NULL,
                            *on_output = Py_None, *result = NULL;
    Py_ssize_t max_output = (Py_ssize_t)COS_DEFAULT_MAX_OUTPUT;
    int stream = 1, rc, have_params = 0, have_xo = 0;
    const char *id;
    exec_params p;
    cos_exec_out xo;
    native_call nc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O$OOOnpO", kw, &id_o, &cmd_o, &args_o,
                                     &stdin_o, &env_o, &timeout_o, &max_output, &stream,
                                     &on_output) ||
        (id = arg_cstr(id_o, "sandbox_id", COS_ID_MAX)) == NULL ||
        parse_exec_common(&p, cmd_o, args_o, stdin_o, env_o, timeout_o, max_output, on_output) < 0)
        goto done;
    have_params = 1;
    p.a.stream = stream;
    if (cos_exec_out_init(&xo, (size_t)p.max_output) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    have_xo = 1;
    if (call_start(&nc, self, p.on_output) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_exec(&nc.ctx, id, &p.a, &xo);
    if (call_finish(&nc, rc) == 0)
        result = finish_exec(self, &p, &xo, NULL);
done:
    if (have_xo)
        cos_exec_out_free(&xo);
    if (have_params)
        free_exec_params(&p);
    return result;
}

static PyObject *c_exec(ClientObject *self, PyObject *args, PyObject *kwds)
{
    return with_own_kwds(exec_impl, self, args, kwds);
}

/* run_program's files=: a tuple we own holds every (path, data) pair, and each
 * pair (immutable) its str and bytes, for the whole call; the caller's own
 * list may be cleared by another thread while the GIL is released. 0, or -1
 * with an exception. */
static int parse_files(PyObject *files_o, PyObject **snapshot, cos_file **files, Py_ssize_t *nfiles)
{
    Py_ssize_t i;
    if (PyUnicode_Check(files_o) || PyBytes_Check(files_o) || PyByteArray_Check(files_o))
        goto type_error;
    if ((*snapshot = PySequence_Tuple(files_o)) == NULL)
        return -1;
    *nfiles = COS_TUPLE_SIZE(*snapshot);
    if (*nfiles > 0 && (*files = PyMem_Calloc((size_t)*nfiles, sizeof **files)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < *nfiles; i++) {
        PyObject *item = COS_TUPLE_ITEM(*snapshot, i);
        char *data;
        Py_ssize_t len;
        if (!PyTuple_Check(item) || COS_TUPLE_SIZE(item) != 2 ||
            !PyBytes_Check(COS_TUPLE_ITEM(item, 1)))
            goto type_error;
        if (((*files)[i].path = arg_cstr(COS_TUPLE_ITEM(item, 0), "file path", 4096)) == NULL ||
            PyBytes_AsStringAndSize(COS_TUPLE_ITEM(item, 1), &data, &len) < 0)
            return -1;
        (*files)[i].data = data; /* immutable bytes, kept alive by the snapshot */
        (*files)[i].len = (size_t)len;
    }
    return 0;
type_error:
    PyErr_SetString(PyExc_TypeError, "files must be a sequence of (path: str, data: bytes)");
    return -1;
}

static PyObject *run_program_impl(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {
        "create",           "cmd",       "args",   "files",      "stdin", "timeout",
        "max_output_bytes", "on_output", "delete", "sandbox_id", "env",   NULL};
    PyObject *create_o, *cmd_o, *args_o = NULL, *files_o = NULL, *stdin_o = Py_None,
                                *timeout_o = NULL, *on_output = Py_None, *sid_o = Py_None,
                                *env_o = Py_None, *snapshot = NULL, *result = NULL;
    const char *delete_mode = "wait", *adopt = NULL;
    Py_ssize_t max_output = (Py_ssize_t)COS_DEFAULT_MAX_OUTPUT, nfiles = 0;
    cos_file *files = NULL;
    json_t *spec = NULL;
    exec_params p;
    cos_exec_out xo;
    native_call nc;
    char sid[COS_ID_MAX];
    int rc, have_params = 0, have_xo = 0;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O$OOOnOsOO", kw, &create_o, &cmd_o, &args_o,
                                     &files_o, &stdin_o, &timeout_o, &max_output, &on_output,
                                     &delete_mode, &sid_o, &env_o))
        goto done;
    if (strcmp(delete_mode, "wait") != 0 && strcmp(delete_mode, "background") != 0) {
        PyErr_SetString(PyExc_ValueError, "delete must be \"wait\" or \"background\"");
        goto done;
    }
    if ((sid_o != Py_None && (adopt = arg_cstr(sid_o, "sandbox_id", COS_ID_MAX)) == NULL) ||
        parse_exec_common(&p, cmd_o, args_o, stdin_o, env_o, timeout_o, max_output, on_output) < 0)
        goto done;
    have_params = 1;
    p.a.stream = 1;
    if ((adopt == NULL && (spec = arg_mapping(create_o, "create")) == NULL) ||
        (files_o != NULL && parse_files(files_o, &snapshot, &files, &nfiles) < 0))
        goto done;
    if (cos_exec_out_init(&xo, (size_t)p.max_output) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    have_xo = 1;
    if (call_start(&nc, self, p.on_output) < 0)
        goto done;
    call_release(&nc);
    rc = cos_op_run_program(&nc.ctx, spec, adopt, files, (size_t)nfiles, &p.a,
                            delete_mode[0] == 'b', &xo, sid);
    if (call_finish(&nc, rc) == 0)
        result = finish_exec(self, &p, &xo, sid);
done:
    if (have_xo)
        cos_exec_out_free(&xo);
    if (have_params)
        free_exec_params(&p);
    json_decref(spec);
    PyMem_Free(files);
    Py_XDECREF(snapshot);
    return result;
}

static PyObject *c_run_program(ClientObject *self, PyObject *args, PyObject *kwds)
{
    return with_own_kwds(run_program_impl, self, args, kwds);
}

/* One background-delete outcome as (sandbox_id, status or None, error or None).
 * Decoded with "replace": whatever the bytes, no outcome is lost. */
static PyObject *outcome_tuple(const cos_outcome *o)
{
    PyObject *id = cos_decode(o->id, strlen(o->id)),
             *status = o->status > 0 ? PyLong_FromLong(o->status) : Py_NewRef(Py_None),
             *error = o->error ? cos_decode(o->error, strlen(o->error)) : Py_NewRef(Py_None),
             *t = NULL;
    if (id != NULL && status != NULL && error != NULL)
        t = PyTuple_Pack(3, id, status, error);
    Py_XDECREF(id);
    Py_XDECREF(status);
    Py_XDECREF(error);
    return t;
}

static PyObject *c_drain_deletes(ClientObject *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"timeout", NULL};
    double timeout = 0.0, end;
    cos_outcome *all = NULL, *o;
    PyObject *list = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|d", kw, &timeout))
        goto done;
    if (self->eng == NULL) { /* closed; a forked child's engine reports no outcome */
        list = PyList_New(0);
        goto done;
    }
    end = cos_now_ms() + (isfinite(timeout) && timeout > 0 ? timeout * 1000.0 : 0);
    for (;;) {
        size_t pending;
        double left = end - cos_now_ms();
        Py_BEGIN_ALLOW_THREADS
        pending = cos_engine_wait_deletes(self->eng, left < COS_SLICE_MS ? left : COS_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (pending == 0 || cos_now_ms() >= end)
            break;
        if (PyErr_CheckSignals() < 0)
            goto done;
    }
    all = cos_engine_take_outcomes(self->eng);
    if ((list = PyList_New(0)) == NULL)
        goto done;
    for (o = all; o != NULL; o = o->next) {
        PyObject *t = outcome_tuple(o);
        int appended = t != NULL && PyList_Append(list, t) == 0;
        Py_XDECREF(t);
        if (!appended) {
            Py_CLEAR(list);
            goto done;
        }
    }
done:
    cos_outcomes_free(all);
    return list;
}

static PyObject *c_pending_deletes(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (self->eng == NULL) /* closed; a forked child's engine has none pending */
        return PyLong_FromLong(0);
    return PyLong_FromSize_t(cos_engine_pending_deletes(self->eng));
}

/* d[name] = value; -1 with an exception set */
static int set_count(PyObject *d, const char *name, unsigned long long value)
{
    PyObject *n = PyLong_FromUnsignedLongLong(value);
    int rc = n == NULL ? -1 : PyDict_SetItemString(d, name, n);
    Py_XDECREF(n);
    return rc;
}

static PyObject *c_stats(ClientObject *self, PyObject *unused)
{
    uint64_t v[COS_STAT_COUNT] = {0};
    size_t pending = 0;
    PyObject *d = PyDict_New();
    int i;
    (void)unused;
    if (d == NULL)
        goto fail;
    if (self->eng != NULL) { /* a forked child's engine counts zero */
        cos_engine_stats(self->eng, v);
        pending = cos_engine_pending_deletes(self->eng);
    }
    for (i = 0; i < COS_STAT_COUNT; i++)
        if (set_count(d, cos_stat_names[i], v[i]) < 0)
            goto fail;
    if (self->eng != NULL && set_count(d, "pending_deletes", pending) < 0)
        goto fail;
    return d;
fail:
    Py_XDECREF(d);
    return NULL;
}

static PyObject *c_close(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (self->closed)
        Py_RETURN_NONE;
    self->closed = 1;
    if (self->eng != NULL && !cos_engine_forked(self->eng)) {
        cos_engine *e = self->eng;
        /* the struct stays until dealloc: other threads may still be inside a call */
        Py_BEGIN_ALLOW_THREADS
        cos_engine_close(e);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *c_enter(ClientObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *c_exit(ClientObject *self, PyObject *args)
{
    (void)args;
    return c_close(self, NULL);
}

static PyMethodDef client_methods[] = {
    {"whoami", (PyCFunction)c_whoami, METH_NOARGS, "GET /v1/whoami"},
    {"shapes", (PyCFunction)c_shapes, METH_NOARGS, "Every shape, all pages."},
    {"rootfs", (PyCFunction)c_rootfs, METH_NOARGS, "GET /v1/rootfs"},
    {"create", (PyCFunction)(void (*)(void))c_create, METH_VARARGS | METH_KEYWORDS,
     "Create a sandbox."},
    {"get", (PyCFunction)c_get, METH_O, "The view of one sandbox."},
    {"list", (PyCFunction)(void (*)(void))c_list, METH_VARARGS | METH_KEYWORDS,
     "Every sandbox, all pages, filtered by name prefix and status."},
    {"delete", (PyCFunction)c_delete, METH_O, "Delete a sandbox."},
    {"pause", (PyCFunction)c_pause, METH_O, "Pause a sandbox."},
    {"resume", (PyCFunction)(void (*)(void))c_resume, METH_VARARGS | METH_KEYWORDS,
     "Resume; with wait=seconds, poll until running."},
    {"fork", (PyCFunction)(void (*)(void))c_fork, METH_VARARGS | METH_KEYWORDS,
     "Fork a paused sandbox."},
    {"patch", (PyCFunction)c_patch, METH_VARARGS, "PATCH a sandbox."},
    {"get_egress", (PyCFunction)c_get_egress, METH_O, "The egress allowlist."},
    {"put_egress", (PyCFunction)c_put_egress, METH_VARARGS, "Replace the egress allowlist."},
    {"upload", (PyCFunction)(void (*)(void))c_upload, METH_VARARGS | METH_KEYWORDS,
     "Upload bytes, or a file streamed from disk."},
    {"download", (PyCFunction)(void (*)(void))c_download, METH_VARARGS | METH_KEYWORDS,
     "Download a file, refusing more than max_bytes."},
    {"exec", (PyCFunction)(void (*)(void))c_exec, METH_VARARGS | METH_KEYWORDS, "Run a command."},
    {"run_program", (PyCFunction)(void (*)(void))c_run_program, METH_VARARGS | METH_KEYWORDS,
     "create -> upload -> exec -> delete, in C."},
    {"drain_deletes", (PyCFunction)(void (*)(void))c_drain_deletes, METH_VARARGS | METH_KEYWORDS,
     "Outcomes of background deletes."},
    {"pending_deletes", (PyCFunction)c_pending_deletes, METH_NOARGS,
     "Background deletes in flight."},
    {"stats", (PyCFunction)c_stats, METH_NOARGS, "Counters."},
    {"close", (PyCFunction)c_close, METH_NOARGS,
     "Stop the client (background deletes finish first)."},
    {"__enter__", (PyCFunction)c_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)c_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject *client_base_url(ClientObject *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->base_url ? self->base_url : Py_None); /* None before __init__ */
}

static PyGetSetDef client_getset[] = {
    {"base_url", (getter)client_base_url, NULL, "The normalised base URL.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef client_members[] = {
    {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(ClientObject, weakreflist), Py_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot client_slots[] = {
    {Py_tp_new, client_new},
    {Py_tp_init, client_init},
    {Py_tp_dealloc, client_dealloc},
    {Py_tp_traverse, client_traverse},
    {Py_tp_clear, client_clear},
    {Py_tp_repr, client_repr},
    {Py_tp_methods, client_methods},
    {Py_tp_members, client_members},
    {Py_tp_getset, client_getset},
    {Py_tp_doc, "Thread-safe CreateOS control-plane client; share one per process."},
    {0, NULL},
};

static PyType_Spec client_spec = {
    .name = "langflow_sandbox_createos._createos.Client",
    .basicsize = sizeof(ClientObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = client_slots,
};

int cos_client_add_types(PyObject *module, cos_state *st)
{
    if (cos_execresult_add_type(module, st) < 0)
        return -1;
    st->ClientType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &client_spec, NULL);
    if (st->ClientType == NULL ||
        PyModule_AddObjectRef(module, "Client", (PyObject *)st->ClientType) < 0)
        return -1;
    return 0;
}
