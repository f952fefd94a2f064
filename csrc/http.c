#include "http.h"

#include "headers.h"

#include <stdlib.h>
#include <string.h>

char *cos_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s), o = 0, i;
    char *out = malloc(n * 3 + 1);
    if (out == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (cos_ascii_alnum(c) || c == '-' || c == '_' || c == '~') {
            out[o++] = (char)c;
        } else {
            /* '.' too: ".." must never become a dot segment */
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
    return out;
}

static int is_2xx(long status)
{
    return status >= 200 && status < 300;
}

static size_t header_cb(char *line, size_t size, size_t nitems, void *ud)
{
    cos_req *r = ud;
    size_t n = size * nitems;
    unsigned long long length = 0;

    switch (cos_header_line(&r->meta, line, n, &length)) {
    case COS_HDR_STATUS:
        /* a new response (after a 1xx, say): what the last one said no longer holds */
        atomic_store(&r->stream_started, 0);
        break;
    case COS_HDR_CONTENT_LENGTH:
        if (r->mode != COS_RESP_STREAM && is_2xx(r->meta.status) &&
            length > (unsigned long long)r->body_cap) {
            r->declared_over_cap = 1;
            return 0; /* refuse before a byte of the body */
        }
        break;
    case COS_HDR_END:
        if (r->mode == COS_RESP_STREAM && is_2xx(r->meta.status))
            atomic_store(&r->stream_started, 1);
        break;
    default:
        break;
    }
    return n;
}

static size_t write_cb(char *data, size_t size, size_t nmemb, void *ud)
{
    cos_req *r = ud;
    size_t n = size * nmemb;

    r->bytes_in += (curl_off_t)n;
    if (!is_2xx(r->meta.status)) {
        /* error bodies are only read for their message: keep the start */
        size_t room = r->body.len < COS_ERROR_BODY_MAX ? COS_ERROR_BODY_MAX - r->body.len : 0;
        if (room > 0 && cos_buf_append(&r->body, data, n < room ? n : room) < 0) {
            r->write_failed = 1;
            return 0;
        }
        return n;
    }
    if (r->mode == COS_RESP_STREAM) {
        int rc = COS_ND_STOPPED;
        int notify = 0;
        pthread_mutex_lock(&r->mu);
        if (!r->abandoned) {
            pthread_mutex_lock(&r->xo->mu);
            rc = cos_ndjson_feed(&r->nd, data, n);
            pthread_mutex_unlock(&r->xo->mu);
            notify = r->notify_output;
        }
        pthread_mutex_unlock(&r->mu);
        if (notify) {
            /* the request lives until the driver (this thread) completes it */
            pthread_mutex_lock(r->handshake);
            r->progress = 1;
            pthread_cond_signal(&r->cv);
            pthread_mutex_unlock(r->handshake);
        }
        if (rc != COS_ND_OK) {
            r->nd_rc = rc;
            return 0;
        }
        return n;
    }
    if (n > r->body_cap - r->body.len) {
        r->over_cap = 1;
        return 0; /* abort as soon as the cap is passed */
    }
    if (cos_buf_append(&r->body, data, n) < 0) {
        r->write_failed = 1;
        return 0;
    }
    return n;
}

/* The PUT body, from the caller's file or memory. */
static size_t read_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    cos_req *r = ud;
    size_t want = size * nitems, got = CURL_READFUNC_ABORT;
    pthread_mutex_lock(&r->mu);
    if (r->abandoned) {
        /* the owner is gone, and its memory with it */
    } else if (r->upload != NULL) {
        got = fread(buf, 1, want, r->upload);
        if (got == 0 && ferror(r->upload))
            got = CURL_READFUNC_ABORT;
    } else {
        curl_off_t left = r->upload_size - r->upload_pos;
        got = (curl_off_t)want < left ? want : (size_t)left;
        memcpy(buf, r->upload_mem + r->upload_pos, got);
        r->upload_pos += (curl_off_t)got;
    }
    pthread_mutex_unlock(&r->mu);
    return got;
}

