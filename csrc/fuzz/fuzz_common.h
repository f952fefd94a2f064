/* Oracles shared by the harnesses. */
#ifndef COS_FUZZ_COMMON_H
#define COS_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define FUZZ_SECRET "sk-fuzz-SECRET/key"

/* No run of 8 bytes of the secret may reach a message. */
static inline void assert_no_secret(const char *s)
{
    const char *secret = FUZZ_SECRET;
    size_t i, n = strlen(secret);
    char piece[9];
    for (i = 0; i + 8 <= n; i++) {
        memcpy(piece, secret + i, 8);
        piece[8] = '\0';
        if (strstr(s, piece) != NULL) {
            fprintf(stderr, "secret piece \"%s\" leaked into: %s\n", piece, s);
            abort();
        }
    }
}

/* Well-formed UTF-8 (what jansson hands out, and what a cut must keep). */
static inline int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        size_t k;
        if (len == 0 || i + len > n)
            return 0;
        for (k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += len;
    }
    return 1;
}

#endif
