#include "jsonquote.h"

#include <stdint.h>
#include <string.h>

/* Bytes of a valid UTF-8 sequence that starts at s[0] (at most n long), or 0. The
 * checks of RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* The second character of the two-character escapes (jansson's spelling); the
 * other bytes that need an escape take \u00XX. */
static const char named[0x60] = {['"'] = '"',  ['\\'] = '\\', ['\b'] = 'b', ['\f'] = 'f',
                                 ['\n'] = 'n', ['\r'] = 'r',  ['\t'] = 't'};

/* Whether JSON takes the byte as is: ASCII but controls, '"' and '\\', and the bytes
 * of UTF-8 sequences (checked apart). */
static int plain(unsigned char c)
{
    return c >= 0x20 && c != '"' && c != '\\';
}

/* The escape of a byte that is not plain, at seq; its length. */
static size_t escape(unsigned char c, char *seq)
{
    static const char hex[] = "0123456789ABCDEF";
    seq[0] = '\\';
    if (named[c] != 0) {
        seq[1] = named[c];
        return 2;
    }
    memcpy(seq + 1, "u00", 3);
    seq[4] = hex[c >> 4];
    seq[5] = hex[c & 0xF];
    return 6;
}

/* Two passes: the first checks the UTF-8 and counts what the escapes add, so the
 * second writes into room reserved once. */
int cos_json_quote(cos_buf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, extra = 0, run = 0, len;
    int rc = COS_QUOTE_NOT_UTF8;
    char *w;

    while (i < n) {
        if (u[i] >= 0x80) {
            if ((len = utf8_seq(u + i, n - i)) == 0)
                goto done;
            i += len;
            continue;
        }
        if (!plain(u[i]))
            extra += named[u[i]] != 0 ? 1 : 5;
        i++;
    }
    rc = COS_QUOTE_NOMEM;
    if (n > SIZE_MAX / 6 - 1 || cos_buf_reserve(out, n + extra + 2) < 0)
        goto done;
    w = out->data + out->len;
    *w++ = '"';
    for (i = 0; i < n; i++) { /* runs of plain bytes are copied whole */
        if (!plain(u[i])) {
            memcpy(w, s + run, i - run);
            w += i - run;
            w += escape(u[i], w);
            run = i + 1;
        }
    }
    memcpy(w, s + run, n - run);
    w += n - run;
    *w++ = '"';
    out->len = (size_t)(w - out->data);
    rc = 0;
done:
    return rc;
}
