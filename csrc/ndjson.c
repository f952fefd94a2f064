#include "ndjson.h"

#include <jansson.h>

#include "jsonload.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cos_ndjson_init(cos_ndjson *p, size_t max_line, cos_frame_fn fn, void *ud)
{
    memset(p, 0, sizeof *p);
    p->line.max = max_line ? max_line : COS_NDJSON_MAX_LINE;
    p->fn = fn;
    p->ud = ud;
}

void cos_ndjson_free(cos_ndjson *p)
{
    cos_buf_free(&p->line);
}

static int fail(cos_ndjson *p, const char *msg)
{
    p->failed = 1;
    snprintf(p->errmsg, sizeof p->errmsg, "%s (frame %zu)", msg, p->frames + p->heartbeats + 1);
    return COS_ND_PROTOCOL;
}

static int starts_with(const char *s, size_t n, const char *prefix)
{
    size_t k = strlen(prefix);
    return n >= k && memcmp(s, prefix, k) == 0;
}

static int emit_text(cos_ndjson *p, cos_frame_kind kind, json_t *v)
{
    return p->fn(p->ud, kind, json_string_value(v), json_string_length(v), 0) ? COS_ND_STOPPED
                                                                              : COS_ND_OK;
}

static int handle_line(cos_ndjson *p, const char *s, size_t n)
{
    json_t *frame, *hb, *so, *se, *er, *ec;
    json_error_t jerr;
    int rc = COS_ND_OK, refused = 0;

    if (n > 0 && s[n - 1] == '\r')
        n--;
    /* SSE framing: comments and non-data fields are skipped */
    if (n > 0 && s[0] == ':')
        return COS_ND_OK;
    if (starts_with(s, n, "event:") || starts_with(s, n, "id:") || starts_with(s, n, "retry:"))
        return COS_ND_OK;
    if (starts_with(s, n, "data:")) {
        s += 5;
        n -= 5;
        if (n > 0 && s[0] == ' ') {
            s++;
            n--;
        }
    }
    while (n > 0 && (s[0] == ' ' || s[0] == '\t')) {
        s++;
        n--;
    }
    if (n == 0)
        return COS_ND_OK;

    frame = cos_json_load(s, n, JSON_ALLOW_NUL, 0, &jerr, &refused);
    if (frame == NULL)
        return fail(p, refused ? "stream line too complex to parse within memory bounds"
                               : "stream line is not JSON");
    if (!json_is_object(frame)) {
        rc = fail(p, "stream line is not a JSON object");
        goto done;
    }
    hb = json_object_get(frame, "hb");
    so = json_object_get(frame, "stdout");
    se = json_object_get(frame, "stderr");
    er = json_object_get(frame, "error");
    ec = json_object_get(frame, "exit_code");
    if ((hb && !json_is_boolean(hb) && !json_is_null(hb)) ||
        (so && !json_is_string(so) && !json_is_null(so)) ||
        (se && !json_is_string(se) && !json_is_null(se)) ||
        (er && !json_is_string(er) && !json_is_null(er)) ||
        (ec && !json_is_integer(ec) && !json_is_null(ec))) {
        rc = fail(p, "stream frame has a field of the wrong type");
        goto done;
    }
    if (hb && !so && !se && !er && !ec) {
        p->heartbeats++;
        goto done;
    }
    p->frames++;
    /* documented order within one frame: hb, stdout, stderr, error, exit_code */
    if (json_is_string(so) && (rc = emit_text(p, COS_FRAME_STDOUT, so)) != COS_ND_OK)
        goto done;
    if (json_is_string(se) && (rc = emit_text(p, COS_FRAME_STDERR, se)) != COS_ND_OK)
        goto done;
    if (json_is_string(er) && (rc = emit_text(p, COS_FRAME_ERROR, er)) != COS_ND_OK)
        goto done;
    if (json_is_integer(ec) && p->fn(p->ud, COS_FRAME_EXIT, NULL, 0, json_integer_value(ec)))
        rc = COS_ND_STOPPED;
done:
    json_decref(frame);
    return rc;
}

static int buffer_piece(cos_ndjson *p, const char *data, size_t n)
{
    if (n > p->line.max - p->line.len)
        return fail(p, "stream line longer than the limit");
    return cos_buf_append(&p->line, data, n) < 0 ? COS_ND_NOMEM : COS_ND_OK;
}

int cos_ndjson_feed(cos_ndjson *p, const char *data, size_t n)
{
    int rc;
    if (p->failed)
        return COS_ND_PROTOCOL;
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t piece = nl ? (size_t)(nl - data) : n;
        if (nl == NULL)
            return buffer_piece(p, data, piece);
        if (p->line.len == 0) {
            /* the whole line is in this chunk: parse it in place */
            if (piece > p->line.max)
                return fail(p, "stream line longer than the limit");
            rc = handle_line(p, data, piece);
        } else {
            if ((rc = buffer_piece(p, data, piece)) != COS_ND_OK)
                return rc;
            rc = handle_line(p, p->line.data, p->line.len);
            p->line.len = 0;
        }
        if (rc != COS_ND_OK)
            return rc;
        data += piece + 1;
        n -= piece + 1;
    }
    return COS_ND_OK;
}

int cos_ndjson_finish(cos_ndjson *p)
{
    int rc;
    if (p->failed)
        return COS_ND_PROTOCOL;
    if (p->line.len == 0)
        return COS_ND_OK;
    rc = handle_line(p, p->line.data, p->line.len);
    p->line.len = 0;
    return rc;
}
