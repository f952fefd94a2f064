#include "envelope.h"

#include <stdio.h>
#include <string.h>

#include "jsonload.h"

static const char *status_reason(long status)
{
    switch (status) {
    case 400:
        return "bad request";
    case 401:
        return "unauthorized (check the API key)";
    case 402:
        return "payment required (no credit)";
    case 403:
        return "forbidden";
    case 404:
        return "not found";
    case 409:
        return "conflict";
    case 422:
        return "unprocessable request";
    case 429:
        return "rate limited";
    case 500:
        return "internal server error";
    case 502:
        return "bad gateway";
    case 503:
        return "service unavailable";
    case 504:
        return "gateway timeout";
    default:
        return status >= 300 && status < 400 ? "redirect refused" : "request failed";
    }
}

/* Fill the fields every response error carries, then the message. */
static void set_response_error(cos_err *err, const char *op, const cos_meta *meta, cos_kind kind,
                               const char *secret, const char *text, size_t text_len)
{
    char rid[COS_ID_MAX];
    char clean[COS_SERVER_TEXT_MAX * 4 + 64];

    err->kind = kind;
    err->status = meta->status;
    err->has_retry_after = meta->has_retry_after;
    err->retry_after = meta->retry_after;
    cos_sanitize(rid, sizeof rid, meta->request_id, strlen(meta->request_id), secret, 120);
    cos_strlcpy(err->request_id, rid, sizeof err->request_id);
    cos_sanitize(clean, sizeof clean, text, text_len, secret, COS_SERVER_TEXT_MAX);
    if (clean[0] == '\0')
        cos_strlcpy(clean, status_reason(meta->status), sizeof clean);
    if (rid[0])
        cos_err_set(err, kind, "%s failed: HTTP %ld (request %s): %s", op, meta->status, rid,
                    clean);
    else
        cos_err_set(err, kind, "%s failed: HTTP %ld: %s", op, meta->status, clean);
}

static void set_protocol_error(cos_err *err, const char *op, const cos_meta *meta,
                               const char *secret, const char *what)
{
    set_response_error(err, op, meta, COS_E_PROTOCOL, secret, what, strlen(what));
}

/* The human part of a fail envelope's data: a string, or the object's
 * message, or its "field: reason" pairs. Whole entries only, so a redacted
 * secret is never cut in half. */
static void fail_text(json_t *data, cos_buf *out)
{
    static const char *const keys[] = {"message", "error", "reason", "detail"};
    const char *k;
    json_t *v;
    size_t i;

    if (json_is_string(data)) {
        cos_buf_append(out, json_string_value(data), json_string_length(data));
        return;
    }
    if (!json_is_object(data))
        return;
    for (i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        v = json_object_get(data, keys[i]);
        if (json_is_string(v) && json_string_length(v) > 0) {
            cos_buf_append(out, json_string_value(v), json_string_length(v));
            return;
        }
    }
    json_object_foreach (data, k, v) {
        if (!json_is_string(v) || strcmp(k, "code") == 0)
            continue;
        if (out->len > 16384)
            break;
        if (out->len)
            cos_buf_append(out, "; ", 2);
        cos_buf_append(out, k, strlen(k));
        cos_buf_append(out, ": ", 2);
        cos_buf_append(out, json_string_value(v), json_string_length(v));
    }
}

static void copy_code(cos_err *err, json_t *code, const char *secret)
{
    if (json_is_string(code))
        cos_sanitize(err->code, sizeof err->code, json_string_value(code), json_string_length(code),
                     secret, 120);
}

void cos_error_from_response(const char *op, const cos_meta *meta, const char *body, size_t len,
                             const char *secret, cos_err *err)
{
    cos_kind kind = cos_kind_for_status(meta->status);
    json_t *root = NULL;
    const char *status = NULL;
    json_error_t jerr;
    cos_buf text = {0};
    int refused = 0;

    if (kind == COS_OK)
        kind = COS_E_PROTOCOL;
    if (len > 0) /* an error body too big to parse within bounds shows as text */
        root = cos_json_load(body, len, 0, 0, &jerr, &refused);
    if (root != NULL && json_unpack_ex(root, &jerr, 0, "{s:s}", "status", &status) == 0) {
        if (strcmp(status, "fail") == 0) {
            json_t *data = json_object_get(root, "data");
            fail_text(data, &text);
            if (json_is_object(data))
                copy_code(err, json_object_get(data, "code"), secret);
        } else if (strcmp(status, "error") == 0) {
            json_t *msg = json_object_get(root, "message");
            if (json_is_string(msg))
                cos_buf_append(&text, json_string_value(msg), json_string_length(msg));
            copy_code(err, json_object_get(root, "code"), secret);
        }
        set_response_error(err, op, meta, kind, secret, text.data ? text.data : "", text.len);
    } else if (len > 0) {
        /* Not our envelope (a proxy page, say): show its beginning. */
        cos_buf_append(&text, "non-JSON body: ", 15);
        cos_buf_append(&text, body, len < 4096 ? len : 4096);
        set_response_error(err, op, meta, kind, secret, text.data, text.len);
    } else {
        set_response_error(err, op, meta, kind, secret, "", 0);
    }
    cos_buf_free(&text);
    json_decref(root);
}

