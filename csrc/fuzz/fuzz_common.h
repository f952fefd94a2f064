/* Oracles shared by the harnesses, written apart from the code they check. */
#ifndef COS_FUZZ_COMMON_H
#define COS_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define FUZZ_SECRET "sk-fuzz-SECRET/key"

static inline unsigned char fuzz_lower(unsigned char c)
{
    return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c;
}

/* Whether needle occurs in s, ASCII case ignored. */
static inline int contains_nocase(const char *s, size_t n, const char *needle, size_t k)
{
    size_t i, j;
    for (i = 0; i + k <= n; i++) {
        for (j = 0;
             j < k && fuzz_lower((unsigned char)s[i + j]) == fuzz_lower((unsigned char)needle[j]);
             j++)
            ;
        if (j == k)
            return 1;
    }
    return 0;
}

/* No run of 8 characters of the secret, in any case, may reach a message. */
static inline void assert_no_secret_in(const char *s, size_t n, const char *secret)
{
    size_t i, k = strlen(secret), piece = k < 8 ? k : 8;
    for (i = 0; piece && i + piece <= k; i++) {
        if (contains_nocase(s, n, secret + i, piece)) {
            fprintf(stderr, "secret piece \"%.*s\" leaked into: %.*s\n", (int)piece, secret + i,
                    (int)n, s);
            abort();
        }
    }
}

static inline void assert_no_secret(const char *s)
{
    assert_no_secret_in(s, strlen(s), FUZZ_SECRET);
}

/* Strict UTF-8 (RFC 3629): each sequence decoded, then refused when overlong,
 * a UTF-16 surrogate or beyond U+10FFFF. What jansson hands out, what a cut
 * must keep, and what the sanitizer must produce whatever its input. */
static inline int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        unsigned long cp;
        size_t len, k;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + len > n)
            return 0;
        for (k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
            return 0; /* overlong */
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return 0;
        i += len;
    }
    return 1;
}

/* Text fit for a log line: valid UTF-8 without C0/C1 controls, DEL or U+2028/9. */
static inline void assert_clean_text(const char *s, size_t n)
{
    size_t i;
    if (!utf8_valid((const unsigned char *)s, n)) {
        fprintf(stderr, "not valid UTF-8: %.*s\n", (int)n, s);
        abort();
    }
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7F || (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] < 0xA0) ||
            (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
             ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9))) {
            fprintf(stderr, "control character at %zu in: %.*s\n", i, (int)n, s);
            abort();
        }
    }
}

#endif