/* libcurl rewinds the body to send it again (a reused connection that died). */
static int seek_cb(void *ud, curl_off_t offset, int origin)
{
    cos_req *r = ud;
    int rc = CURL_SEEKFUNC_CANTSEEK;
    if (origin != SEEK_SET || offset < 0 || offset > r->upload_size)
        return rc;
    pthread_mutex_lock(&r->mu);
    if (r->abandoned) {
        rc = CURL_SEEKFUNC_FAIL;
    } else if (r->upload != NULL) {
        rc =
            fseeko(r->upload, (off_t)offset, SEEK_SET) == 0 ? CURL_SEEKFUNC_OK : CURL_SEEKFUNC_FAIL;
    } else {
        r->upload_pos = offset;
        rc = CURL_SEEKFUNC_OK;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static int xferinfo_cb(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    cos_req *r = ud;
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    return atomic_load(&r->cancel) ? 1 : 0;
}

/* Stream frames land in the exec output; called with xo->mu held. */
static int frame_cb(void *ud, cos_frame_kind kind, const char *data, size_t len, long long code)
{
    cos_exec_out *xo = ud;
    xo->frames++;
    switch (kind) {
    case COS_FRAME_STDOUT:
        return cos_outbuf_append(&xo->out[0], data, len);
    case COS_FRAME_STDERR:
        return cos_outbuf_append(&xo->out[1], data, len);
    case COS_FRAME_ERROR:
        return cos_exec_out_add_error(xo, data, len);
    case COS_FRAME_EXIT:
        xo->exit_code = code;
        xo->has_exit = 1;
        return 0;
    }
    return 0;
}

/* Append one line; on failure the list is left as it was (and freed by its owner). */
static int add_line(struct curl_slist **list, const char *line)
{
    struct curl_slist *n = curl_slist_append(*list, line);
    if (n == NULL)
        return -1;
    *list = n;
    return 0;
}

static int add_header(struct curl_slist **list, const char *name, const char *value)
{
    char line[1024];
    int rc = -1;
    if ((size_t)snprintf(line, sizeof line, "%s: %s", name, value) < sizeof line)
        rc = add_line(list, line);
    cos_wipe(line, sizeof line); /* it may hold the key */
    return rc;
}

/* The header lines hold the key: wipe them before they go back to the allocator. */
static void free_headers(struct curl_slist *list)
{
    struct curl_slist *n;
    for (n = list; n != NULL; n = n->next)
        if (n->data != NULL)
            cos_wipe(n->data, strlen(n->data));
    curl_slist_free_all(list);
}

/* The request's header lines: the key, what it accepts and what it sends.
 * -1 on ENOMEM (the lines made so far are freed with the request). */
static int build_headers(cos_req *r, const cos_cfg *cfg, const cos_req_spec *spec)
{
    /* "Content-Type:" without a value stops libcurl adding a form type */
    if (add_header(&r->headers, "X-Api-Key", cfg->key) < 0 ||
        add_header(&r->headers, "Accept", spec->accept ? spec->accept : "application/json") < 0 ||
        (spec->content_type ? add_header(&r->headers, "Content-Type", spec->content_type)
                            : add_line(&r->headers, "Content-Type:")) < 0 ||
        add_line(&r->headers, "Expect:") < 0)
        return -1;
    return 0;
}

/* What every request shares: protocols, TLS, proxies, deadlines, callbacks. */
static CURLcode set_transport(CURL *easy, cos_req *r, const cos_cfg *cfg, CURLSH *share,
                              long timeout_ms)
{
    CURLcode c = CURLE_OK;
    c |= curl_easy_setopt(easy, CURLOPT_URL, r->url);
    c |= curl_easy_setopt(easy, CURLOPT_PRIVATE, r);
    c |= curl_easy_setopt(easy, CURLOPT_HTTPHEADER, r->headers);
    c |= curl_easy_setopt(easy, CURLOPT_USERAGENT, cfg->user_agent);
    c |= curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    c |= curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
#if COS_HAVE_PROTOCOLS_STR
    c |= curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    c |= curl_easy_setopt(easy, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    c |= curl_easy_setopt(easy, CURLOPT_PATH_AS_IS, 1L);
    c |= curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms > 0 ? timeout_ms : 1L);
    c |= curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, cfg->connect_ms);
    c |= curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    c |= curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);
    c |= curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    /* The key never crosses a proxy in clear: plain http (loopback only) goes
     * direct whatever http_proxy/ALL_PROXY say (the empty string disables the
     * environment's proxies). https honours them: CONNECT keeps TLS end to end. */
    if (cfg->plain_http)
        c |= curl_easy_setopt(easy, CURLOPT_PROXY, "");
    /* an HTTPS proxy's "200 Connection established" is not the control plane's
     * answer: its headers never reach header_cb (7.54), so they can neither start a
     * stream nor fill the response's status, request id or Retry-After */
    c |= curl_easy_setopt(easy, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
#if COS_HAVE_QUICK_EXIT
    /* a stuck resolver thread is abandoned, not joined: the driver never waits
     * for getaddrinfo past a deadline or a cancel (older libcurl joins it: the
     * driving thread, and so its own call, waits for getaddrinfo; calls waiting
     * behind it still end at their deadline through their backstop) */
    c |= curl_easy_setopt(easy, CURLOPT_QUICK_EXIT, 1L);
#endif
    c |= curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
    c |= curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
    if (cfg->ca_file != NULL) {
        /* an HTTPS proxy's certificate is checked against the same bundle (else libcurl's
         * compiled-in path: Debian's in the self-contained wheel, wrong on RHEL or SUSE); a
         * libcurl without proxy support refuses the option, and has no proxy to check */
        CURLcode pc = curl_easy_setopt(easy, CURLOPT_PROXY_CAINFO, cfg->ca_file);
        c |= curl_easy_setopt(easy, CURLOPT_CAINFO, cfg->ca_file);
        if (pc != CURLE_UNKNOWN_OPTION && pc != CURLE_NOT_BUILT_IN)
            c |= pc;
    }
    if (share != NULL)
        c |= curl_easy_setopt(easy, CURLOPT_SHARE, share);
    c |= curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, r->errbuf);
    c |= curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, header_cb);
    c |= curl_easy_setopt(easy, CURLOPT_HEADERDATA, r);
    c |= curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, write_cb);
    c |= curl_easy_setopt(easy, CURLOPT_WRITEDATA, r);
    c |= curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
    c |= curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, xferinfo_cb);
    c |= curl_easy_setopt(easy, CURLOPT_XFERINFODATA, r);
    return c;
}

