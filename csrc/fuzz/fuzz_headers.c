/* Response header lines, as libcurl's header callback receives them: each line
 * is handed over in a buffer of exactly its length with no NUL after it, so a
 * read past the line is an ASan error. Oracles: the request id stays a bounded
 * C string, Retry-After is a finite delay in [0, 1e9] s, only a Content-Length
 * line reports a length, and a status line resets what the last response said. */
#include <math.h>
#include <stdint.h>
#include <strings.h>

#include "fuzz_common.h"
#include "headers.h"

static void check(const cos_meta *m)
{
    if (strnlen(m->request_id, sizeof m->request_id) >= sizeof m->request_id)
        abort();
    if (m->has_retry_after &&
        (!isfinite(m->retry_after) || m->retry_after < 0 || m->retry_after > 1e9))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cos_meta meta;
    size_t off = 0;

    memset(&meta, 0, sizeof meta);
    while (off < size) {
        const uint8_t *nl = memchr(data + off, '\n', size - off);
        size_t n = nl ? (size_t)(nl - (data + off)) + 1 : size - off;
        char *line = malloc(n ? n : 1);
        unsigned long long length = 0;
        cos_hdr_kind kind;

        if (line == NULL)
            return 0;
        memcpy(line, data + off, n);
        kind = cos_header_line(&meta, line, n, &length);
        if (kind == COS_HDR_CONTENT_LENGTH &&
            (n < 15 || strncasecmp(line, "Content-Length:", 15) != 0))
            abort();
        if (kind == COS_HDR_STATUS && (meta.request_id[0] != '\0' || meta.has_retry_after))
            abort();
        check(&meta);
        free(line);
        off += n;
    }
    return 0;
}
