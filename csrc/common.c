#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cos_err_clear(cos_err *err)
{
    memset(err, 0, sizeof *err);
}

void cos_err_set(cos_err *err, cos_kind kind, const char *fmt, ...)
{
    va_list ap;
    err->kind = kind;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

int cos_kind_is_transient(cos_kind kind)
{
    return kind == COS_E_TRANSIENT || kind == COS_E_DEADLINE;
}

cos_kind cos_kind_for_status(long status)
{
    if (status >= 200 && status < 300)
        return COS_OK;
    if (status == 404)
        return COS_E_NOTFOUND;
    if (status == 409)
        return COS_E_CONFLICT;
    if (status == 429 || status == 408 || (status >= 500 && status < 600))
        return COS_E_TRANSIENT;
    if (status >= 300 && status < 500)
        return COS_E_UNAVAILABLE;
    return COS_E_PROTOCOL;
}

int cos_buf_reserve(cos_buf *b, size_t n)
{
    size_t need = b->len + n, cap;
    char *p;
    if (n > SIZE_MAX - b->len || (b->max && need > b->max))
        return -1;
    if (need <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 1024;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (b->max && cap > b->max)
        cap = b->max;
    if ((p = realloc(b->data, cap)) == NULL)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int cos_buf_append(cos_buf *b, const void *data, size_t n)
{
    if (n == 0)
        return 0;
    if (cos_buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    return 0;
}

void cos_buf_free(cos_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

size_t cos_utf8_cut(const char *s, size_t n, size_t room)
{
    size_t k;
    if (n <= room)
        return n;
    k = room;
    /* s[k] is the first byte left out: if it continues a sequence, the
     * sequence started inside the kept part and must go too. */
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    return k;
}

int cos_outbuf_append(cos_outbuf *b, const char *s, size_t n)
{
    size_t take;
    if (b->truncated || n == 0)
        return 0;
    take = cos_utf8_cut(s, n, b->buf.max - b->buf.len);
    if (take < n)
        b->truncated = 1;
    return cos_buf_append(&b->buf, s, take);
}

int cos_exec_out_init(cos_exec_out *x, size_t max_output)
{
    memset(x, 0, sizeof *x);
    if (pthread_mutex_init(&x->mu, NULL) != 0)
        return -1;
    x->out[0].buf.max = max_output;
    x->out[1].buf.max = max_output;
    x->error.max = COS_ERROR_TEXT_MAX;
    x->exit_code = -1;
    return 0;
}

void cos_exec_out_free(cos_exec_out *x)
{
    cos_buf_free(&x->out[0].buf);
    cos_buf_free(&x->out[1].buf);
    cos_buf_free(&x->error);
    pthread_mutex_destroy(&x->mu);
}

int cos_exec_out_add_error(cos_exec_out *x, const char *s, size_t n)
{
    size_t sep = x->error.len ? 1 : 0, room;
    if (x->error.len + sep >= x->error.max)
        return 0;
    room = x->error.max - x->error.len - sep;
    if (sep && cos_buf_append(&x->error, "\n", 1) < 0)
        return -1;
    return cos_buf_append(&x->error, s, cos_utf8_cut(s, n, room));
}

int cos_exec_out_take(cos_exec_out *x, int stream, char **data, size_t *len)
{
    cos_outbuf *b = &x->out[stream];
    int rc = 0;
    *data = NULL;
    *len = 0;
    pthread_mutex_lock(&x->mu);
    if (b->buf.len > b->delivered) {
        *len = b->buf.len - b->delivered;
        *data = malloc(*len);
        if (*data == NULL) {
            *len = 0;
            rc = -1;
        } else {
            memcpy(*data, b->buf.data + b->delivered, *len);
            b->delivered = b->buf.len;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

/* The secret as it appears inside a JSON string ('/' may be escaped too). */
static size_t json_escaped(const char *secret, char *out, size_t outcap, int escape_slash)
{
    size_t n = 0;
    for (; *secret; secret++) {
        int esc = *secret == '"' || *secret == '\\' || (escape_slash && *secret == '/');
        if (n + 3 > outcap)
            return 0;
        if (esc)
            out[n++] = '\\';
        out[n++] = *secret;
    }
    out[n] = '\0';
    return n;
}

/* Length of the longest run starting at s that occurs anywhere in v. */
static size_t longest_piece(const char *s, size_t n, const char *v, size_t vlen)
{
    size_t best = 0, j, k;
    for (j = 0; j < vlen; j++) {
        if (v[j] != s[0])
            continue;
        for (k = 1; k < n && j + k < vlen && v[j + k] == s[k]; k++)
            ;
        if (k > best)
            best = k;
    }
    return best;
}

/* A run this long copied from the key counts as the key: servers that reflect
 * headers may cut them anywhere, and half a key is still a leak. */
#define SECRET_PIECE_MIN 8

void cos_sanitize(char *dst, size_t dstcap, const char *src, size_t srclen, const char *secret,
                  size_t maxchars)
{
    static const char mark[] = "[redacted]";
    static const char withheld[] = "[withheld: text cannot be redacted]";
    /* every character of the key may need an escape ('\\' or '\/') */
    char variants[3][2 * COS_KEY_MAX + 8];
    size_t vlen[3] = {0, 0, 0};
    size_t i = 0, o = 0, chars = 0, piece_min = 0;
    int cut = 0;

    if (dstcap < sizeof withheld) {
        if (dstcap)
            dst[0] = '\0';
        return;
    }
    if (secret != NULL && strlen(secret) > COS_KEY_MAX) {
        /* fail closed: a key redaction cannot cover never reaches a message */
        memcpy(dst, withheld, sizeof withheld);
        return;
    }
    if (secret != NULL && *secret != '\0') {
        vlen[0] = strlen(secret);
        memcpy(variants[0], secret, vlen[0] + 1);
        vlen[1] = json_escaped(secret, variants[1], sizeof variants[1], 0);
        vlen[2] = json_escaped(secret, variants[2], sizeof variants[2], 1);
        piece_min = vlen[0] < SECRET_PIECE_MIN ? vlen[0] : SECRET_PIECE_MIN;
    }
    while (i < srclen) {
        size_t v, matched = 0;
        unsigned char c;
        for (v = 0; v < 3 && piece_min; v++) {
            size_t m = vlen[v] ? longest_piece(src + i, srclen - i, variants[v], vlen[v]) : 0;
            if (m >= piece_min && m > matched)
                matched = m;
        }
        if (chars >= maxchars) {
            cut = 1;
            break;
        }
        if (matched) {
            if (o + sizeof mark > dstcap - 4) {
                cut = 1;
                break;
            }
            memcpy(dst + o, mark, sizeof mark - 1);
            o += sizeof mark - 1;
            i += matched;
            chars += sizeof mark - 1;
            continue;
        }
        c = (unsigned char)src[i];
        if (c >= 0x80) {
            /* copy one whole, well-formed UTF-8 sequence; a stray byte becomes '?'
             * (and never swallows the ASCII after it) */
            size_t seq = c >= 0xF8 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0, k;
            for (k = 1; k < seq; k++)
                if (i + k >= srclen || ((unsigned char)src[i + k] & 0xC0) != 0x80)
                    seq = 0;
            if (seq == 0) {
                if (o + 1 > dstcap - 4) {
                    cut = 1;
                    break;
                }
                dst[o++] = '?';
                i++;
                chars++;
                continue;
            }
            if (o + seq > dstcap - 4) {
                cut = 1;
                break;
            }
            memcpy(dst + o, src + i, seq);
            o += seq;
            i += seq;
            chars++;
            continue;
        }
        if (o + 1 > dstcap - 4) {
            cut = 1;
            break;
        }
        dst[o++] = (c < 0x20 || c == 0x7F) ? ' ' : (char)c;
        i++;
        chars++;
    }
    if (cut) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
}

void cos_wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n--)
        *v++ = 0;
}

void cos_strlcpy(char *dst, const char *src, size_t dstcap)
{
    size_t n;
    if (dstcap == 0)
        return;
    n = strlen(src);
    if (n >= dstcap)
        n = dstcap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

double cos_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

void cos_deadline_in(double ms, struct timespec *ts)
{
    double end = cos_now_ms() + (ms > 0 ? ms : 0);
    ts->tv_sec = (time_t)(end / 1000.0);
    ts->tv_nsec = (long)((end - (double)ts->tv_sec * 1000.0) * 1e6);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
    if (ts->tv_nsec < 0)
        ts->tv_nsec = 0;
}
