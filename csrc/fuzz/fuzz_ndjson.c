/* The streaming exec body, fed in chunkings chosen by the input. Oracle: the
 * frames (and the verdict) do not depend on how the bytes were chunked. */
#include <stdint.h>

#include "fuzz_common.h"
#include "ndjson.h"

#define MAX_LINE 4096

typedef struct {
    unsigned long long hash;
    size_t frames;
} digest;

static int on_frame(void *ud, cos_frame_kind kind, const char *data, size_t len, long long code)
{
    digest *d = ud;
    size_t i;
    if (kind != COS_FRAME_EXIT && !utf8_valid((const unsigned char *)data, len))
        abort();
    d->hash = d->hash * 1000003u + (unsigned)kind + 1;
    for (i = 0; i < len; i++)
        d->hash = d->hash * 131u + (unsigned char)data[i];
    d->hash = d->hash * 31u + (unsigned long long)code;
    d->frames++;
    return 0;
}

static int parse(const uint8_t *data, size_t size, const uint8_t *cuts, size_t ncuts, digest *d)
{
    cos_ndjson p;
    size_t off = 0, k = 0;
    int rc = COS_ND_OK;
    cos_ndjson_init(&p, MAX_LINE, on_frame, d);
    while (off < size && rc == COS_ND_OK) {
        size_t n = ncuts ? (size_t)cuts[k++ % ncuts] + 1 : size - off;
        if (n > size - off)
            n = size - off;
        rc = cos_ndjson_feed(&p, (const char *)data + off, n);
        off += n;
    }
    if (rc == COS_ND_OK)
        rc = cos_ndjson_finish(&p);
    if (p.line.len > MAX_LINE || p.line.cap > MAX_LINE)
        abort();
    cos_ndjson_free(&p);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    digest whole = {0, 0}, chunked = {0, 0};
    size_t ncuts;
    int a, b;
    if (size < 1)
        return 0;
    ncuts = data[0] % 8;
    if (size < 1 + ncuts)
        return 0;
    a = parse(data + 1 + ncuts, size - 1 - ncuts, NULL, 0, &whole);
    b = parse(data + 1 + ncuts, size - 1 - ncuts, data + 1, ncuts, &chunked);
    if (a != b || whole.hash != chunked.hash || whole.frames != chunked.frames) {
        fprintf(stderr, "chunking changed the result: %d/%d %zu/%zu\n", a, b, whole.frames,
                chunked.frames);
        abort();
    }
    return 0;
}
