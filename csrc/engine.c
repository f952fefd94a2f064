#include "engine.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EASY_POOL_MAX 128
/* Callers drive their own transfers only where nothing in a transfer blocks: libcurl
 * before 7.87 joins a stuck resolver thread when a transfer ends, and a libcurl built
 * without an asynchronous resolver (threaded or c-ares) runs getaddrinfo inside
 * curl_multi_perform; either would hold a driving caller past its deadline (and past
 * Ctrl-C). There the helper drives everything (the I/O thread of old) and callers only
 * wait, each bounded by its own backstop. Decided once per engine: cos_callers_drive(). */
/* The longest a driver sleeps in curl_multi_poll before it looks around again (a
 * close, a cancel, a deadline all wake it at once; this only bounds a lost wake). */
#define DRIVE_POLL_MAX_MS 1000.0

const char *const cos_stat_names[COS_STAT_COUNT] = {
    "requests",       "connections_opened", "bytes_received",   "bytes_sent",       "streams",
    "fallbacks",      "http_errors",        "transport_errors", "timeouts",         "cancelled",
    "deletes_queued", "deletes_done",       "deletes_failed",   "outcomes_dropped",
};

/* Who drives the multi handle: whichever thread holds the role (`driving`). A caller
 * takes it while it waits for its own request and no one else holds it, so a call
 * made alone runs on the caller's thread from start to end, woken by its own sockets.
 * A caller that finds the role taken sleeps on its request's condition variable
 * until the request is done, has output, or the role is handed to it. Work left when
 * the last caller lets go (background deletes, abandoned requests) goes to a helper
 * thread, started on first need. */
struct cos_engine {
    pthread_mutex_t mu; /* queue, roles, waiters, request hand-shakes, pool, stats, outcomes */
    pthread_cond_t bg_cv;
    pthread_cond_t helper_cv; /* the helper: work without a driver, or closing */
    pthread_mutex_t share_mu;
    pid_t pid;
    CURLM *multi;
    CURLSH *share;
    pthread_t helper;
    int helper_started, closing, closed;
    int driving;                 /* a thread holds the multi handle */
    int callers_drive;           /* cos_callers_drive(), when the engine was made */
    cos_req *queue, *queue_tail; /* submitted, not yet on the multi handle */
    cos_req *active;             /* on the multi handle: the driver only */
    size_t n_active;             /* its length, under mu (what others see of it) */
    size_t n_queued;             /* the queue's length */
    cos_req *waiters;            /* owners asleep while another thread drives */
    CURL *pool[EASY_POOL_MAX];
    int pool_n;
    cos_outcome *outcomes, *outcomes_tail;
    size_t n_outcomes, bg_pending;
    uint64_t stats[COS_STAT_COUNT];
};

static void share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *ud)
{
    cos_engine *e = ud;
    (void)h;
    (void)d;
    (void)a;
    pthread_mutex_lock(&e->share_mu);
}

static void share_unlock(CURL *h, curl_lock_data d, void *ud)
{
    cos_engine *e = ud;
    (void)h;
    (void)d;
    pthread_mutex_unlock(&e->share_mu);
}

int cos_callers_drive(void)
{
    const curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    return COS_HAVE_QUICK_EXIT && info != NULL && (info->features & CURL_VERSION_ASYNCHDNS) != 0;
}

