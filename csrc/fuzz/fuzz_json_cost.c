/* The memory estimate that gates every parse of server JSON (jsonload.c). Oracle:
 * jansson never holds more than the estimate says, at any moment of a parse (a
 * counting allocator measures its peak in glibc malloc chunks), whatever the bytes:
 * valid JSON, or JSON that fails half-way. The lexer's token buffer is counted in
 * allocated bytes here: it doubles by copy, so old and new buffers are 3 x the
 * token at worst (the estimate counts the token once, as resident memory: only
 * the bytes written are touched). And the gate refuses exactly what passes the
 * budget. */
#include <jansson.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "jsonload.h"

/* the lexer's own state (its token buffer's first chunk, the stream) */
#define LEXER_BASE 256

static size_t live, peak;

static size_t chunk(size_t n)
{
    size_t c = (n + 8 + 15) & ~(size_t)15;
    return c < 32 ? 32 : c;
}

static void *counting_malloc(size_t n)
{
    size_t *p = malloc(n + 16);
    if (p == NULL)
        return NULL;
    p[0] = n;
    live += chunk(n);
    if (live > peak)
        peak = live;
    return (char *)p + 16;
}

static void counting_free(void *q)
{
    size_t *p;
    if (q == NULL)
        return;
    p = (size_t *)((char *)q - 16);
    live -= chunk(p[0]);
    free(p);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    json_set_alloc_funcs(counting_malloc, counting_free);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cos_json_cost cost;
    json_error_t jerr;
    json_t *root;
    int refused;

    cos_json_estimate((const char *)data, size, &cost);
    live = peak = 0;
    root = json_loadb((const char *)data, size, JSON_ALLOW_NUL, &jerr);
    if (peak > cost.tree + 3 * cost.token + LEXER_BASE) {
        fprintf(stderr, "jansson peaked at %zu bytes; estimated tree %zu + token %zu\n", peak,
                cost.tree, cost.token);
        abort();
    }
    json_decref(root);
    root = cos_json_load((const char *)data, size, JSON_ALLOW_NUL, 1, &jerr, &refused);
    if (refused != (cos_json_peak(size, &cost, 1) > cos_json_budget(size)) || (refused && root))
        abort();
    json_decref(root);
    return 0;
}
