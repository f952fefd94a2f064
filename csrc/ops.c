#include "ops.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jsonquote.h"

#define PAGE_LIMIT 500
#define MAX_PAGES 10000
#define RUN_FALLBACK 1

/* ---------------------------------------------------------------- config */

static int is_loopback(const char *host)
{
    char buf[128];
    size_t n = strlen(host);
    struct in_addr a4;
    struct in6_addr a6;

    if ((n == 9 || (n == 10 && host[9] == '.')) && cos_ascii_caseeq(host, "localhost", 9))
        return 1;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (n >= 2 && n < sizeof buf && host[0] == '[' && host[n - 1] == ']') {
        memcpy(buf, host + 1, n - 2);
        buf[n - 2] = '\0';
        if (inet_pton(AF_INET6, buf, &a6) == 1)
            return memcmp(&a6, &in6addr_loopback, sizeof a6) == 0;
    }
    return 0;
}

int cos_check_base_url(const char *url, char **normalized, cos_err *err)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *part = NULL;
    const char *p;
    size_t plen, need;
    int rc = -1;

    *normalized = NULL;
    if (u == NULL) {
        cos_err_set(err, COS_E_NOMEM, "out of memory");
        goto done;
    }
    for (p = url; *p; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7F) {
            cos_err_set(
                err, COS_E_CONFIG,
                "CREATEOS_SANDBOX_BASE_URL contains whitespace, control or non-ASCII characters");
            goto done;
        }
    }
    if (url[0] == '\0' || curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
        cos_err_set(err, COS_E_CONFIG,
                    "CREATEOS_SANDBOX_BASE_URL is not a valid absolute URL (expected "
                    "https://host[:port][/prefix])");
        goto done;
    }
    if (strcmp(scheme, "https") != 0 && strcmp(scheme, "http") != 0) {
        cos_err_set(err, COS_E_CONFIG, "CREATEOS_SANDBOX_BASE_URL must use https:// (got %.16s://)",
                    scheme);
        goto done;
    }
    if (curl_url_get(u, CURLUPART_USER, &part, 0) == CURLUE_OK ||
        curl_url_get(u, CURLUPART_PASSWORD, &part, 0) == CURLUE_OK ||
        curl_url_get(u, CURLUPART_OPTIONS, &part, 0) == CURLUE_OK) {
        cos_err_set(err, COS_E_CONFIG,
                    "CREATEOS_SANDBOX_BASE_URL must not contain user info (user:password@)");
        goto done;
    }
    if (curl_url_get(u, CURLUPART_QUERY, &part, 0) == CURLUE_OK ||
        curl_url_get(u, CURLUPART_FRAGMENT, &part, 0) == CURLUE_OK || strchr(url, '?') ||
        strchr(url, '#')) {
        cos_err_set(err, COS_E_CONFIG,
                    "CREATEOS_SANDBOX_BASE_URL must not have a query or a fragment");
        goto done;
    }
    if (strcmp(scheme, "http") == 0 && !is_loopback(host)) {
        cos_err_set(
            err, COS_E_CONFIG,
            "CREATEOS_SANDBOX_BASE_URL uses plain http:// to a non-loopback host: the API key "
            "would travel unencrypted; use https:// (plain http is allowed only for "
            "127.0.0.0/8, ::1 and localhost)");
        goto done;
    }
    if (curl_url_get(u, CURLUPART_PORT, &port, 0) != CURLUE_OK)
        port = NULL;
    if (curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK)
        path = NULL;
    plen = path ? strlen(path) : 0;
    while (plen > 0 && path[plen - 1] == '/')
        plen--;
    need = strlen(scheme) + strlen(host) + (port ? strlen(port) : 0) + plen + 8;
    *normalized = malloc(need);
    if (*normalized == NULL) {
        cos_err_set(err, COS_E_NOMEM, "out of memory");
        goto done;
    }
    snprintf(*normalized, need, "%s://%s%s%s%.*s", scheme, host, port ? ":" : "", port ? port : "",
             (int)plen, path ? path : "");
    rc = 0;
done:
    curl_free(part);
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    if (u)
        curl_url_cleanup(u);
    return rc;
}

