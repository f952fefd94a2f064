/* Incremental parser for the streaming exec body: NDJSON frames fed in
 * arbitrary chunks, SSE framing tolerated, heartbeats swallowed. */
#ifndef COS_NDJSON_H
#define COS_NDJSON_H

#include <stddef.h>

#include "common.h"

#define COS_NDJSON_MAX_LINE ((size_t)16 << 20)

typedef enum {
    COS_FRAME_STDOUT,
    COS_FRAME_STDERR,
    COS_FRAME_ERROR,
    COS_FRAME_EXIT,
} cos_frame_kind;

/* One meaningful field of a frame; data/len for text, exit_code for EXIT.
 * Return non-zero to stop parsing. */
typedef int (*cos_frame_fn)(void *ud, cos_frame_kind kind, const char *data, size_t len,
                            long long exit_code);

typedef struct cos_ndjson {
    cos_buf line; /* a line cut across chunks; line.max is the longest line accepted */
    size_t frames, heartbeats;
    int failed; /* sticky: once a protocol error is seen, nothing more is parsed */
    char errmsg[160];
    cos_frame_fn fn;
    void *ud;
} cos_ndjson;

enum { COS_ND_OK = 0, COS_ND_PROTOCOL = -1, COS_ND_STOPPED = -2, COS_ND_NOMEM = -3 };

void cos_ndjson_init(cos_ndjson *p, size_t max_line, cos_frame_fn fn, void *ud);
/* Feed a chunk; frames are emitted for every complete line. */
int cos_ndjson_feed(cos_ndjson *p, const char *data, size_t n);
/* End of stream: a last line without a newline is still a frame. */
int cos_ndjson_finish(cos_ndjson *p);
void cos_ndjson_free(cos_ndjson *p);

#endif