int cos_envelope_parse(const char *op, const cos_meta *meta, const char *body, size_t len,
                       int to_python, const char *secret, cos_err *err, json_t **data)
{
    json_t *root = NULL;
    json_t *payload = NULL;
    const char *status = NULL;
    json_error_t jerr;
    char what[160];
    int rc = -1, refused = 0;

    *data = NULL;
    if (meta->status < 200 || meta->status >= 300) {
        cos_error_from_response(op, meta, body, len, secret, err);
        goto done;
    }
    if (len == 0) {
        if (meta->status == 204 || meta->status == 205) {
            *data = json_null();
            rc = 0;
        } else {
            set_protocol_error(err, op, meta, secret, "empty response body");
        }
        goto done;
    }
    if (len > COS_JSON_BODY_MAX) {
        set_protocol_error(err, op, meta, secret, "response body too large");
        goto done;
    }
    root = cos_json_load(body, len, JSON_ALLOW_NUL, to_python, &jerr, &refused);
    if (refused) {
        snprintf(what, sizeof what,
                 "response too complex to parse within memory bounds (%zu bytes of JSON; at "
                 "most %d x the body, or %zu MiB, is spent on a parse)",
                 len, COS_JSON_BUDGET_FACTOR, COS_JSON_BUDGET_FLOOR >> 20);
        set_protocol_error(err, op, meta, secret, what);
        goto done;
    }
    if (root == NULL) {
        /* jerr.text quotes the body: it stays out of the message. */
        snprintf(what, sizeof what, "response is not valid JSON (at byte %d of %zu)", jerr.position,
                 len);
        set_protocol_error(err, op, meta, secret, what);
        goto done;
    }
    if (json_unpack_ex(root, &jerr, 0, "{s:s, s?o}", "status", &status, "data", &payload) != 0) {
        set_protocol_error(err, op, meta, secret, "response is not a JSend envelope");
        goto done;
    }
    if (strcmp(status, "success") != 0) {
        snprintf(what, sizeof what, "HTTP success with a JSend \"%s\" envelope",
                 strcmp(status, "fail") == 0    ? "fail"
                 : strcmp(status, "error") == 0 ? "error"
                                                : "unknown");
        set_protocol_error(err, op, meta, secret, what);
        goto done;
    }
    *data = payload ? json_incref(payload) : json_null();
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int cos_page_items(const char *op, json_t *data, const char *legacy_key, json_t **items,
                   long long *total, cos_err *err)
{
    json_t *arr = NULL, *pag, *t, *item;
    size_t i;

    *items = NULL;
    *total = -1;
    if (json_is_array(data)) {
        arr = data;
    } else if (json_is_object(data)) {
        arr = json_object_get(data, "data");
        if (arr == NULL && legacy_key != NULL)
            arr = json_object_get(data, legacy_key);
        pag = json_object_get(data, "pagination");
        if (pag != NULL && !json_is_null(pag)) {
            if (!json_is_object(pag)) {
                cos_err_set(err, COS_E_PROTOCOL, "%s failed: pagination is not an object", op);
                return -1;
            }
            t = json_object_get(pag, "total");
            if (t != NULL && !json_is_null(t)) {
                if (!json_is_integer(t) || json_integer_value(t) < 0) {
                    cos_err_set(err, COS_E_PROTOCOL, "%s failed: pagination.total is not a count",
                                op);
                    return -1;
                }
                *total = json_integer_value(t);
            }
        }
    }
    if (!json_is_array(arr)) {
        cos_err_set(err, COS_E_PROTOCOL, "%s failed: response has no list of items", op);
        return -1;
    }
    json_array_foreach (arr, i, item) {
        if (!json_is_object(item)) {
            cos_err_set(err, COS_E_PROTOCOL, "%s failed: list item %zu is not an object", op, i);
            return -1;
        }
    }
    *items = json_incref(arr);
    return 0;
}

/* Optional field of one JSON type (null counts as absent). */
static int opt_field(const char *op, json_t *obj, const char *key, json_type type, json_t **out,
                     cos_err *err)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (v == NULL || json_is_null(v))
        return 0;
    if (json_typeof(v) != type && !(type == JSON_REAL && json_is_integer(v))) {
        cos_err_set(err, COS_E_PROTOCOL, "%s failed: field %s has the wrong type", op, key);
        return -1;
    }
    *out = v;
    return 0;
}

int cos_exec_result_parse(const char *op, json_t *data, cos_exec_out *x, cos_err *err)
{
    json_t *result = NULL, *so, *se, *ec, *er, *ms;
    json_error_t jerr;

    if (json_unpack_ex(data, &jerr, 0, "{s:o}", "result", &result) != 0 ||
        !json_is_object(result)) {
        cos_err_set(err, COS_E_PROTOCOL, "%s failed: response has no result object", op);
        return -1;
    }
    if (opt_field(op, result, "stdout", JSON_STRING, &so, err) < 0 ||
        opt_field(op, result, "stderr", JSON_STRING, &se, err) < 0 ||
        opt_field(op, result, "exit_code", JSON_INTEGER, &ec, err) < 0 ||
        opt_field(op, result, "error", JSON_STRING, &er, err) < 0 ||
        opt_field(op, data, "exec_ms", JSON_REAL, &ms, err) < 0)
        return -1;
    if ((so && cos_outbuf_append(&x->out[0], json_string_value(so), json_string_length(so)) < 0) ||
        (se && cos_outbuf_append(&x->out[1], json_string_value(se), json_string_length(se)) < 0) ||
        (er && json_string_length(er) > 0 &&
         cos_exec_out_add_error(x, json_string_value(er), json_string_length(er)) < 0)) {
        cos_err_set(err, COS_E_NOMEM, "%s failed: out of memory", op);
        return -1;
    }
    if (ec) {
        x->exit_code = json_integer_value(ec);
        x->has_exit = 1;
    }
    if (ms) {
        x->exec_ms = json_number_value(ms);
        x->has_exec_ms = 1;
    }
    return 0;
}
