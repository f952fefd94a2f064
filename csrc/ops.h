/* Control-plane operations in plain C. Each runs on the caller's thread,
 * submits its requests to the engine and waits for them (driving them itself
 * when no other thread drives the engine); when a wait comes back early it
 * calls ctx->slice (the binding's chance to deliver output and notice
 * signals, with the GIL held). No Python here. */
#ifndef COS_OPS_H
#define COS_OPS_H

#include <jansson.h>

#include "engine.h"
#include "envelope.h"

#define COS_DEFAULT_MAX_OUTPUT ((size_t)16 << 20)
/* The largest max_output_bytes accepted: 1 GiB per stream. The buffered
 * exec's body cap (4x plus 1 MiB, for JSON escapes) stays far from wrapping. */
#define COS_MAX_OUTPUT_LIMIT ((size_t)1 << 30)
/* The slices of the waits that are no network wait (resume's polling interval,
 * drain_deletes): between them the binding looks at signals. */
#define COS_SLICE_MS 100.0
/* How long a caller waits for the driver to drop a cancelled request
 * before it abandons the request to the engine and returns. */
#define COS_CANCEL_GRACE_MS 2000.0

/* Return non-zero to stop the call (the binding then has an error pending).
 * xo is the live exec output, or NULL. */
typedef int (*cos_slice_fn)(void *ud, cos_exec_out *xo);

typedef struct cos_ctx {
    cos_engine *eng;
    const cos_cfg *cfg;
    cos_slice_fn slice;
    void *ud;
    cos_err *err;
    int aborted;     /* slice asked to stop: no further waiting on its behalf */
    int live_output; /* the binding delivers stream output as it arrives */
    int watch_signals; /* the main thread: its waits also end when a signal may have come */
} cos_ctx;

typedef struct cos_exec_args {
    const char *cmd;
    json_t *args;           /* array of strings, or NULL */
    const char *stdin_data; /* NULL: none; may hold NUL bytes */
    size_t stdin_len;
    json_t *env; /* object of strings, or NULL */
    long timeout_ms;
    int stream;
} cos_exec_args;

typedef struct cos_file {
    const char *path;
    const char *data;
    size_t len;
} cos_file;

/* Configuration checks, before any request. */
int cos_check_base_url(const char *url, char **normalized, cos_err *err);
int cos_check_key(const char *key, cos_err *err);

int cos_op_whoami(cos_ctx *c, json_t **out);
int cos_op_rootfs(cos_ctx *c, json_t **out);
int cos_op_shapes(cos_ctx *c, json_t **out);
int cos_op_create(cos_ctx *c, json_t *spec, long timeout_ms, json_t **out);
int cos_op_get(cos_ctx *c, const char *id, json_t **out);
int cos_op_list(cos_ctx *c, const char *prefix, const char *status, json_t **out);
int cos_op_delete(cos_ctx *c, const char *id, json_t **out);
int cos_op_pause(cos_ctx *c, const char *id, json_t **out);
/* wait_ms < 0: return the first answer; else poll until running. */
int cos_op_resume(cos_ctx *c, const char *id, long wait_ms, json_t **out);
int cos_op_fork(cos_ctx *c, const char *id, json_t *spec, json_t **out);
int cos_op_patch(cos_ctx *c, const char *id, json_t *fields, json_t **out);
int cos_op_get_egress(cos_ctx *c, const char *id, json_t **out);
int cos_op_put_egress(cos_ctx *c, const char *id, json_t *rules, json_t **out);
/* Upload from memory, or streamed from `file` (size bytes) when non-NULL. */
int cos_op_upload(cos_ctx *c, const char *id, const char *path, const char *data, size_t len,
                  FILE *file, long long size);
int cos_op_download(cos_ctx *c, const char *id, const char *path, size_t max_bytes, cos_buf *out);
int cos_op_exec(cos_ctx *c, const char *id, const cos_exec_args *a, cos_exec_out *xo);
/* create (or adopt `adopt_id`) -> upload -> streaming exec -> delete. The
 * delete is attempted on every path; err->sandbox_id and sandbox_id_out name
 * the guest once there is one. */
int cos_op_run_program(cos_ctx *c, json_t *create_spec, const char *adopt_id, const cos_file *files,
                       size_t nfiles, const cos_exec_args *a, int delete_background,
                       cos_exec_out *xo, char sandbox_id_out[COS_ID_MAX]);
/* Queue a delete in the background; its outcome goes to drain_deletes. */
int cos_op_delete_background(cos_ctx *c, const char *id);

#endif
