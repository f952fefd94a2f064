/* One HTTP request: its easy handle, headers, body, bounded capture of the
 * response and what the response said about itself. Performed by whichever
 * thread drives the engine (usually its owner); owned by the calling thread (or,
 * once orphaned, by the engine). */
#ifndef COS_HTTP_H
#define COS_HTTP_H

#include <curl/curl.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common.h"
#include "compat.h"
#include "ndjson.h"

typedef struct cos_cfg {
    char *base; /* scheme://host[:port][/prefix], without a trailing slash */
    char *key;
    char *user_agent;
    char *ca_file; /* SSL_CERT_FILE / CURL_CA_BUNDLE when set, else NULL */
    long connect_ms;
    long control_ms;
    int plain_http; /* http:// (loopback only): never through a proxy */
} cos_cfg;

typedef enum {
    COS_RESP_JSON,     /* capture up to body_cap; more (declared or received) is a protocol error */
    COS_RESP_STREAM,   /* a 2xx body goes through the NDJSON parser into xo */
    COS_RESP_DOWNLOAD, /* capture up to body_cap; more (declared or received) aborts */
} cos_resp_mode;

typedef struct cos_req cos_req;
typedef void (*cos_req_done_fn)(cos_req *r);
struct cos_outcome;

typedef struct cos_req_spec {
    const char *method;
    const char *url;
    const char *body; /* copied into the request */
    size_t body_len;
    const char *content_type;
    FILE *upload;           /* streamed PUT body instead of `body` */
    const char *upload_mem; /* or a PUT body read from memory (borrowed) */
    curl_off_t upload_size;
    const char *accept;
    cos_resp_mode mode;
    size_t body_cap;
    long timeout_ms;   /* the whole deadline of this request */
    cos_exec_out *xo;  /* COS_RESP_STREAM only */
    int notify_output; /* wake the owner as output arrives (someone delivers it live) */
} cos_req_spec;

struct cos_req {
    CURL *easy;
    struct curl_slist *headers;
    char *url;
    cos_resp_mode mode;
    size_t body_cap;
    long timeout_ms;
    /* Caller memory, touched by the driver only under mu and only while
     * !abandoned: a caller that stops waiting never leaves it dangling. */
    FILE *upload;
    const char *upload_mem;
    curl_off_t upload_size, upload_pos;
    cos_exec_out *xo;
    int notify_output;
    cos_ndjson nd;
    int nd_rc;

    /* results, written by the driver, read by the owner once done */
    CURLcode rc;
    cos_meta meta;
    cos_buf body;
    int over_cap;          /* the body passed body_cap */
    int declared_over_cap; /* a 2xx Content-Length above body_cap (JSON, download): refused
                              before the body */
    int write_failed;      /* out of memory while capturing */
    curl_off_t bytes_in;
    long connects;
    char errbuf[CURL_ERROR_SIZE];

    /* mu: what the callbacks touch of the owner's (upload, xo) and `abandoned` */
    pthread_mutex_t mu;
    /* handshake with the owner, under the engine's mutex (`handshake`, set at submit),
     * which cv pairs with: done, progress, orphaned, abandoned (also under mu) */
    pthread_mutex_t *handshake;
    pthread_cond_t cv;
    int done, progress, orphaned, cancelled;
    int abandoned; /* orphaned by an owner that gave up waiting after a cancel */
    cos_req *wnext; /* the engine's list of owners asleep while another thread drives */
    int gave_up;   /* cancelled by its owner's backstop (deadline), not by close() */
    atomic_int cancel;
    atomic_int
        stream_started; /* the control plane's 2xx headers arrived on a stream (never a proxy's) */

    /* background completion (orphaned requests): runs on the driver's thread */
    cos_req_done_fn on_orphan_done;
    void *orphan_engine;
    const cos_cfg *orphan_cfg;
    int attempt;
    char orphan_id[COS_ID_MAX];
    struct cos_outcome *outcome; /* a delete's: where its outcome is recorded (engine.h) */

    cos_req *next;
};

/* Build a request on `easy` (taken from the engine's pool). */
cos_req *cos_req_new(const cos_cfg *cfg, CURL *easy, CURLSH *share, const cos_req_spec *spec,
                     cos_err *err);
/* Frees everything but the easy handle, which is returned. */
CURL *cos_req_free(cos_req *r);

/* Percent-encode s as one path segment or query value (unreserved kept). */
char *cos_escape(const char *s);

#endif
