/* The one sanitizer (cos_sanitize, cos_sanitize_buf) on arbitrary bytes, with the
 * fuzz secret and with a secret of 3 characters. Oracles: the output is valid UTF-8
 * with no control, line separator or bidi formatting character, holds no run of 8
 * characters of the secret (the whole short secret) in any case, stays within its buffer
 * and its character count. cos_sanitize_unchanged says 1 exactly when cos_sanitize gives
 * the text back as it is. Its redaction alone (cos_redact, for success answers): no run
 * of the secret in its output, none in a text it leaves alone, and every byte that is
 * not a run's kept in order, NUL and controls included. */
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

/* Whether out is src with some stretches replaced by the mark: the bytes between marks
 * are src's, in order. */
static int only_marks_added(const char *out, size_t olen, const char *src, size_t n)
{
    static const char mark[] = "[redacted]";
    size_t i = 0, j = 0;
    while (i < olen) {
        if (olen - i >= sizeof mark - 1 && memcmp(out + i, mark, sizeof mark - 1) == 0) {
            i += sizeof mark - 1;
            continue; /* a run: src moves on by some bytes, found by the next match */
        }
        if (olen - i == 3 && memcmp(out + i, "...", 3) == 0)
            return 1; /* the cut */
        while (j < n && src[j] != out[i])
            j++;
        if (j == n)
            return 0;
        i++;
        j++;
    }
    return 1;
}

static void check_redact(const char *src, size_t n, const char *secret)
{
    cos_buf b = {0};
    char *dst;
    int rc = cos_redact(&b, src, n, secret), same = cos_sanitize_unchanged(src, n, secret);
    if (rc == 0) {
        assert_no_secret_in(src, n, secret);
    } else if (rc == 1) {
        assert_no_secret_in(b.data, b.len, secret);
        if (b.len > 5 * n + 64 || !only_marks_added(b.data, b.len, src, n))
            abort();
    }
    cos_buf_free(&b);
    if (same >= 0 && (dst = malloc(n * 10 + 64)) != NULL) {
        cos_sanitize(dst, n * 10 + 64, src, n, secret, n);
        if (same != (strlen(dst) == n && memcmp(dst, src, n) == 0))
            abort();
        free(dst);
    }
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
    check_redact((const char *)data, size, FUZZ_SECRET);
    check_redact((const char *)data, size, "K9z");
    return 0;
}
