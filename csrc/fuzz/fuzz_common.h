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

/* Whether the code point cp reorders the text shown around it (Unicode's Bidi_Control). */
static inline int is_bidi_control(unsigned long cp)
{
    return cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

/* Text fit for a log line: valid UTF-8 without C0/C1 controls, DEL, U+2028/9 or a
 * bidirectional formatting character. Decoded here, apart from the sanitizer's tables. */
static inline void assert_clean_text(const char *s, size_t n)
{
    size_t i = 0;
    if (!utf8_valid((const unsigned char *)s, n)) {
        fprintf(stderr, "not valid UTF-8: %.*s\n", (int)n, s);
        abort();
    }
    while (i < n) {
        const unsigned char *u = (const unsigned char *)s + i;
        unsigned long cp;
        size_t len = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
        cp = len == 1   ? u[0]
             : len == 2 ? ((u[0] & 0x1Ful) << 6) | (u[1] & 0x3Fu)
             : len == 3 ? ((u[0] & 0x0Ful) << 12) | ((u[1] & 0x3Ful) << 6) | (u[2] & 0x3Fu)
                        : ((u[0] & 0x07ul) << 18) | ((u[1] & 0x3Ful) << 12) |
                              ((u[2] & 0x3Ful) << 6) | (u[3] & 0x3Fu);
        if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0) || cp == 0x2028 || cp == 0x2029 ||
            is_bidi_control(cp)) {
            fprintf(stderr, "control character U+%04lX at %zu in: %.*s\n", cp, i, (int)n, s);
            abort();
        }
        i += len;
    }
}

#endif
