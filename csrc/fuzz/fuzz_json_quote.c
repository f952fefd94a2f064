/* The exec body's stdin quoting (jsonquote.c) against jansson, which wrote that field
 * before: for any bytes, cos_json_quote refuses exactly what json_stringn refuses (not
 * UTF-8), and otherwise writes the same text json_dumps writes for the string, which
 * jansson reads back as the input. A refusal leaves the buffer as it was. */
#include <jansson.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "jsonquote.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    cos_buf out = {0};
    json_t *str = json_stringn(s, size), *back = NULL;
    char *want = NULL;
    int rc;

    if (cos_buf_append(&out, "x", 1) < 0) /* something before the string */
        abort();
    rc = cos_json_quote(&out, s, size);
    if (str == NULL) {
        if (rc != COS_QUOTE_NOT_UTF8 || out.len != 1) {
            fprintf(stderr, "jansson refused the bytes, the quoter returned %d\n", rc);
            abort();
        }
        goto done;
    }
    want = json_dumps(str, JSON_COMPACT | JSON_ENCODE_ANY);
    if (rc != 0 || want == NULL || out.len != 1 + strlen(want) ||
        memcmp(out.data + 1, want, out.len - 1) != 0) {
        fprintf(stderr, "quoter: %d, %zu bytes; jansson: %zu bytes\n", rc, out.len - 1,
                want ? strlen(want) : 0);
        abort();
    }
    back = json_loadb(out.data + 1, out.len - 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (back == NULL || json_string_length(back) != size ||
        memcmp(json_string_value(back), s, size) != 0)
        abort();
done:
    json_decref(back);
    json_decref(str);
    free(want);
    cos_buf_free(&out);
    return 0;
}
