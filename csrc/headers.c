#include "headers.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A NUL-terminated copy of v[0..n), trimmed, cut to cap - 1 bytes. */
static void set_header_value(char *dst, size_t cap, const char *v, size_t n)
{
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    while (n > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

/* Seconds as "digits[.digits]" below 1e9; -1 for anything else. A parse of our
 * own: strtod follows the locale's decimal point. */
static double parse_seconds(const char *s)
{
    double v = 0, scale = 1;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++, digits++)
        if ((v = v * 10 + (*s - '0')) >= 1e9)
            return -1;
    if (*s == '.')
        for (s++; *s >= '0' && *s <= '9'; s++, digits++)
            v += (*s - '0') * (scale /= 10);
    return digits > 0 && *s == '\0' ? v : -1;
}

/* Retry-After: delta-seconds or an HTTP date. */
static void parse_retry_after(cos_meta *m, const char *v, size_t n)
{
    char tmp[128];
    double secs;
    time_t when;

    set_header_value(tmp, sizeof tmp, v, n);
    if (tmp[0] == '\0')
        return;
    if ((secs = parse_seconds(tmp)) >= 0) {
        m->retry_after = secs;
        m->has_retry_after = 1;
        return;
    }
    when = curl_getdate(tmp, NULL);
    if (when != (time_t)-1) {
        double d = difftime(when, time(NULL));
        m->retry_after = d > 0 ? (d < 1e9 ? d : 1e9) : 0;
        m->has_retry_after = 1;
    }
}

static int header_is(const char *line, size_t n, const char *name, const char **value, size_t *vlen)
{
    size_t k = strlen(name);
    if (n <= k || line[k] != ':' || !cos_ascii_caseeq(line, name, k))
        return 0;
    *value = line + k + 1;
    *vlen = n - k - 1;
    return 1;
}

/* Content-Length: digits only (no sign, no garbage after them) and no overflow. */
static int parse_length(const char *v, size_t n, unsigned long long *out)
{
    char tmp[64];
    char *end;

    set_header_value(tmp, sizeof tmp, v, n);
    if (tmp[0] < '0' || tmp[0] > '9')
        return 0;
    errno = 0;
    *out = strtoull(tmp, &end, 10);
    return *end == '\0' && errno == 0;
}

cos_hdr_kind cos_header_line(cos_meta *meta, const char *line, size_t n,
                             unsigned long long *content_length)
{
    const char *v;
    size_t vn;
    cos_hdr_kind kind = COS_HDR_OTHER;

    if (n >= 5 && memcmp(line, "HTTP/", 5) == 0) {
        char status[64];
        const char *sp;
        set_header_value(status, sizeof status, line, n);
        memset(meta, 0, sizeof *meta);
        sp = strchr(status, ' ');
        if (sp != NULL)
            meta->status = strtol(sp + 1, NULL, 10);
        kind = COS_HDR_STATUS;
    } else if (header_is(line, n, "X-Request-Id", &v, &vn)) {
        set_header_value(meta->request_id, sizeof meta->request_id, v, vn);
    } else if (header_is(line, n, "X-Fc-Request-Id", &v, &vn)) {
        if (meta->request_id[0] == '\0')
            set_header_value(meta->request_id, sizeof meta->request_id, v, vn);
    } else if (header_is(line, n, "Retry-After", &v, &vn)) {
        parse_retry_after(meta, v, vn);
    } else if (header_is(line, n, "Content-Length", &v, &vn)) {
        if (parse_length(v, vn, content_length))
            kind = COS_HDR_CONTENT_LENGTH;
    } else if ((n == 2 && line[0] == '\r' && line[1] == '\n') || (n == 1 && line[0] == '\n')) {
        kind = COS_HDR_END;
    }
    return kind;
}
