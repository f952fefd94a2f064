/* The I/O engine: one curl multi handle per client, driven by the threads that
 * wait on it. A caller that finds no one driving drives the multi handle itself
 * (its own transfer and any other in flight) with the GIL released, woken by its
 * sockets; one that finds it driven sleeps on its request's condition variable.
 * Background work no caller waits for goes to one helper thread, started on first
 * need. No Python runs in here. */
#ifndef COS_ENGINE_H
#define COS_ENGINE_H

#include <sys/types.h>

#include "http.h"

typedef enum {
    COS_STAT_REQUESTS,
    COS_STAT_CONNECTIONS,
    COS_STAT_BYTES_RECEIVED,
    COS_STAT_BYTES_SENT,
    COS_STAT_STREAMS,
    COS_STAT_FALLBACKS,
    COS_STAT_HTTP_ERRORS,
    COS_STAT_TRANSPORT_ERRORS,
    COS_STAT_TIMEOUTS,
    COS_STAT_CANCELLED,
    COS_STAT_DELETES_QUEUED,
    COS_STAT_DELETES_DONE,
    COS_STAT_DELETES_FAILED,
    COS_STAT_OUTCOMES_DROPPED,
    COS_STAT_COUNT
} cos_stat;

extern const char *const cos_stat_names[COS_STAT_COUNT];

typedef struct cos_outcome {
    struct cos_outcome *next;
    long status; /* 0: no response */
    char *error; /* NULL on success */
    char id[COS_ID_MAX];
} cos_outcome;

#define COS_MAX_OUTCOMES 100000

typedef struct cos_engine cos_engine;

/* Whether callers drive their own transfers with the libcurl loaded (1), or a helper
 * thread drives every transfer (0: libcurl before 7.87, or no asynchronous resolver). */
int cos_callers_drive(void);

cos_engine *cos_engine_new(cos_err *err);
/* 1 in a process forked from the engine's own: every call then leaves it alone
 * (a wait returns at once unfinished, a submit fails with COS_E_CLOSED). */
int cos_engine_forked(const cos_engine *e);
CURLSH *cos_engine_share(cos_engine *e);
/* An easy handle from the pool (or a new one); NULL on ENOMEM. */
CURL *cos_engine_easy(cos_engine *e);
/* Free a request and put its easy handle back in the pool. */
void cos_engine_release(cos_engine *e, cos_req *r);
/* Queue a request its owner will wait for (cos_engine_wait). -1 when closed. */
int cos_engine_submit(cos_engine *e, cos_req *r, cos_err *err);
/* How long the main thread, asleep while another thread drives its request, goes
 * between looks at pending signals: a condition variable is deaf to them. */
#define COS_SIGNAL_CHECK_MS 100.0
/* The owner waits for its submitted request, driving the multi handle while no one
 * else does. Returns 1 when the request is done; 0 at until_ms (cos_now_ms clock),
 * when output arrived (notify_output), or, with watch_signals (the main thread),
 * when a signal may have arrived: the binding looks, then waits again. */
int cos_engine_wait(cos_engine *e, cos_req *r, double until_ms, int watch_signals);
/* Ask the driver to drop the request; the owner still waits for done. */
void cos_engine_cancel(cos_engine *e, cos_req *r);
/* Hand a running request to the engine, which finishes it in the
 * background with r->on_orphan_done and frees it. Returns 1 if the request
 * had already finished (the caller still owns it), else 0. */
int cos_engine_detach(cos_engine *e, cos_req *r);
/* The owner stops waiting for a request it cancelled (the driver has not
 * let go of it in time): from now on the driver touches none of the
 * owner's memory and frees the request when it gets to it. Returns 1 if the
 * request had already finished (the caller still owns it), else 0. */
int cos_engine_abandon(cos_engine *e, cos_req *r);
/* Submit a request that the engine owns from the start (background delete). */
int cos_engine_submit_orphan(cos_engine *e, cos_req *r, cos_err *err);

void cos_engine_stat_add(cos_engine *e, cos_stat which, uint64_t n);
void cos_engine_stats(cos_engine *e, uint64_t out[COS_STAT_COUNT]);

/* Background deletes: record an outcome (the driver), count, wait, drain. */
/* A node for one outcome, made with the delete's request so that recording the outcome
 * needs no memory; NULL on ENOMEM. */
cos_outcome *cos_outcome_new(void);
/* Record an outcome (error NULL: deleted) in node (taken; NULL: one is made here). Out of
 * memory never turns a failure into a success: an error text that cannot be copied is
 * replaced by one that says so, and an outcome with no node to hold it is counted
 * (deletes_failed or deletes_done, and outcomes_dropped). */
void cos_engine_add_outcome(cos_engine *e, cos_outcome *node, const char *id, long status,
                            const char *error);
size_t cos_engine_pending_deletes(cos_engine *e);
/* Wait up to ms for the pending count to reach zero; returns it. */
size_t cos_engine_wait_deletes(cos_engine *e, double ms);
cos_outcome *cos_engine_take_outcomes(cos_engine *e);
void cos_outcomes_free(cos_outcome *o);

/* Stop: refuse new work, cancel foreground requests, let background deletes
 * finish (each is bounded by its own deadline) and join the helper thread.
 * Idempotent. Must not be called in a forked child. */
void cos_engine_close(cos_engine *e);
int cos_engine_closed(cos_engine *e);
/* Free the struct (after close, or abandoning everything in a forked child:
 * there the inherited handles and sockets belong to the parent and are
 * neither closed nor written; their memory is leaked on purpose). */
void cos_engine_free(cos_engine *e);

#endif
