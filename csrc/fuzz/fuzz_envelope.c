/* JSend envelopes, error bodies and pagination, as the server sends them. */
#include <jansson.h>
#include <stdint.h>

#include "envelope.h"
#include "fuzz_common.h"

static const long statuses[] = {200, 204, 205, 400, 401, 404, 409, 429, 500, 503, 302, 100};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cos_meta meta;
    cos_err err;
    json_t *payload = NULL, *items = NULL;
    long long total;

    if (size < 1)
        return 0;
    memset(&meta, 0, sizeof meta);
    meta.status = statuses[data[0] % (sizeof statuses / sizeof statuses[0])];
    /* a request id built from the input, secret included when asked */
    if (data[0] & 0x80)
        snprintf(meta.request_id, sizeof meta.request_id, "rid-%s", FUZZ_SECRET);
    data++;
    size--;
    cos_err_clear(&err);
    if (cos_envelope_parse("fuzz", &meta, (const char *)data, size, 1, FUZZ_SECRET, &err,
                           &payload) == 0) {
        if (payload == NULL)
            abort();
        if (cos_page_items("fuzz", payload, "sandboxes", &items, &total, &err) == 0) {
            if (!json_is_array(items))
                abort();
            json_decref(items);
        }
        json_decref(payload);
    } else {
        if (payload != NULL || err.kind == COS_OK || err.msg[0] == '\0')
            abort();
    }
    assert_no_secret(err.msg);
    assert_no_secret(err.request_id);
    assert_no_secret(err.code);
    assert_clean_text(err.msg, strlen(err.msg));
    assert_clean_text(err.code, strlen(err.code));
    /* every error response also goes through the error path alone */
    cos_err_clear(&err);
    meta.status = 400 + (long)(size % 200);
    cos_error_from_response("fuzz", &meta, (const char *)data, size, FUZZ_SECRET, &err);
    assert_no_secret(err.msg);
    assert_clean_text(err.msg, strlen(err.msg));
    if (strlen(err.msg) >= sizeof err.msg)
        abort();
    return 0;
}
