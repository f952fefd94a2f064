/* Python <-> JSON (jansson) for the binding. Python values are user code:
 * mappings and sequences are snapshotted into tuples we own before any
 * nested conversion runs more user code, items are type-checked pairs,
 * integers range-checked, strings and keys kept whole (NUL included). */
#include "module.h"

#include <math.h>

/* The length of the key at an object iterator. */
static size_t key_len(void *iter)
{
#if COS_HAVE_JSON_KEYLEN
    return json_object_iter_key_len(iter);
#else
    return strlen(json_object_iter_key(iter)); /* no key holds NUL before 2.14 */
#endif
}

/* obj[key[0..len)] = v, v stolen. -1 with an exception set. */
static int set_member(json_t *obj, const char *key, size_t len, json_t *v)
{
#if COS_HAVE_JSON_KEYLEN
    if (json_object_setn_new(obj, key, len, v) == 0)
        return 0;
#else
    if (memchr(key, '\0', len) != NULL) {
        /* refused, never cut at the NUL */
        json_decref(v);
        PyErr_Format(PyExc_ValueError,
                     "a JSON object key holding NUL needs jansson 2.14 or newer (built with %s)",
                     JANSSON_VERSION);
        return -1;
    }
    if (json_object_set_new(obj, key, v) == 0)
        return 0;
#endif
    PyErr_NoMemory(); /* the key is valid UTF-8 (Python's own) */
    return -1;
}

/* A string of the server's answer as str, any run of the key in it redacted. */
static PyObject *server_text(const char *s, size_t n, const char *secret)
{
    cos_buf red = {0};
    PyObject *text = NULL;
    switch (cos_redact(&red, s, n, secret)) {
    case 0:
        text = cos_decode(s, n);
        break;
    case 1:
        text = cos_decode(red.data, red.len);
        break;
    default:
        PyErr_NoMemory();
        break;
    }
    cos_buf_free(&red);
    return text;
}

PyObject *cos_json_to_py(json_t *j, const char *secret)
{
    PyObject *out = NULL, *v;
    void *it;
    json_t *jv;
    size_t i;

    switch (json_typeof(j)) {
    case JSON_OBJECT:
        if ((out = PyDict_New()) == NULL)
            return NULL;
        /* keys by length: with jansson 2.14 a key may hold NUL (\u0000) */
        for (it = json_object_iter(j); it != NULL; it = json_object_iter_next(j, it)) {
            PyObject *key = server_text(json_object_iter_key(it), key_len(it), secret);
            int bad;
            jv = json_object_iter_value(it);
            v = key ? cos_json_to_py(jv, secret) : NULL;
            bad = v == NULL || PyDict_SetItem(out, key, v) < 0;
            Py_XDECREF(key);
            Py_XDECREF(v);
            if (bad) {
                Py_DECREF(out);
                return NULL;
            }
        }
        return out;
    case JSON_ARRAY:
        if ((out = PyList_New((Py_ssize_t)json_array_size(j))) == NULL)
            return NULL;
        json_array_foreach (j, i, jv) {
            if ((v = cos_json_to_py(jv, secret)) == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            COS_LIST_SET(out, (Py_ssize_t)i, v);
        }
        return out;
    case JSON_STRING:
        return server_text(json_string_value(j), json_string_length(j), secret);
    case JSON_INTEGER:
        return PyLong_FromLongLong(json_integer_value(j));
    case JSON_REAL:
        return PyFloat_FromDouble(json_real_value(j));
    case JSON_TRUE:
        Py_RETURN_TRUE;
    case JSON_FALSE:
        Py_RETURN_FALSE;
    default:
        Py_RETURN_NONE;
    }
}

static json_t *py_to_json(PyObject *o, int depth);

/* jansson returns NULL only for want of memory here: say so, as CPython would. */
static json_t *no_memory_if_null(json_t *j)
{
    if (j == NULL)
        PyErr_NoMemory();
    return j;
}

/* A mapping -> JSON object. items() is user code: whatever it returns is
 * snapshotted into a tuple we own (nested conversions run more user code that
 * may mutate the list it returned), and every item must be a (str, value) pair. */
static json_t *mapping_to_json(PyObject *o, int depth)
{
    PyObject *items = PyMapping_Items(o), *snap = NULL;
    json_t *out = NULL;
    Py_ssize_t i, n;

    if (items == NULL)
        goto error;
    if ((snap = PySequence_Tuple(items)) == NULL)
        goto error;
    if ((out = json_object()) == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    n = COS_TUPLE_SIZE(snap);
    for (i = 0; i < n; i++) {
        PyObject *kv = COS_TUPLE_ITEM(snap, i), *key;
        const char *ks;
        Py_ssize_t klen;
        json_t *v;
        if (!PyTuple_Check(kv) || COS_TUPLE_SIZE(kv) != 2) {
            PyObject *mname = cos_type_name(o), *iname = cos_type_name(kv);
            if (mname != NULL && iname != NULL)
                PyErr_Format(PyExc_TypeError,
                             "%.100U.items() must yield (key, value) pairs, got %.100U", mname,
                             iname);
            Py_XDECREF(mname);
            Py_XDECREF(iname);
            goto error;
        }
        key = COS_TUPLE_ITEM(kv, 0);
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "JSON object keys must be str");
            goto error;
        }
        if ((ks = PyUnicode_AsUTF8AndSize(key, &klen)) == NULL ||
            (v = py_to_json(COS_TUPLE_ITEM(kv, 1), depth + 1)) == NULL)
            goto error;
        if (set_member(out, ks, (size_t)klen, v) < 0)
            goto error;
    }
    Py_DECREF(items);
    Py_DECREF(snap);
    return out;
error:
    Py_XDECREF(items);
    Py_XDECREF(snap);
    json_decref(out);
    return NULL;
}