cos_engine *cos_engine_new(cos_err *err)
{
    cos_engine *e = calloc(1, sizeof *e);
    pthread_condattr_t ca;
    if (e == NULL)
        goto nomem;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->share_mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->bg_cv, &ca);
    pthread_cond_init(&e->helper_cv, &ca);
    pthread_condattr_destroy(&ca);
    e->pid = cos_process_pid(); /* registers the fork watch before any engine exists */
    e->callers_drive = cos_callers_drive();
    e->multi = curl_multi_init();
    e->share = curl_share_init();
    if (e->multi == NULL || e->share == NULL)
        goto nomem;
    /* DNS and TLS sessions are shared; the connection pool is the multi's own */
    curl_share_setopt(e->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(e->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(e->share, CURLSHOPT_USERDATA, e);
    curl_share_setopt(e->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(e->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, 256L);
    curl_multi_setopt(e->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    return e;
nomem:
    if (e != NULL) {
        if (e->multi)
            curl_multi_cleanup(e->multi);
        if (e->share)
            curl_share_cleanup(e->share);
        free(e);
    }
    cos_err_set(err, COS_E_NOMEM, "out of memory creating the HTTP engine");
    return NULL;
}

/* A forked child holds a copy of its parent's engine: the sockets, the multi handle
 * and the helper thread's state are the parent's, and a lock another thread held at
 * the fork stays held for ever. Every entry point below that would touch them checks
 * this first and leaves the copy alone (a callback that forks mid-call, say). */
int cos_engine_forked(const cos_engine *e)
{
    return e->pid != cos_process_pid(); /* no system call: common.c's fork watch */
}

CURLSH *cos_engine_share(cos_engine *e)
{
    return e->share;
}

CURL *cos_engine_easy(cos_engine *e)
{
    CURL *h = NULL;
    if (cos_engine_forked(e))
        return curl_easy_init();
    pthread_mutex_lock(&e->mu);
    if (e->pool_n > 0)
        h = e->pool[--e->pool_n];
    pthread_mutex_unlock(&e->mu);
    return h ? h : curl_easy_init();
}

void cos_engine_release(cos_engine *e, cos_req *r)
{
    CURL *h;
    if (cos_engine_forked(e))
        return; /* the request may still sit in the parent's lists: the copy is left */
    h = cos_req_free(r);
    if (h == NULL)
        return;
    curl_easy_reset(h);
    pthread_mutex_lock(&e->mu);
    if (e->pool_n < EASY_POOL_MAX && !e->closed) {
        e->pool[e->pool_n++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    if (h != NULL)
        curl_easy_cleanup(h);
}

void cos_engine_stat_add(cos_engine *e, cos_stat which, uint64_t n)
{
    if (cos_engine_forked(e))
        return;
    pthread_mutex_lock(&e->mu);
    e->stats[which] += n;
    pthread_mutex_unlock(&e->mu);
}

void cos_engine_stats(cos_engine *e, uint64_t out[COS_STAT_COUNT])
{
    if (cos_engine_forked(e)) {
        memset(out, 0, sizeof e->stats);
        return;
    }
    pthread_mutex_lock(&e->mu);
    memcpy(out, e->stats, sizeof e->stats);
    pthread_mutex_unlock(&e->mu);
}

/* Requests in flight beyond `keep` (those whose owners come back for them). */
static int has_work_locked(const cos_engine *e, size_t keep)
{
    return e->n_queued + e->n_active > keep;
}

/* Start the helper thread (mu held). 0, or pthread_create's error number. */
static int start_helper_locked(cos_engine *e);

/* The role is free (mu held): if work is left beyond the `keep` requests whose owners
 * come back for them at once (a caller between two waits), wake an owner that waits
 * (it drives its own request and the rest with it), else the helper; a closing
 * engine always wakes the helper, which finishes the work and ends. */
static void pass_role_locked(cos_engine *e, size_t keep)
{
    if (e->driving || e->closed)
        return;
    if (e->callers_drive && has_work_locked(e, keep) && e->waiters != NULL && !e->closing) {
        pthread_cond_signal(&e->waiters->cv);
        return;
    }
    if ((has_work_locked(e, keep) || e->closing) && start_helper_locked(e) == 0)
        pthread_cond_signal(&e->helper_cv);
}

/* The driver: the request is finished; tell its owner or finish it here. */
static void complete(cos_engine *e, cos_req *r)
{
    int orphan;
    curl_off_t up = 0;
    long conns = 0;

    curl_easy_getinfo(r->easy, CURLINFO_NUM_CONNECTS, &conns);
    curl_easy_getinfo(r->easy, CURLINFO_SIZE_UPLOAD_T, &up);
    r->connects = conns;
    pthread_mutex_lock(&e->mu);
    e->stats[COS_STAT_REQUESTS]++;
    e->stats[COS_STAT_CONNECTIONS] += (uint64_t)conns;
    e->stats[COS_STAT_BYTES_RECEIVED] += (uint64_t)r->bytes_in;
    e->stats[COS_STAT_BYTES_SENT] += (uint64_t)up;
    if (r->cancelled)
        e->stats[COS_STAT_CANCELLED]++;
    else if (r->rc == CURLE_OPERATION_TIMEDOUT)
        e->stats[COS_STAT_TIMEOUTS]++;
    else if (r->rc != CURLE_OK && r->meta.status == 0)
        e->stats[COS_STAT_TRANSPORT_ERRORS]++;
    else if (r->meta.status >= 300)
        e->stats[COS_STAT_HTTP_ERRORS]++;
    orphan = r->orphaned;
    if (!orphan) {
        r->done = 1;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (orphan) {
        int background = !r->abandoned; /* an abandoned foreground request is no delete */
        if (r->on_orphan_done != NULL)
            r->on_orphan_done(r);
        cos_engine_release(e, r);
        if (background) {
            pthread_mutex_lock(&e->mu);
            e->bg_pending--;
            pthread_cond_broadcast(&e->bg_cv);
            pthread_mutex_unlock(&e->mu);
        }
    }
}

static void drop(cos_engine *e, cos_req *r, int on_multi)
{
    if (on_multi)
        curl_multi_remove_handle(e->multi, r->easy);
    r->cancelled = 1;
    r->rc = CURLE_ABORTED_BY_CALLBACK;
    complete(e, r);
}

/* Whether the driver must drop the request now: its owner cancelled it, or the engine
 * closes and it is no background work. */
static int must_drop(cos_engine *e, cos_req *r, int closing)
{
    int orphan;
    if (atomic_load(&r->cancel))
        return 1;
    if (!closing)
        return 0;
    pthread_mutex_lock(&e->mu);
    orphan = r->orphaned;
    pthread_mutex_unlock(&e->mu);
    return !orphan;
}

/* The driver: submitted requests onto the multi handle, cancelled ones off it. */
static void intake(cos_engine *e)
{
    cos_req *incoming, *r, *next, **pp;
    int closing;
    size_t added = 0, removed = 0;

    pthread_mutex_lock(&e->mu);
    incoming = e->queue;
    e->queue = e->queue_tail = NULL;
    e->n_queued = 0;
    closing = e->closing;
    pthread_mutex_unlock(&e->mu);

    for (r = incoming; r != NULL; r = next) {
        next = r->next;
        if (must_drop(e, r, closing)) {
            drop(e, r, 0);
            continue;
        }
        if (curl_multi_add_handle(e->multi, r->easy) != CURLM_OK) {
            r->rc = CURLE_OUT_OF_MEMORY;
            complete(e, r);
            continue;
        }
        r->next = e->active;
        e->active = r;
        added++;
    }
    for (pp = &e->active; *pp != NULL;) {
        r = *pp;
        if (must_drop(e, r, closing)) {
            *pp = r->next;
            drop(e, r, 1);
            removed++;
        } else {
            pp = &r->next;
        }
    }
    pthread_mutex_lock(&e->mu);
    e->n_active = e->n_active + added - removed; /* others read it only while no one drives */
    pthread_mutex_unlock(&e->mu);
}

/* The driver: complete what finished. */
static void reap(cos_engine *e)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(e->multi, &left)) != NULL) {
        cos_req *r, **pp;
        if (msg->msg != CURLMSG_DONE)
            continue;
        for (pp = &e->active; *pp != NULL; pp = &(*pp)->next) {
            if ((*pp)->easy == msg->easy_handle) {
                r = *pp;
                *pp = r->next;
                r->rc = msg->data.result;
                curl_multi_remove_handle(e->multi, r->easy);
                pthread_mutex_lock(&e->mu);
                e->n_active--;
                pthread_mutex_unlock(&e->mu);
                complete(e, r);
                break;
            }
        }
    }
}

/* Drive the multi handle (the caller holds the role) until `until_ms`, or until `own`
 * is done or has output; own NULL (the helper): until no work is left, or an owner
 * waits and the engine is not closing (that owner drives then). Returns 1 when
 * watch_signals and a signal may have arrived: the poll ended early without a
 * socket to serve and before libcurl's own timer (EINTR, or a wake-up from another
 * thread), or DRIVE_POLL_MAX_MS passed since the last look (a signal that landed
 * outside the poll). Only the binding can tell. */
static int drive(cos_engine *e, cos_req *own, double until_ms, int watch_signals)
{
    double look_by = cos_now_ms() + DRIVE_POLL_MAX_MS;
    for (;;) {
        int running = 0, numfds = 0, stop;
        long curl_ms = -1;
        double now, wait_ms;

        intake(e);
        curl_multi_perform(e->multi, &running);
        reap(e);
        pthread_mutex_lock(&e->mu);
        if (own != NULL)
            stop = own->done || own->progress;
        else
            stop =
                !has_work_locked(e, 0) || (e->callers_drive && e->waiters != NULL && !e->closing);
        pthread_mutex_unlock(&e->mu);
        now = cos_now_ms();
        if (stop || now >= until_ms)
            return 0;
        if (now >= look_by) {
            if (watch_signals)
                return 1;
            look_by = now + DRIVE_POLL_MAX_MS; /* nothing to look at: the next slice */
        }
        wait_ms = (until_ms < look_by ? until_ms : look_by) - now;
        /* curl_multi_poll ends at libcurl's next timer too: an early end is one before */
        if (curl_multi_timeout(e->multi, &curl_ms) == CURLM_OK && curl_ms >= 0 &&
            (double)curl_ms < wait_ms)
            wait_ms = (double)curl_ms;
        if (wait_ms < 0.0)
            wait_ms = 0.0;
        if (curl_multi_poll(e->multi, NULL, 0, (int)wait_ms + 1, &numfds) != CURLM_OK) {
            /* never spin on a poll that cannot wait: sleep the slice it asked for */
            struct timespec pause = {0, (wait_ms < 99.0 ? (long)wait_ms + 1 : 100L) * 1000000L};
            numfds = 0;
            nanosleep(&pause, NULL);
        }
        if (watch_signals && numfds == 0 && cos_now_ms() - now + 1.0 < wait_ms)
            return 1;
    }
}

static void *helper_main(void *arg)
{
    cos_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->closing && !e->driving && !has_work_locked(e, 0))
            break;
        if (!e->driving && has_work_locked(e, 0) &&
            (!e->callers_drive || e->waiters == NULL || e->closing)) {
            e->driving = 1;
            pthread_mutex_unlock(&e->mu);
            drive(e, NULL, cos_now_ms() + DRIVE_POLL_MAX_MS, 0);
            pthread_mutex_lock(&e->mu);
            e->driving = 0;
            if (e->callers_drive && e->waiters != NULL && has_work_locked(e, 0) && !e->closing)
                pthread_cond_signal(&e->waiters->cv);
            continue;
        }
        pthread_cond_wait(&e->helper_cv, &e->mu);
    }
    e->closed = 1;
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static int start_helper_locked(cos_engine *e)
{
    sigset_t all, old;
    int rc;
    if (e->helper_started)
        return 0;
    /* signals belong to the interpreter's main thread, never to ours */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&e->helper, NULL, helper_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return rc;
    e->helper_started = 1;
    return 0;
}

static void unlink_waiter_locked(cos_engine *e, cos_req *r)
{
    cos_req **pp;
    for (pp = &e->waiters; *pp != NULL; pp = &(*pp)->wnext) {
        if (*pp == r) {
            *pp = r->wnext;
            break;
        }
    }
    r->wnext = NULL;
}

int cos_engine_wait(cos_engine *e, cos_req *r, double until_ms, int watch_signals)
{
    int done;
    if (cos_engine_forked(e))
        return 0; /* never finishes here: the caller sees cos_engine_forked */
    pthread_mutex_lock(&e->mu);
    for (;;) {
        double now = cos_now_ms(), ms;
        struct timespec ts;
        int rc;

        if (r->done || r->progress || now >= until_ms)
            break;
        if (e->callers_drive && !e->driving) {
            int early;
            e->driving = 1;
            pthread_mutex_unlock(&e->mu);
            early = drive(e, r, until_ms, watch_signals);
            pthread_mutex_lock(&e->mu);
            e->driving = 0;
            pass_role_locked(e, r->done ? 0 : 1);
            if (early)
                break;
            continue;
        }
        /* another thread drives: asleep until done, output, our turn or the deadline.
         * A condition variable is deaf to signals, so the main thread looks at them
         * every COS_SIGNAL_CHECK_MS while it sleeps here. */
        ms = until_ms - now;
        if (watch_signals && ms > COS_SIGNAL_CHECK_MS)
            ms = COS_SIGNAL_CHECK_MS;
        r->wnext = e->waiters;
        e->waiters = r;
        cos_deadline_in(ms, &ts);
        rc = pthread_cond_timedwait(&r->cv, &e->mu, &ts);
        unlink_waiter_locked(e, r);
        if (rc == ETIMEDOUT && watch_signals)
            break;
    }
    r->progress = 0;
    done = r->done;
    pass_role_locked(e, done ? 0 : 1); /* a turn handed to us and not taken goes on */
    pthread_mutex_unlock(&e->mu);
    return done;
}

static int enqueue(cos_engine *e, cos_req *r, int orphan, cos_err *err)
{
    int rc = -1, wake = 0;
    if (cos_engine_forked(e)) {
        cos_err_set(err, COS_E_CLOSED, "the client's connections belong to the parent process");
        return rc;
    }
    pthread_mutex_lock(&e->mu);
    if (e->closing || e->closed) {
        cos_err_set(err, COS_E_CLOSED, "the client is closed");
        goto done;
    }
    /* nobody waits for an orphan: whoever drives, and the helper once no one does */
    if ((orphan || !e->callers_drive) && (rc = start_helper_locked(e)) != 0) {
        cos_err_set(err, COS_E_OS, "could not start the client's helper thread");
        err->os_errno = rc;
        rc = -1;
        goto done;
    }
    if (orphan) {
        r->orphaned = 1;
        e->bg_pending++;
    }
    r->handshake = &e->mu;
    r->next = NULL;
    if (e->queue_tail)
        e->queue_tail->next = r;
    else
        e->queue = r;
    e->queue_tail = r;
    e->n_queued++;
    wake = e->driving;
    if (orphan || !e->callers_drive)
        pass_role_locked(e, 0);
    rc = 0;
done:
    pthread_mutex_unlock(&e->mu);
    if (wake)
        curl_multi_wakeup(e->multi);
    return rc;
}

int cos_engine_submit(cos_engine *e, cos_req *r, cos_err *err)
{
    return enqueue(e, r, 0, err);
}

int cos_engine_submit_orphan(cos_engine *e, cos_req *r, cos_err *err)
{
    return enqueue(e, r, 1, err);
}

void cos_engine_cancel(cos_engine *e, cos_req *r)
{
    if (cos_engine_forked(e))
        return;
    atomic_store(&r->cancel, 1);
    curl_multi_wakeup(e->multi);
}

int cos_engine_detach(cos_engine *e, cos_req *r)
{
    int done;
    if (cos_engine_forked(e))
        return 0;
    pthread_mutex_lock(&e->mu);
    done = r->done;
    if (!done) {
        r->orphaned = 1;
        e->bg_pending++;
        pass_role_locked(e, 0); /* its owner drives no more */
    }
    pthread_mutex_unlock(&e->mu);
    return done;
}

int cos_engine_abandon(cos_engine *e, cos_req *r)
{
    int done;
    if (cos_engine_forked(e))
        return 0;
    pthread_mutex_lock(&e->mu);
    pthread_mutex_lock(&r->mu); /* the callbacks read `abandoned` under r->mu */
    done = r->done;
    if (!done) {
        r->orphaned = 1;
        r->abandoned = 1;
    }
    pthread_mutex_unlock(&r->mu);
    if (!done)
        pass_role_locked(e, 0);
    pthread_mutex_unlock(&e->mu);
    return done;
}

/* The error of an outcome whose own text could not be copied (out of memory). */
static const char outcome_error_nomem[] =
    "delete failed (its error text was lost: out of memory while recording it)";

cos_outcome *cos_outcome_new(void)
{
    return calloc(1, sizeof(cos_outcome));
}

void cos_engine_add_outcome(cos_engine *e, cos_outcome *o, const char *id, long status,
                            const char *error)
{
    cos_outcome *old = NULL;
    if (cos_engine_forked(e)) {
        cos_outcomes_free(o);
        return;
    }
    if (o == NULL)
        o = cos_outcome_new();
    if (o != NULL) {
        o->next = NULL;
        cos_strlcpy(o->id, id, sizeof o->id);
        o->status = status;
        o->error = NULL;
        if (error != NULL && (o->error = strdup(error)) == NULL)
            o->error = (char *)outcome_error_nomem; /* still a failure, never a success */
    }
    pthread_mutex_lock(&e->mu);
    e->stats[error ? COS_STAT_DELETES_FAILED : COS_STAT_DELETES_DONE]++;
    if (o == NULL) {
        /* no memory to hold it: counted, never silent */
        e->stats[COS_STAT_OUTCOMES_DROPPED]++;
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (e->n_outcomes >= COS_MAX_OUTCOMES) {
        /* nobody drains: keep the newest, count what was dropped */
        old = e->outcomes;
        e->outcomes = old->next;
        if (e->outcomes == NULL)
            e->outcomes_tail = NULL;
        old->next = NULL;
        e->n_outcomes--;
        e->stats[COS_STAT_OUTCOMES_DROPPED]++;
    }
    if (e->outcomes_tail)
        e->outcomes_tail->next = o;
    else
        e->outcomes = o;
    e->outcomes_tail = o;
    e->n_outcomes++;
    pthread_mutex_unlock(&e->mu);
    cos_outcomes_free(old);
}

size_t cos_engine_pending_deletes(cos_engine *e)
{
    size_t n;
    if (cos_engine_forked(e))
        return 0;
    pthread_mutex_lock(&e->mu);
    n = e->bg_pending;
    pthread_mutex_unlock(&e->mu);
    return n;
}

size_t cos_engine_wait_deletes(cos_engine *e, double ms)
{
    struct timespec ts;
    size_t n;
    if (cos_engine_forked(e))
        return 0;
    cos_deadline_in(ms, &ts);
    pthread_mutex_lock(&e->mu);
    while (e->bg_pending > 0 && ms > 0)
        if (pthread_cond_timedwait(&e->bg_cv, &e->mu, &ts) != 0)
            break;
    n = e->bg_pending;
    pthread_mutex_unlock(&e->mu);
    return n;
}

cos_outcome *cos_engine_take_outcomes(cos_engine *e)
{
    cos_outcome *o;
    if (cos_engine_forked(e))
        return NULL;
    pthread_mutex_lock(&e->mu);
    o = e->outcomes;
    e->outcomes = e->outcomes_tail = NULL;
    e->n_outcomes = 0;
    pthread_mutex_unlock(&e->mu);
    return o;
}

void cos_outcomes_free(cos_outcome *o)
{
    while (o != NULL) {
        cos_outcome *next = o->next;
        if (o->error != outcome_error_nomem)
            free(o->error);
        free(o);
        o = next;
    }
}

int cos_engine_closed(cos_engine *e)
{
    int c;
    if (cos_engine_forked(e))
        return 1;
    pthread_mutex_lock(&e->mu);
    c = e->closing || e->closed;
    pthread_mutex_unlock(&e->mu);
    return c;
}

void cos_engine_close(cos_engine *e)
{
    int started;
    if (cos_engine_forked(e))
        return;
    pthread_mutex_lock(&e->mu);
    if (e->closing) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    e->closing = 1;
    /* the helper finishes what is left: drops foreground requests, lets background
     * deletes end, and waits for a caller still driving to let go */
    if (e->driving || has_work_locked(e, 0))
        start_helper_locked(e);
    started = e->helper_started;
    if (!started)
        e->closed = 1;
    pthread_cond_signal(&e->helper_cv);
    pthread_mutex_unlock(&e->mu);
    if (started) {
        curl_multi_wakeup(e->multi);
        pthread_join(e->helper, NULL);
    }
    pthread_mutex_lock(&e->mu);
    e->closed = 1;
    pthread_mutex_unlock(&e->mu);
}

void cos_engine_free(cos_engine *e)
{
    int i;
    if (e == NULL)
        return;
    if (cos_engine_forked(e))
        return; /* everything here belongs to the parent */
    cos_engine_close(e);
    /* the handles go only now: a caller still finishing a call may wake the
     * multi handle until the owner lets go of the engine */
    for (i = 0; i < e->pool_n; i++)
        curl_easy_cleanup(e->pool[i]);
    curl_multi_cleanup(e->multi);
    curl_share_cleanup(e->share);
    cos_outcomes_free(e->outcomes);
    pthread_cond_destroy(&e->bg_cv);
    pthread_cond_destroy(&e->helper_cv);
    pthread_mutex_destroy(&e->share_mu);
    pthread_mutex_destroy(&e->mu);
    free(e);
}
