#include "jsonquote.h"

#include <stdint.h>
#include <string.h>

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
            if ((len = cos_utf8_seq(u + i, n - i)) == 0)
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
