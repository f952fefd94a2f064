/* The buffered exec answer: envelope -> result fields -> capped output. */
#include <jansson.h>
#include <stdint.h>

#include "envelope.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cos_meta meta;
    cos_err err;
    cos_exec_out xo;
    json_t *payload = NULL;
    size_t cap;

    if (size < 1)
        return 0;
    cap = data[0] * 3u; /* small caps make cuts likely */
    data++;
    size--;
    memset(&meta, 0, sizeof meta);
    meta.status = 200;
    cos_err_clear(&err);
    if (cos_exec_out_init(&xo, cap) != 0)
        abort();
    if (cos_envelope_parse("exec", &meta, (const char *)data, size, 0, FUZZ_SECRET, &err,
                           &payload) == 0) {
        if (json_is_object(payload) && cos_exec_result_parse("exec", payload, &xo, &err) == 0) {
            int s;
            for (s = 0; s < 2; s++) {
                if (xo.out[s].buf.len > cap)
                    abort();
                /* jansson strings are valid UTF-8; a cut must keep them so */
                if (!utf8_valid((const unsigned char *)xo.out[s].buf.data, xo.out[s].buf.len))
                    abort();
            }
            if (xo.error.len > COS_ERROR_TEXT_MAX)
                abort();
            /* what Python gets: the error text sealed (sanitized) */
            if (cos_exec_out_seal(&xo, FUZZ_SECRET) == 0) {
                assert_clean_text(xo.error.data, xo.error.len);
                assert_no_secret_in(xo.error.data, xo.error.len, FUZZ_SECRET);
            }
        }
        json_decref(payload);
    }
    assert_no_secret(err.msg);
    assert_clean_text(err.msg, strlen(err.msg));
    cos_exec_out_free(&xo);
    return 0;
}