int cos_check_key(const char *key, cos_err *err)
{
    const unsigned char *p;
    if (key == NULL || key[0] == '\0') {
        cos_err_set(err, COS_E_CONFIG, "the API key is empty (set CREATEOS_SANDBOX_API_KEY)");
        return -1;
    }
    if (strlen(key) > COS_KEY_MAX) {
        cos_err_set(err, COS_E_CONFIG, "the API key is longer than %d characters", COS_KEY_MAX);
        return -1;
    }
    for (p = (const unsigned char *)key; *p; p++) {
        if (*p <= 0x20 || *p >= 0x7F) {
            cos_err_set(err, COS_E_CONFIG,
                        "the API key contains whitespace, control or non-ASCII characters");
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- plumbing */

static char *make_url(const cos_cfg *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static char *make_url(const cos_cfg *cfg, const char *fmt, ...)
{
    va_list ap;
    size_t blen = strlen(cfg->base);
    int n;
    char *out;
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || (out = malloc(blen + (size_t)n + 1)) == NULL)
        return NULL;
    memcpy(out, cfg->base, blen);
    va_start(ap, fmt);
    vsnprintf(out + blen, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return out;
}

static int nomem(cos_ctx *c, const char *op)
{
    cos_err_set(c->err, COS_E_NOMEM, "%s failed: out of memory", op);
    return -1;
}

static double seconds(long ms)
{
    return (double)ms / 1000.0;
}

/* A sandbox id as Python is shown it (exc.sandbox_id, ExecResult.sandbox_id, the ids of
 * drain_deletes): through the one sanitizer, like every string that reaches Python. An id
 * the sanitizer leaves alone (every id create accepts) comes out whole; one a caller passed
 * in may hold anything, and comes out escaped, redacted, cut with "..." to fit. */
static void shown_id(char dst[COS_ID_MAX], const char *id, const char *key)
{
    char in[COS_ID_MAX], out[COS_ID_MAX + 16];
    cos_strlcpy(in, id, sizeof in); /* dst may be id */
    cos_sanitize(out, sizeof out, in, strlen(in), key, COS_ID_MAX);
    if (strlen(out) < COS_ID_MAX)
        memcpy(dst, out, strlen(out) + 1);
    else
        cos_sanitize(dst, COS_ID_MAX, in, strlen(in), key, COS_ID_MAX);
}

/* The guest an error names (exc.sandbox_id). */
static void name_guest(cos_ctx *c, const char *id)
{
    shown_id(c->err->sandbox_id, id, c->cfg->key);
}

/* Give the binding a turn; once it asked to stop, never again. */
static int slice(cos_ctx *c, cos_exec_out *xo)
{
    if (c->aborted || c->slice == NULL)
        return c->aborted;
    if (c->slice(c->ud, xo)) {
        c->aborted = 1;
        cos_err_set(c->err, COS_E_ABORTED, "interrupted");
    }
    return c->aborted;
}

/* What a wait does with its request when the caller asks to stop (Ctrl-C, an
 * exception from on_output) or when the backstop passes and the cancel does not
 * settle in time. */
typedef enum {
    STOP_CANCEL, /* cancel it; if the driver does not let go in time, abandon it */
    STOP_DETACH, /* leave it to the engine, which finishes it as a background delete:
                    counted by pending_deletes, reported by drain_deletes. Only for
                    requests that borrow no caller memory (deletes). */
} stop_policy;

/* After a cancel: wait for the driver to let go of the request, at most
 * COS_CANCEL_GRACE_MS and no longer once Ctrl-C arrives. 0 when it finished. */
static int settle_cancelled(cos_ctx *c, cos_req *r)
{
    double give_up = cos_now_ms() + COS_CANCEL_GRACE_MS;
    if (cos_engine_forked(c->eng))
        return -1;
    for (;;) {
        if (cos_engine_wait(c->eng, r, give_up, c->watch_signals && !c->aborted))
            return 0;
        if (cos_now_ms() >= give_up || (!c->aborted && slice(c, NULL)))
            return -1;
    }
}

/* Hand a request that is still running to the engine (*rp becomes NULL: the
 * engine frees it). 0 when it had finished meanwhile (the caller still owns it). */
static int let_go(cos_ctx *c, cos_req **rp, stop_policy how)
{
    if (how == STOP_DETACH) {
        if (cos_engine_detach(c->eng, *rp))
            return 0;
        cos_engine_stat_add(c->eng, COS_STAT_DELETES_QUEUED, 1);
    } else if (cos_engine_abandon(c->eng, *rp)) {
        return 0;
    }
    *rp = NULL;
    return -1;
}

/* The one wait for a request: submit it and wait, driving it on this thread when
 * no other thread drives the engine. The wait comes back early only for the
 * binding's turn: output to deliver, a signal that may have arrived (the main
 * thread). libcurl enforces the deadline through CURLOPT_TIMEOUT_MS (name
 * resolution included: a stuck resolver is abandoned where libcurl can, see
 * http.c); the extra second here only guards against a transfer that libcurl
 * fails to stop (another thread driving, held in a system call, say), and the
 * cancel it sends is bounded by settle_cancelled. Returns 0 when the request finished (the caller
 * owns it). Else -1, with c->err set or c->aborted; *rp is NULL when the request was handed to the
 * engine. */
static int perform_as(cos_ctx *c, cos_req **rp, const char *op, cos_exec_out *xo, stop_policy how)
{
    cos_req *r = *rp;
    long timeout_ms = r->timeout_ms; /* r may be the engine's by the time it is reported */
    double hard_end = cos_now_ms() + (double)timeout_ms + 1000.0;
    int rc = -1;

    if (cos_engine_submit(c->eng, r, c->err) < 0)
        goto done;
    for (;;) {
        if (cos_engine_wait(c->eng, r, hard_end, c->watch_signals)) {
            rc = 0;
            break;
        }
        if (cos_engine_forked(c->eng)) {
            /* a callback forked: the request is the parent's, and so is finishing it */
            *rp = NULL;
            if (!c->aborted)
                cos_err_set(c->err, COS_E_CLOSED,
                            "%s failed: this process was forked during the call, which only "
                            "the parent process can finish; make calls in the child after the fork",
                            op);
            break;
        }
        if (slice(c, xo)) {
            if (how == STOP_DETACH) {
                rc = let_go(c, rp, how); /* the delete goes on without us */
            } else {
                cos_engine_cancel(c->eng, r);
                if (settle_cancelled(c, r) < 0)
                    let_go(c, rp, how);
            }
            break;
        }
        if (cos_now_ms() >= hard_end) {
            r->gave_up = 1;
            cos_engine_cancel(c->eng, r);
            if (settle_cancelled(c, r) < 0)
                let_go(c, rp, how);
            if (!c->aborted)
                cos_err_set(c->err, COS_E_DEADLINE, "%s failed: deadline of %.1f s passed", op,
                            seconds(timeout_ms));
            break;
        }
    }
    if (rc == 0 && r->cancelled && !r->gave_up) {
        cos_err_set(c->err, COS_E_CLOSED, "%s failed: the client was closed", op);
        rc = -1;
    }
done:
    return rc;
}

static int perform(cos_ctx *c, cos_req **rp, const char *op, cos_exec_out *xo)
{
    return perform_as(c, rp, op, xo, STOP_CANCEL);
}

/* The transfer did not complete: say why, in the error classes. */
static void transport_error(cos_ctx *c, cos_req *r, const char *op)
{
    cos_err *err = c->err;
    cos_kind kind = COS_E_TRANSIENT;
    char detail[CURL_ERROR_SIZE + 8];

    cos_sanitize(detail, sizeof detail, r->errbuf, strlen(r->errbuf), c->cfg->key, 200);
    err->status = r->meta.status;
    cos_sanitize(err->request_id, sizeof err->request_id, r->meta.request_id,
                 strlen(r->meta.request_id), c->cfg->key, 120);
    if (r->write_failed) {
        cos_err_set(err, COS_E_NOMEM, "%s failed: out of memory while receiving", op);
        return;
    }
    if (r->over_cap || r->declared_over_cap) {
        cos_err_set(err, COS_E_PROTOCOL, "%s failed: response body larger than %zu bytes%s", op,
                    r->body_cap, r->declared_over_cap ? " (declared; nothing was read)" : "");
        return;
    }
    /* CURLE_SEND_ERROR with a status: the server answered and closed while the request
     * body was still going out (a large exec stdin); the answer decides, as for a cut read */
    if (r->meta.status >= 300 && (r->rc == CURLE_PARTIAL_FILE || r->rc == CURLE_RECV_ERROR ||
                                  r->rc == CURLE_GOT_NOTHING || r->rc == CURLE_SEND_ERROR)) {
        /* the status line arrived: it classifies better than the cut body */
        cos_error_from_response(op, &r->meta, r->body.data, r->body.len, c->cfg->key, err);
        return;
    }
    if (r->meta.status >= 200 && r->meta.status < 300 &&
        (r->rc == CURLE_PARTIAL_FILE || r->rc == CURLE_RECV_ERROR || r->rc == CURLE_GOT_NOTHING ||
         r->rc == CURLE_SEND_ERROR || r->rc == CURLE_HTTP2_STREAM || r->rc == CURLE_HTTP2)) {
        /* the answer started and broke off: not the documented protocol */
        cos_err_set(
            err, COS_E_PROTOCOL,
            "%s failed: HTTP %ld: truncated response (connection closed after %lld bytes: %s)", op,
            r->meta.status, (long long)r->bytes_in, detail);
        return;
    }
    switch (r->rc) {
    case CURLE_OPERATION_TIMEDOUT:
        cos_err_set(err, COS_E_DEADLINE, "%s failed: deadline of %.1f s passed (%s)", op,
                    seconds(r->timeout_ms), detail);
        return;
    case CURLE_PARTIAL_FILE:
        cos_err_set(err, COS_E_PROTOCOL, "%s failed: truncated response (%s)", op, detail);
        return;
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_BAD_CONTENT_ENCODING:
    case CURLE_RANGE_ERROR:
        kind = COS_E_PROTOCOL;
        break;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_NOT_BUILT_IN: /* a SOCKS proxy, which the self-contained build has not */
    case CURLE_URL_MALFORMAT:
    case CURLE_TOO_MANY_REDIRECTS:
        kind = COS_E_UNAVAILABLE;
        break;
    default:
        break;
    }
    cos_err_set(err, kind, "%s failed: %s (%s)", op, curl_easy_strerror(r->rc),
                detail[0] ? detail : "no detail");
}

static cos_req *new_req(cos_ctx *c, const char *op, cos_req_spec *spec)
{
    CURL *easy = cos_engine_easy(c->eng);
    cos_req *r;
    if (easy == NULL) {
        nomem(c, op);
        return NULL;
    }
    r = cos_req_new(c->cfg, easy, cos_engine_share(c->eng), spec, c->err);
    if (r == NULL)
        curl_easy_cleanup(easy);
    return r;
}

/* One JSON request: body (may be NULL) -> data of the success envelope. */
static int json_call(cos_ctx *c, const char *op, const char *method, char *url, json_t *body,
                     long timeout_ms, json_t **data)
{
    cos_req_spec spec = {0};
    cos_req *r = NULL;
    char *text = NULL;
    int rc = -1;

    *data = NULL;
    if (url == NULL)
        return nomem(c, op);
    if (body != NULL && (text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY)) == NULL) {
        nomem(c, op);
        goto done;
    }
    spec.method = method;
    spec.url = url;
    spec.body = text;
    spec.body_len = text ? strlen(text) : 0;
    spec.content_type = text ? "application/json" : NULL;
    spec.mode = COS_RESP_JSON;
    spec.body_cap = COS_JSON_BODY_MAX;
    spec.timeout_ms = timeout_ms;
    if ((r = new_req(c, op, &spec)) == NULL || perform(c, &r, op, NULL) < 0)
        goto done;
    if (r->rc != CURLE_OK) {
        transport_error(c, r, op);
        goto done;
    }
    rc = cos_envelope_parse(op, &r->meta, r->body.data, r->body.len, 1, c->cfg->key, c->err, data);
done:
    if (r)
        cos_engine_release(c->eng, r);
    free(text);
    free(url);
    return rc;
}

static char *sandbox_url(cos_ctx *c, const char *id, const char *suffix)
{
    char *esc = cos_escape(id), *url;
    if (esc == NULL)
        return NULL;
    url = make_url(c->cfg, "/v1/sandboxes/%s%s", esc, suffix);
    free(esc);
    return url;
}

static int require_object(cos_ctx *c, const char *op, json_t **data)
{
    if (json_is_object(*data))
        return 0;
    cos_err_set(c->err, COS_E_PROTOCOL, "%s failed: response data is not an object", op);
    json_decref(*data);
    *data = NULL;
    return -1;
}

static int object_call(cos_ctx *c, const char *op, const char *method, char *url, json_t *body,
                       long timeout_ms, json_t **out)
{
    if (json_call(c, op, method, url, body, timeout_ms, out) < 0)
        return -1;
    return require_object(c, op, out);
}

/* ----------------------------------------------------------- operations */

int cos_op_whoami(cos_ctx *c, json_t **out)
{
    return object_call(c, "whoami", "GET", make_url(c->cfg, "/v1/whoami"), NULL, c->cfg->control_ms,
                       out);
}

int cos_op_rootfs(cos_ctx *c, json_t **out)
{
    return object_call(c, "rootfs", "GET", make_url(c->cfg, "/v1/rootfs"), NULL, c->cfg->control_ms,
                       out);
}

/* Which rows of a list to keep; NULL fields keep every row. */
typedef struct {
    const char *prefix;
    const char *status;
} row_filter;

static int row_kept(const row_filter *f, json_t *item)
{
    json_t *name, *st;
    if (f == NULL)
        return 1;
    name = json_object_get(item, "name");
    st = json_object_get(item, "status");
    if (f->prefix && !(json_is_string(name) &&
                       strncmp(json_string_value(name), f->prefix, strlen(f->prefix)) == 0))
        return 0;
    if (f->status && !(json_is_string(st) && strcmp(json_string_value(st), f->status) == 0))
        return 0;
    return 1;
}

/* Every page of a list, under one deadline. Rows are filtered page by page,
 * so memory is bounded by one page plus the kept rows, however many rows the
 * account has (terminal rows stay listed: the total only grows). */
static int all_pages(cos_ctx *c, const char *op, const char *path, const char *extra_query,
                     const char *legacy_key, const row_filter *filter, json_t **out)
{
    json_t *all = json_array();
    double end = cos_now_ms() + (double)c->cfg->control_ms;
    long long offset = 0;
    int page, rc = -1;

    if (all == NULL)
        return nomem(c, op);
    for (page = 0; page < MAX_PAGES; page++) {
        json_t *data = NULL, *items = NULL, *item;
        long long total = -1;
        size_t i, count;
        int paginated, last;
        long left = (long)(end - cos_now_ms());
        if (left <= 0) {
            cos_err_set(c->err, COS_E_DEADLINE, "%s failed: deadline of %.1f s passed", op,
                        seconds(c->cfg->control_ms));
            goto done;
        }
        if (json_call(c, op, "GET",
                      make_url(c->cfg, "%s?limit=%d&offset=%lld%s", path, PAGE_LIMIT, offset,
                               extra_query ? extra_query : ""),
                      NULL, left, &data) < 0)
            goto done;
        paginated = json_is_object(data) && json_is_array(json_object_get(data, "data"));
        if (cos_page_items(op, data, legacy_key, &items, &total, c->err) < 0) {
            json_decref(data);
            goto done;
        }
        json_decref(data);
        count = json_array_size(items);
        json_array_foreach (items, i, item) {
            if (row_kept(filter, item) && json_array_append(all, item) < 0) {
                json_decref(items);
                nomem(c, op);
                goto done;
            }
        }
        json_decref(items);
        offset += (long long)count;
        last = !paginated || count == 0 || (total >= 0 && offset >= total) ||
               (total < 0 && count < PAGE_LIMIT);
        if (last) {
            rc = 0;
            goto done;
        }
    }
    cos_err_set(c->err, COS_E_PROTOCOL, "%s failed: more than %d pages", op, MAX_PAGES);
done:
    if (rc == 0)
        *out = all;
    else
        json_decref(all);
    return rc;
}

int cos_op_shapes(cos_ctx *c, json_t **out)
{
    return all_pages(c, "shapes", "/v1/shapes", NULL, "shapes", NULL, out);
}

int cos_op_list(cos_ctx *c, const char *prefix, const char *status, json_t **out)
{
    /* the server filters only these states; every filter is also applied here */
    static const char *const server_side[] = {"running", "creating", "destroyed", "failed"};
    char query[96] = "";
    row_filter filter = {prefix, status};
    size_t i;

    for (i = 0; status && i < sizeof server_side / sizeof server_side[0]; i++)
        if (strcmp(status, server_side[i]) == 0)
            snprintf(query, sizeof query, "&status=%s", status);
    return all_pages(c, "list", "/v1/sandboxes", query, "sandboxes", &filter, out);
}

static int has_control(const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7F)
            return 1;
    return 0;
}

int cos_op_create(cos_ctx *c, json_t *spec, long timeout_ms, json_t **out)
{
    json_t *id;
    int clean;
    if (object_call(c, "create", "POST", make_url(c->cfg, "/v1/sandboxes"), spec,
                    timeout_ms > 0 ? timeout_ms : c->cfg->control_ms, out) < 0)
        return -1;
    id = json_object_get(*out, "id");
    if (!json_is_string(id) || json_string_length(id) == 0 ||
        json_string_length(id) >= COS_ID_MAX) {
        cos_err_set(c->err, COS_E_PROTOCOL, "create failed: response has no sandbox id");
    } else if (has_control(json_string_value(id), json_string_length(id))) {
        /* "sb-1\u0000x" must never be cut into "sb-1", another sandbox's id */
        cos_err_set(
            c->err, COS_E_PROTOCOL,
            "create failed: the sandbox id in the response holds a NUL or control character");
    } else if ((clean = cos_sanitize_unchanged(json_string_value(id), json_string_length(id),
                                               c->cfg->key)) == 0) {
        /* an id is shown as it is (exceptions, ExecResult, drain_deletes, logs): one the
         * sanitizer would change (a run of the key, a C1 control, U+2028/9, a bidi
         * override) is refused, never passed on, and never quoted */
        cos_err_set(c->err, COS_E_PROTOCOL,
                    "create failed: the sandbox id in the response holds a run of the API key or "
                    "a character that cannot be shown as it is (a C1 control, a line separator, "
                    "a bidirectional override)");
    } else if (clean < 0) {
        nomem(c, "create");
    } else {
        return 0;
    }
    json_decref(*out);
    *out = NULL;
    return -1;
}

int cos_op_get(cos_ctx *c, const char *id, json_t **out)
{
    return object_call(c, "get", "GET", sandbox_url(c, id, ""), NULL, c->cfg->control_ms, out);
}

int cos_op_delete(cos_ctx *c, const char *id, json_t **out)
{
    return object_call(c, "delete", "DELETE", sandbox_url(c, id, ""), NULL, c->cfg->control_ms,
                       out);
}

int cos_op_pause(cos_ctx *c, const char *id, json_t **out)
{
    return object_call(c, "pause", "POST", sandbox_url(c, id, "/pause"), NULL, c->cfg->control_ms,
                       out);
}

static int sleep_slices(cos_ctx *c, double ms)
{
    double end = cos_now_ms() + ms;
    for (;;) {
        double left = end - cos_now_ms();
        struct timespec ts;
        if (left <= 0)
            return 0;
        if (left > COS_SLICE_MS)
            left = COS_SLICE_MS;
        ts.tv_sec = (time_t)(left / 1000.0);
        ts.tv_nsec = (long)((left - (double)ts.tv_sec * 1000.0) * 1e6);
        nanosleep(&ts, NULL);
        if (slice(c, NULL))
            return -1;
    }
}

int cos_op_resume(cos_ctx *c, const char *id, long wait_ms, json_t **out)
{
    static const char *const fatal[] = {"error", "failed", "destroying", "destroyed"};
    double end = cos_now_ms() + (double)(wait_ms > 0 ? wait_ms : 0), started = cos_now_ms();
    double delay = 250.0;
    size_t i;

    if (object_call(c, "resume", "POST", sandbox_url(c, id, "/resume"), NULL, c->cfg->control_ms,
                    out) < 0)
        return -1;
    if (wait_ms < 0)
        return 0;
    for (;;) {
        json_t *st = json_object_get(*out, "status");
        const char *s = json_is_string(st) ? json_string_value(st) : "";
        long left;
        if (strcmp(s, "running") == 0)
            return 0;
        for (i = 0; i < sizeof fatal / sizeof fatal[0]; i++) {
            if (strcmp(s, fatal[i]) == 0) {
                cos_err_set(c->err, COS_E_UNAVAILABLE,
                            "resume failed: sandbox entered state \"%s\" while resuming", s);
                name_guest(c, id);
                goto fail;
            }
        }
        if (cos_now_ms() + delay > end) {
            char state[COS_ID_MAX]; /* the server's word: sanitized like any server text */
            cos_sanitize(state, sizeof state, s, json_is_string(st) ? json_string_length(st) : 0,
                         c->cfg->key, 40);
            cos_err_set(c->err, COS_E_DEADLINE,
                        "resume failed: sandbox not running after %.1f s (state \"%s\")",
                        seconds(wait_ms), state);
            name_guest(c, id);
            goto fail;
        }
        if (sleep_slices(c, delay) < 0)
            goto fail;
        if (cos_now_ms() - started > 5000.0 && delay < 2000.0)
            delay = delay * 1.25 > 2000.0 ? 2000.0 : delay * 1.25;
        json_decref(*out);
        *out = NULL;
        left = (long)(end - cos_now_ms());
        if (object_call(c, "resume", "GET", sandbox_url(c, id, ""), NULL,
                        left < c->cfg->control_ms ? (left > 1 ? left : 1) : c->cfg->control_ms,
                        out) < 0)
            return -1;
    }
fail:
    json_decref(*out);
    *out = NULL;
    return -1;
}

int cos_op_fork(cos_ctx *c, const char *id, json_t *spec, json_t **out)
{
    json_t *empty = spec ? NULL : json_object();
    int rc = object_call(c, "fork", "POST", sandbox_url(c, id, "/fork"), spec ? spec : empty,
                         c->cfg->control_ms, out);
    json_decref(empty);
    return rc;
}

int cos_op_patch(cos_ctx *c, const char *id, json_t *fields, json_t **out)
{
    return object_call(c, "patch", "PATCH", sandbox_url(c, id, ""), fields, c->cfg->control_ms,
                       out);
}

static int egress_list(cos_ctx *c, const char *op, json_t **out)
{
    json_t *view = *out, *rules = json_object_get(view, "egress"), *v;
    size_t i;
    if (rules == NULL || json_is_null(rules)) {
        *out = json_array();
    } else if (json_is_array(rules)) {
        json_array_foreach (rules, i, v) {
            if (!json_is_string(v)) {
                cos_err_set(c->err, COS_E_PROTOCOL, "%s failed: egress rule %zu is not a string",
                            op, i);
                *out = NULL;
                json_decref(view);
                return -1;
            }
        }
        *out = json_incref(rules);
    } else {
        cos_err_set(c->err, COS_E_PROTOCOL, "%s failed: egress is not a list", op);
        *out = NULL;
        json_decref(view);
        return -1;
    }
    json_decref(view);
    return *out ? 0 : nomem(c, op);
}

int cos_op_get_egress(cos_ctx *c, const char *id, json_t **out)
{
    if (object_call(c, "get_egress", "GET", sandbox_url(c, id, "/egress"), NULL, c->cfg->control_ms,
                    out) < 0)
        return -1;
    return egress_list(c, "get_egress", out);
}

int cos_op_put_egress(cos_ctx *c, const char *id, json_t *rules, json_t **out)
{
    json_t *body = json_pack("{s:O}", "egress", rules ? rules : json_null());
    int rc;
    if (body == NULL)
        return nomem(c, "put_egress");
    rc = object_call(c, "put_egress", "PUT", sandbox_url(c, id, "/egress"), body,
                     c->cfg->control_ms, out);
    json_decref(body);
    if (rc < 0)
        return -1;
    return egress_list(c, "put_egress", out);
}

static char *files_url(cos_ctx *c, const char *id, const char *path)
{
    char *ep = cos_escape(path), *suffix, *url = NULL;
    size_t n;
    if (ep == NULL)
        return NULL;
    n = strlen(ep) + 16;
    if ((suffix = malloc(n)) != NULL) {
        snprintf(suffix, n, "/files?path=%s", ep);
        url = sandbox_url(c, id, suffix);
        free(suffix);
    }
    free(ep);
    return url;
}

int cos_op_upload(cos_ctx *c, const char *id, const char *path, const char *data, size_t len,
                  FILE *file, long long size)
{
    const char *op = "upload";
    cos_req_spec spec = {0};
    cos_req *r = NULL;
    json_t *out = NULL;
    char *url = files_url(c, id, path);
    int rc = -1;

    if (url == NULL)
        return nomem(c, op);
    spec.method = "PUT";
    spec.url = url;
    spec.upload = file;
    spec.upload_mem = file ? NULL : data ? data : "";
    spec.upload_size = file ? (curl_off_t)size : (curl_off_t)len;
    spec.content_type = "application/octet-stream";
    spec.mode = COS_RESP_JSON;
    spec.body_cap = COS_JSON_BODY_MAX;
    spec.timeout_ms = c->cfg->control_ms;
    if ((r = new_req(c, op, &spec)) == NULL || perform(c, &r, op, NULL) < 0)
        goto done;
    if (r->rc != CURLE_OK) {
        transport_error(c, r, op);
        goto done;
    }
    rc = cos_envelope_parse(op, &r->meta, r->body.data, r->body.len, 0, c->cfg->key, c->err, &out);
done:
    json_decref(out);
    if (r)
        cos_engine_release(c->eng, r);
    free(url);
    return rc;
}

int cos_op_download(cos_ctx *c, const char *id, const char *path, size_t max_bytes, cos_buf *out)
{
    const char *op = "download";
    cos_req_spec spec = {0};
    cos_req *r = NULL;
    char *url = files_url(c, id, path);
    int rc = -1;

    if (url == NULL)
        return nomem(c, op);
    spec.method = "GET";
    spec.url = url;
    spec.accept = "application/octet-stream, application/json";
    spec.mode = COS_RESP_DOWNLOAD;
    spec.body_cap = max_bytes;
    spec.timeout_ms = c->cfg->control_ms;
    if ((r = new_req(c, op, &spec)) == NULL || perform(c, &r, op, NULL) < 0)
        goto done;
    if (r->declared_over_cap || r->over_cap) {
        cos_err_set(
            c->err, COS_E_UNAVAILABLE,
            r->declared_over_cap
                ? "download failed: the file is larger than max_bytes=%zu (declared "
                  "Content-Length); nothing was read"
                : "download failed: more than max_bytes=%zu bytes received; transfer aborted",
            max_bytes);
        cos_strlcpy(c->err->code, "too_large", sizeof c->err->code);
        c->err->status = r->meta.status;
        goto done;
    }
    if (r->rc != CURLE_OK) {
        transport_error(c, r, op);
        goto done;
    }
    if (r->meta.status < 200 || r->meta.status >= 300) {
        cos_error_from_response(op, &r->meta, r->body.data, r->body.len, c->cfg->key, c->err);
        goto done;
    }
    *out = r->body;
    memset(&r->body, 0, sizeof r->body);
    rc = 0;
done:
    if (r)
        cos_engine_release(c->eng, r);
    free(url);
    return rc;
}

/* ------------------------------------------------------------------ exec */

static void exec_request_free(cos_req_spec *spec)
{
    free((char *)spec->body);
    free((char *)spec->url);
    spec->body = spec->url = NULL;
}

/* The exec request: its JSON body and URL, and the spec fields both forms share. The
 * body is jansson's dump of the small fields with stdin, which can be large, spliced in
 * by cos_json_quote (jansson escapes a string a code point at a time). Returns -1 (err
 * set) when stdin is not UTF-8 or memory runs out. */
static int exec_request(cos_ctx *c, const char *id, const cos_exec_args *a, int stream,
                        long timeout_ms, cos_req_spec *spec)
{
    json_t *b = json_object();
    char *small = NULL;
    cos_buf body = {0};
    int quoted = 0, rc = -1;

    memset(spec, 0, sizeof *spec);
    if (b != NULL && json_object_set_new(b, "cmd", json_string(a->cmd)) == 0 &&
        json_object_set_new(b, "args", a->args ? json_incref(a->args) : json_array()) == 0 &&
        (!a->env || json_object_set_new(b, "env", json_incref(a->env)) == 0) &&
        (!stream || json_object_set_new(b, "stream", json_true()) == 0))
        small = json_dumps(b, JSON_COMPACT); /* {"cmd":...}: never empty */
    if (small == NULL || cos_buf_append(&body, small, strlen(small) - 1) < 0)
        goto done;
    if (a->stdin_data != NULL &&
        (cos_buf_append(&body, ",\"stdin\":", 9) < 0 ||
         (quoted = cos_json_quote(&body, a->stdin_data, a->stdin_len)) < 0))
        goto done;
    if (cos_buf_append(&body, "}", 2) < 0 || /* with its NUL */
        (spec->url = sandbox_url(c, id, stream ? "/exec?stream=true" : "/exec")) == NULL)
        goto done;
    spec->method = "POST";
    spec->body = body.data;
    spec->body_len = body.len - 1;
    spec->content_type = "application/json";
    spec->timeout_ms = timeout_ms;
    body.data = NULL;
    rc = 0;
done:
    if (rc < 0 && quoted == COS_QUOTE_NOT_UTF8)
        cos_err_set(c->err, COS_E_VALUE, "exec failed: stdin is not valid UTF-8");
    else if (rc < 0)
        nomem(c, "exec");
    free(small);
    json_decref(b);
    cos_buf_free(&body);
    return rc;
}

/* 0 done, RUN_FALLBACK when the server has no streaming exec, -1 error. */
static int exec_stream(cos_ctx *c, const char *id, const cos_exec_args *a, long timeout_ms,
                       cos_exec_out *xo)
{
    const char *op = "exec";
    cos_req_spec spec;
    cos_req *r = NULL;
    int rc = -1, nd;

    if (exec_request(c, id, a, 1, timeout_ms, &spec) < 0)
        return -1;
    spec.accept = "application/x-ndjson, application/json";
    spec.mode = COS_RESP_STREAM;
    spec.body_cap = COS_ERROR_BODY_MAX;
    spec.xo = xo;
    spec.notify_output = c->live_output;
    if ((r = new_req(c, op, &spec)) == NULL)
        goto done;
    cos_engine_stat_add(c->eng, COS_STAT_STREAMS, 1);
    if (perform(c, &r, op, xo) < 0) {
        if (r != NULL && c->err->kind == COS_E_DEADLINE && atomic_load(&r->stream_started)) {
            xo->timed_out = !xo->has_exit;
            xo->streamed = 1;
            rc = 0;
        }
        goto done;
    }
    if (r->meta.status == 404 && !atomic_load(&r->stream_started)) {
        rc = RUN_FALLBACK;
        goto done;
    }
    if (r->nd_rc != COS_ND_OK ||
        (r->rc == CURLE_OK && r->meta.status >= 200 && r->meta.status < 300)) {
        pthread_mutex_lock(&xo->mu);
        nd = r->nd_rc != COS_ND_OK ? r->nd_rc : cos_ndjson_finish(&r->nd);
        pthread_mutex_unlock(&xo->mu);
        if (nd == COS_ND_NOMEM || nd == COS_ND_STOPPED) {
            nomem(c, op); /* a frame is refused only when its output cannot be stored */
        } else if (nd != COS_ND_OK) {
            cos_err_set(c->err, COS_E_PROTOCOL, "exec failed: HTTP %ld: %s", r->meta.status,
                        r->nd.errmsg);
            c->err->status = r->meta.status;
        } else if (!xo->has_exit) {
            /* a clean end without the terminal frame: the agent died, or a
             * proxy cut the stream on a frame boundary; never "exit code -1" */
            cos_err_set(c->err, COS_E_PROTOCOL,
                        "exec failed: HTTP %ld: the stream ended without an exit_code frame "
                        "(the guest agent may have crashed; %zu frames received)",
                        r->meta.status, xo->frames);
            cos_strlcpy(c->err->code, "no_exit_frame", sizeof c->err->code);
            c->err->status = r->meta.status;
        } else {
            xo->streamed = 1;
            rc = 0;
        }
        goto done;
    }
    if (r->rc == CURLE_OPERATION_TIMEDOUT && atomic_load(&r->stream_started)) {
        xo->timed_out = !xo->has_exit;
        xo->streamed = 1;
        rc = 0;
        goto done;
    }
    if (r->rc != CURLE_OK) {
        transport_error(c, r, op);
        goto done;
    }
    cos_error_from_response(op, &r->meta, r->body.data, r->body.len, c->cfg->key, c->err);
done:
    if (r)
        cos_engine_release(c->eng, r);
    exec_request_free(&spec);
    return rc;
}

static int exec_buffered(cos_ctx *c, const char *id, const cos_exec_args *a, long timeout_ms,
                         cos_exec_out *xo)
{
    const char *op = "exec";
    cos_req_spec spec;
    cos_req *r = NULL;
    json_t *data = NULL;
    int rc = -1;

    if (exec_request(c, id, a, 0, timeout_ms, &spec) < 0)
        return -1;
    spec.mode = COS_RESP_JSON;
    /* The whole answer is one JSON document, parsed whole before max_output_bytes can cut
     * anything: its cap is the parser's (64 MiB), whatever max_output_bytes allows. A
     * Content-Length above it is refused from the headers, a body passing it as soon as it
     * does (streaming exec, which has no body cap, is not affected). */
    spec.body_cap = COS_JSON_BODY_MAX;
    if ((r = new_req(c, op, &spec)) == NULL || perform(c, &r, op, NULL) < 0)
        goto done;
    if (r->over_cap || r->declared_over_cap) {
        cos_err_set(c->err, COS_E_PROTOCOL,
                    "exec failed: HTTP %ld: the control plane has no streaming exec, and its "
                    "buffered answer is larger than %zu MiB, the most the client parses (%s); "
                    "output this large needs a control plane with streaming exec",
                    r->meta.status, (size_t)(COS_JSON_BODY_MAX >> 20),
                    r->declared_over_cap ? "declared by its Content-Length; nothing was read"
                                         : "the transfer was stopped there");
        cos_strlcpy(c->err->code, "too_large", sizeof c->err->code);
        c->err->status = r->meta.status;
        goto done;
    }
    if (r->rc != CURLE_OK) {
        transport_error(c, r, op);
        goto done;
    }
    if (cos_envelope_parse(op, &r->meta, r->body.data, r->body.len, 0, c->cfg->key, c->err, &data) <
        0)
        goto done;
    if (!json_is_object(data)) {
        cos_err_set(c->err, COS_E_PROTOCOL, "exec failed: response data is not an object");
        goto done;
    }
    pthread_mutex_lock(&xo->mu);
    rc = cos_exec_result_parse(op, data, xo, c->err);
    pthread_mutex_unlock(&xo->mu);
    if (rc == 0 && !xo->has_exit) {
        cos_err_set(c->err, COS_E_PROTOCOL, "exec failed: the result has no exit_code");
        cos_strlcpy(c->err->code, "no_exit_frame", sizeof c->err->code);
        rc = -1;
    }
done:
    json_decref(data);
    if (r)
        cos_engine_release(c->eng, r);
    exec_request_free(&spec);
    return rc;
}

int cos_op_exec(cos_ctx *c, const char *id, const cos_exec_args *a, cos_exec_out *xo)
{
    double end = cos_now_ms() + (double)a->timeout_ms;
    long left;
    int rc = RUN_FALLBACK;

    if (a->stream) {
        rc = exec_stream(c, id, a, a->timeout_ms, xo);
        if (rc == RUN_FALLBACK)
            cos_engine_stat_add(c->eng, COS_STAT_FALLBACKS, 1);
    }
    if (rc == RUN_FALLBACK) {
        left = (long)(end - cos_now_ms());
        if (left > 0) {
            rc = exec_buffered(c, id, a, left, xo);
        } else {
            cos_err_set(c->err, COS_E_DEADLINE, "exec failed: deadline of %.1f s passed",
                        seconds(a->timeout_ms));
            rc = -1;
        }
    }
    /* the service's error text is server text: it reaches Python sanitized */
    if (rc == 0 && cos_exec_out_seal(xo, c->cfg->key) < 0)
        rc = nomem(c, "exec");
    return rc;
}

/* ------------------------------------------------------ deletes, run_program */

static void bg_delete_done(cos_req *r);

static cos_req *delete_req(cos_engine *eng, const cos_cfg *cfg, const char *id, int attempt,
                           cos_err *err)
{
    cos_ctx c = {eng, cfg, NULL, NULL, err, 0, 0};
    cos_req_spec spec = {0};
    cos_req *r;
    char *url = sandbox_url(&c, id, "");
    if (url == NULL) {
        nomem(&c, "delete");
        return NULL;
    }
    spec.method = "DELETE";
    spec.url = url;
    spec.mode = COS_RESP_JSON;
    spec.body_cap = COS_ERROR_BODY_MAX;
    spec.timeout_ms = cfg->control_ms;
    r = new_req(&c, "delete", &spec);
    free(url);
    if (r == NULL)
        return NULL;
    /* where its outcome goes, made now: recording it when the delete is over needs no
     * memory, so an outcome is never lost to out-of-memory after the delete was sent */
    if ((r->outcome = cos_outcome_new()) == NULL) {
        cos_engine_release(eng, r);
        nomem(&c, "delete");
        return NULL;
    }
    r->on_orphan_done = bg_delete_done;
    r->orphan_engine = eng;
    r->orphan_cfg = cfg;
    r->attempt = attempt;
    cos_strlcpy(r->orphan_id, id, sizeof r->orphan_id);
    return r;
}

/* Record a background delete's outcome for drain_deletes, its id as Python is shown it;
 * *node (made with the request, or NULL) is the engine's from now on. */
static void record_outcome(cos_engine *eng, const cos_cfg *cfg, cos_outcome **node, const char *id,
                           long status, const char *error)
{
    char shown[COS_ID_MAX];
    shown_id(shown, id, cfg->key);
    cos_engine_add_outcome(eng, node ? *node : NULL, shown, status, error);
    if (node)
        *node = NULL;
}

/* The result of a delete as (status, error text or NULL): 404 counts as done. */
static const char *delete_verdict(cos_req *r, const cos_cfg *cfg, cos_err *err)
{
    cos_ctx c = {NULL, cfg, NULL, NULL, err, 0, 0};
    json_t *data = NULL;
    if (r->cancelled && r->gave_up) {
        cos_err_set(err, COS_E_DEADLINE,
                    "delete failed: deadline of %.1f s passed (the transfer was stopped)",
                    seconds(r->timeout_ms));
        return err->msg;
    }
    if (r->cancelled) {
        cos_err_set(err, COS_E_CLOSED, "delete failed: the client was closed");
        return err->msg;
    }
    if (r->rc != CURLE_OK) {
        transport_error(&c, r, "delete");
        return err->msg;
    }
    if (r->meta.status == 404)
        return NULL;
    if (cos_envelope_parse("delete", &r->meta, r->body.data, r->body.len, 0, cfg->key, err, &data) <
        0)
        return err->msg;
    json_decref(data);
    return NULL;
}

/* The driver: a background delete finished. One retry when it may help. */
static void bg_delete_done(cos_req *r)
{
    cos_engine *eng = r->orphan_engine;
    cos_err err;
    const char *verdict;

    cos_err_clear(&err);
    verdict = delete_verdict(r, r->orphan_cfg, &err);
    if (verdict != NULL && r->attempt == 0 && cos_kind_is_transient(err.kind)) {
        cos_err retry_err;
        cos_req *again;
        cos_err_clear(&retry_err);
        again = delete_req(eng, r->orphan_cfg, r->orphan_id, 1, &retry_err);
        if (again != NULL && cos_engine_submit_orphan(eng, again, &retry_err) == 0)
            return;
        if (again != NULL)
            cos_engine_release(eng, again);
    }
    record_outcome(eng, r->orphan_cfg, &r->outcome, r->orphan_id, r->meta.status, verdict);
}

/* Queue a delete in the background. attempt 0 may be retried once (bg_delete_done);
 * attempt 1 is that retry and never retried again. */
static int delete_background(cos_ctx *c, const char *id, int attempt)
{
    cos_req *r = delete_req(c->eng, c->cfg, id, attempt, c->err);
    if (r != NULL && cos_engine_submit_orphan(c->eng, r, c->err) < 0) {
        cos_engine_release(c->eng, r);
        r = NULL;
    }
    if (r == NULL) {
        /* never sent (no helper thread, out of memory): a failed delete, which the
         * caller's drain_deletes reports, never a silent one */
        record_outcome(c->eng, c->cfg, NULL, id, 0, c->err->msg);
        return -1;
    }
    cos_engine_stat_add(c->eng, COS_STAT_DELETES_QUEUED, 1);
    return 0;
}

int cos_op_delete_background(cos_ctx *c, const char *id)
{
    return delete_background(c, id, 0);
}

/* Delete the guest of a run: synchronously unless asked otherwise or the
 * caller is being interrupted (then at once in the background). The wait is
 * perform's; when interrupted, the delete goes on in the background (and so
 * does one the backstop had to give up on). A synchronous delete that did not
 * succeed is handed to the background for one more try, which is its one
 * retry: never retried again. Its errors never replace the run's own
 * (c->err), but an interrupt is the caller's. */
static void run_cleanup(cos_ctx *c, const char *id, int background)
{
    cos_err derr, *run_err = c->err;
    cos_req *r = NULL;
    int done = -1;

    cos_err_clear(&derr);
    c->err = &derr;
    if (background || c->aborted) {
        cos_op_delete_background(c, id);
    } else if ((r = delete_req(c->eng, c->cfg, id, 0, &derr)) != NULL) {
        done = perform_as(c, &r, "delete", NULL, STOP_DETACH);
        if (r != NULL && (done < 0 || delete_verdict(r, c->cfg, &derr) != NULL) &&
            !(r->cancelled && !r->gave_up))
            delete_background(c, id, 1);
    }
    if (r != NULL)
        cos_engine_release(c->eng, r);
    c->err = run_err;
    if (c->aborted)
        cos_err_set(c->err, COS_E_ABORTED, "interrupted");
}

int cos_op_run_program(cos_ctx *c, json_t *create_spec, const char *adopt_id, const cos_file *files,
                       size_t nfiles, const cos_exec_args *a, int delete_background,
                       cos_exec_out *xo, char sandbox_id_out[COS_ID_MAX])
{
    json_t *view = NULL;
    size_t i;
    int rc = -1, have_guest = 0;

    sandbox_id_out[0] = '\0';
    if (adopt_id != NULL) {
        cos_strlcpy(sandbox_id_out, adopt_id, COS_ID_MAX);
    } else {
        if (cos_op_create(c, create_spec, c->cfg->control_ms, &view) < 0)
            goto done;
        cos_strlcpy(sandbox_id_out, json_string_value(json_object_get(view, "id")), COS_ID_MAX);
    }
    have_guest = 1;
    for (i = 0; i < nfiles; i++)
        if (cos_op_upload(c, sandbox_id_out, files[i].path, files[i].data, files[i].len, NULL, 0) <
            0)
            goto done;
    rc = cos_op_exec(c, sandbox_id_out, a, xo);
done:
    if (have_guest) {
        run_cleanup(c, sandbox_id_out, delete_background);
        if (rc < 0)
            name_guest(c, sandbox_id_out);
        /* from here on the id is only shown (ExecResult.sandbox_id) */
        shown_id(sandbox_id_out, sandbox_id_out, c->cfg->key);
    }
    json_decref(view);
    return rc;
}