/* A sequence -> JSON array, from a tuple snapshot (a list may be mutated by
 * the user code that nested conversions run). */
static json_t *sequence_to_json(PyObject *o, int depth)
{
    PyObject *snap = PySequence_Tuple(o);
    json_t *out = NULL;
    Py_ssize_t i, n;

    if (snap == NULL)
        return NULL;
    if ((out = json_array()) == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    n = COS_TUPLE_SIZE(snap);
    for (i = 0; i < n; i++) {
        json_t *v = py_to_json(COS_TUPLE_ITEM(snap, i), depth + 1);
        if (v == NULL)
            goto error;
        if (json_array_append_new(out, v) < 0) {
            PyErr_NoMemory();
            goto error;
        }
    }
    Py_DECREF(snap);
    return out;
error:
    Py_DECREF(snap);
    json_decref(out);
    return NULL;
}

/* Python value -> new jansson value; NULL with a Python exception. */
static json_t *py_to_json(PyObject *o, int depth)
{
    Py_ssize_t n;
    PyObject *name;

    if (depth > 64) {
        PyErr_SetString(PyExc_ValueError, "JSON value nested too deeply");
        return NULL;
    }
    if (o == Py_None)
        return json_null();
    if (PyBool_Check(o))
        return json_boolean(o == Py_True);
    if (PyLong_Check(o)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (overflow) {
            PyErr_SetString(PyExc_ValueError, "integer out of the JSON range (64-bit signed)");
            return NULL;
        }
        return no_memory_if_null(json_integer(v));
    }
    if (PyFloat_Check(o)) {
        double d = COS_FLOAT_VALUE(o);
        if (!isfinite(d)) {
            PyErr_SetString(PyExc_ValueError, "NaN and infinity are not JSON");
            return NULL;
        }
        return no_memory_if_null(json_real(d));
    }
    if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8AndSize(o, &n);
        if (s == NULL)
            return NULL;
        /* Python's UTF-8 is valid UTF-8: jansson fails only for want of memory */
        return no_memory_if_null(json_stringn(s, (size_t)n));
    }
    if (PyDict_Check(o) || (PyMapping_Check(o) && !PySequence_Check(o)))
        return mapping_to_json(o, depth);
    if (PyList_Check(o) || PyTuple_Check(o) ||
        (PySequence_Check(o) && !PyBytes_Check(o) && !PyByteArray_Check(o)))
        return sequence_to_json(o, depth);
    if ((name = cos_type_name(o)) != NULL) {
        PyErr_Format(PyExc_TypeError, "%.100U is not JSON-serializable", name);
        Py_DECREF(name);
    }
    return NULL;
}

/* A JSON value of the given kind, or NULL (obj None) — error when *ok is 0. */
json_t *cos_arg_json(PyObject *o, int want_object, const char *what, int *ok)
{
    json_t *j;
    *ok = 1;
    if (o == NULL || o == Py_None)
        return NULL;
    j = py_to_json(o, 0);
    if (j == NULL) {
        *ok = 0;
        return NULL;
    }
    if (want_object ? !json_is_object(j) : !json_is_array(j)) {
        PyErr_Format(PyExc_TypeError, "%s must be a %s", what,
                     want_object ? "mapping" : "sequence");
        json_decref(j);
        *ok = 0;
        return NULL;
    }
    return j;
}

/* A list of strings, as a JSON array (args, egress rules). */
json_t *cos_arg_str_list(PyObject *o, const char *what, int *ok)
{
    json_t *j = cos_arg_json(o, 0, what, ok), *v;
    size_t i;
    if (j == NULL)
        return NULL;
    json_array_foreach (j, i, v) {
        if (!json_is_string(v)) {
            PyErr_Format(PyExc_TypeError, "%s must contain only str", what);
            json_decref(j);
            *ok = 0;
            return NULL;
        }
    }
    return j;
}