/* The method, and the body it sends: a PUT streamed from the caller's file or
 * memory (through read_cb), or a copy (nothing sent is the caller's memory). */
static CURLcode set_method(CURL *easy, cos_req *r, const cos_req_spec *spec)
{
    CURLcode c = CURLE_OK;
    if (spec->upload != NULL || spec->upload_mem != NULL) {
        c |= curl_easy_setopt(easy, CURLOPT_UPLOAD, 1L);
        c |= curl_easy_setopt(easy, CURLOPT_READFUNCTION, read_cb);
        c |= curl_easy_setopt(easy, CURLOPT_READDATA, r);
        c |= curl_easy_setopt(easy, CURLOPT_SEEKFUNCTION, seek_cb);
        c |= curl_easy_setopt(easy, CURLOPT_SEEKDATA, r);
        c |= curl_easy_setopt(easy, CURLOPT_INFILESIZE_LARGE, spec->upload_size);
        c |= curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, spec->method);
    } else if (strcmp(spec->method, "GET") == 0) {
        c |= curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
    } else if (strcmp(spec->method, "DELETE") == 0 && spec->body == NULL) {
        c |= curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, "DELETE");
    } else {
        c |= curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)spec->body_len);
        c |= curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, spec->body ? spec->body : "");
        c |= curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, spec->method);
    }
    return c;
}

cos_req *cos_req_new(const cos_cfg *cfg, CURL *easy, CURLSH *share, const cos_req_spec *spec,
                     cos_err *err)
{
    cos_req *r = calloc(1, sizeof *r);
    pthread_condattr_t ca;

    if (r == NULL)
        goto nomem;
    r->easy = easy;
    r->mode = spec->mode;
    r->body_cap = spec->body_cap;
    r->timeout_ms = spec->timeout_ms;
    r->upload = spec->upload;
    r->upload_mem = spec->upload_mem;
    r->upload_size = spec->upload_size;
    r->xo = spec->xo;
    r->notify_output = spec->notify_output;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (r->mode == COS_RESP_STREAM)
        cos_ndjson_init(&r->nd, COS_NDJSON_MAX_LINE, frame_cb, r->xo);
    if ((r->url = strdup(spec->url)) == NULL || build_headers(r, cfg, spec) < 0)
        goto nomem;
    if (set_transport(easy, r, cfg, share, spec->timeout_ms) != CURLE_OK ||
        set_method(easy, r, spec) != CURLE_OK) {
        cos_err_set(err, COS_E_CONFIG, "could not configure the request (libcurl option refused)");
        goto error;
    }
    return r;
nomem:
    cos_err_set(err, COS_E_NOMEM, "out of memory");
error:
    cos_req_free(r);
    return NULL;
}

CURL *cos_req_free(cos_req *r)
{
    CURL *easy;
    if (r == NULL)
        return NULL;
    easy = r->easy;
    free_headers(r->headers);
    free(r->url);
    cos_buf_free(&r->body);
    free(r->outcome); /* not recorded (a delete retried, or never sent): holds nothing */
    if (r->mode == COS_RESP_STREAM)
        cos_ndjson_free(&r->nd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    return easy;
}
