/* The one sanitizer (cos_sanitize, cos_sanitize_buf) on arbitrary bytes, with the
 * fuzz secret and with a secret of 3 characters. Oracles: the output is valid UTF-8
 * with no control character, holds no run of 8 characters of the secret (the whole
 * short secret) in any case, stays within its buffer and its character count. */
#include <stdint.h>

#include "fuzz_common.h"

static size_t utf8_chars(const char *s, size_t n)
{
    size_t i, c = 0;
    for (i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static void check(const char *src, size_t n, const char *secret, size_t dstcap, size_t maxchars)
{
    char *dst = malloc(dstcap);
    cos_buf b = {0};
    size_t len;
    if (dst == NULL)
        return;
    cos_sanitize(dst, dstcap, src, n, secret, maxchars);
    len = strlen(dst);
    if (len >= dstcap || utf8_chars(dst, len) > maxchars + 3)
        abort();
    assert_clean_text(dst, len);
    assert_no_secret_in(dst, len, secret);
    if (cos_sanitize_buf(&b, src, n, secret, maxchars) == 0) {
        if (b.len != strlen(b.data) || utf8_chars(b.data, b.len) > maxchars + 3)
            abort();
        assert_clean_text(b.data, b.len);
        assert_no_secret_in(b.data, b.len, secret);
        /* when the whole output fits in dst with room for any step (10 bytes) and
         * "..." + NUL, the fixed-size variant is never cut by its size: same text */
        if (b.len + 14 <= dstcap && strcmp(dst, b.data) != 0)
            abort();
    }
    cos_buf_free(&b);
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t dstcap, maxchars;
    if (size < 2)
        return 0;
    dstcap = 40 + (size_t)data[0] * 4;
    maxchars = (size_t)data[1] * 2;
    data += 2;
    size -= 2;
    check((const char *)data, size, FUZZ_SECRET, dstcap, maxchars);
    check((const char *)data, size, "K9z", dstcap, maxchars);
    return 0;
}
