#include "engine.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EASY_POOL_MAX 128

const char *const cos_stat_names[COS_STAT_COUNT] = {
    "requests",       "connections_opened", "bytes_received",   "bytes_sent",       "streams",
    "fallbacks",      "http_errors",        "transport_errors", "timeouts",         "cancelled",
    "deletes_queued", "deletes_done",       "deletes_failed",   "outcomes_dropped",
};

struct cos_engine {
    pthread_mutex_t mu; /* queue, pool, stats, outcomes, flags */
    pthread_cond_t bg_cv;
    pthread_mutex_t share_mu;
    pid_t pid;
    CURLM *multi;
    CURLSH *share;
    pthread_t thread;
    int started, closing, closed;
    cos_req *queue, *queue_tail; /* submitted, not yet on the multi handle */
    cos_req *active;             /* on the multi handle: I/O thread only */
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
    pthread_condattr_destroy(&ca);
    e->pid = getpid();
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

pid_t cos_engine_pid(const cos_engine *e)
{
    return e->pid;
}

CURLSH *cos_engine_share(cos_engine *e)
{
    return e->share;
}

CURL *cos_engine_easy(cos_engine *e)
{
    CURL *h = NULL;
    pthread_mutex_lock(&e->mu);
    if (e->pool_n > 0)
        h = e->pool[--e->pool_n];
    pthread_mutex_unlock(&e->mu);
    return h ? h : curl_easy_init();
}

void cos_engine_release(cos_engine *e, cos_req *r)
{
    CURL *h = cos_req_free(r);
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
    pthread_mutex_lock(&e->mu);
    e->stats[which] += n;
    pthread_mutex_unlock(&e->mu);
}

void cos_engine_stats(cos_engine *e, uint64_t out[COS_STAT_COUNT])
{
    pthread_mutex_lock(&e->mu);
    memcpy(out, e->stats, sizeof e->stats);
    pthread_mutex_unlock(&e->mu);
}

/* I/O thread: the request is finished; tell its owner or finish it here. */
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
    pthread_mutex_unlock(&e->mu);

    pthread_mutex_lock(&r->mu);
    orphan = r->orphaned;
    if (!orphan) {
        r->done = 1;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
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

static int is_orphan(cos_req *r)
{
    int o;
    pthread_mutex_lock(&r->mu);
    o = r->orphaned;
    pthread_mutex_unlock(&r->mu);
    return o;
}

static void *io_main(void *arg)
{
    cos_engine *e = arg;
    for (;;) {
        cos_req *incoming, *r, *next, **pp;
        CURLMsg *msg;
        int running = 0, left, closing;

        pthread_mutex_lock(&e->mu);
        incoming = e->queue;
        e->queue = e->queue_tail = NULL;
        closing = e->closing;
        pthread_mutex_unlock(&e->mu);

        for (r = incoming; r != NULL; r = next) {
            next = r->next;
            if (atomic_load(&r->cancel) || (closing && !is_orphan(r))) {
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
        }
        /* cancelled requests (and, when closing, every foreground one) */
        for (pp = &e->active; *pp != NULL;) {
            r = *pp;
            if (atomic_load(&r->cancel) || (closing && !is_orphan(r))) {
                *pp = r->next;
                drop(e, r, 1);
            } else {
                pp = &r->next;
            }
        }
        if (closing && e->active == NULL) {
            pthread_mutex_lock(&e->mu);
            if (e->queue == NULL) {
                e->closed = 1;
                pthread_mutex_unlock(&e->mu);
                break;
            }
            pthread_mutex_unlock(&e->mu);
            continue;
        }

        curl_multi_perform(e->multi, &running);
        while ((msg = curl_multi_info_read(e->multi, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            for (pp = &e->active; *pp != NULL; pp = &(*pp)->next) {
                if ((*pp)->easy == msg->easy_handle) {
                    r = *pp;
                    *pp = r->next;
                    r->rc = msg->data.result;
                    curl_multi_remove_handle(e->multi, r->easy);
                    complete(e, r);
                    break;
                }
            }
        }
        curl_multi_poll(e->multi, NULL, 0, 1000, NULL);
    }
    return NULL;
}

static int start_locked(cos_engine *e, cos_err *err)
{
    sigset_t all, old;
    int rc;
    if (e->started)
        return 0;
    /* signals belong to the interpreter's main thread, never to ours */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&e->thread, NULL, io_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        cos_err_set(err, COS_E_OS, "could not start the I/O thread");
        err->os_errno = rc;
        return -1;
    }
    e->started = 1;
    return 0;
}

static int enqueue(cos_engine *e, cos_req *r, int orphan, cos_err *err)
{
    int rc = -1;
    pthread_mutex_lock(&e->mu);
    if (e->closing || e->closed) {
        cos_err_set(err, COS_E_CLOSED, "the client is closed");
        goto done;
    }
    if (start_locked(e, err) < 0)
        goto done;
    if (orphan) {
        r->orphaned = 1;
        e->bg_pending++;
    }
    r->next = NULL;
    if (e->queue_tail)
        e->queue_tail->next = r;
    else
        e->queue = r;
    e->queue_tail = r;
    rc = 0;
done:
    pthread_mutex_unlock(&e->mu);
    if (rc == 0)
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
    atomic_store(&r->cancel, 1);
    curl_multi_wakeup(e->multi);
}

int cos_engine_detach(cos_engine *e, cos_req *r)
{
    int done;
    pthread_mutex_lock(&e->mu);
    pthread_mutex_lock(&r->mu);
    done = r->done;
    if (!done) {
        r->orphaned = 1;
        e->bg_pending++;
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&e->mu);
    return done;
}

int cos_engine_abandon(cos_engine *e, cos_req *r)
{
    int done;
    (void)e;
    pthread_mutex_lock(&r->mu);
    done = r->done;
    if (!done) {
        r->orphaned = 1;
        r->abandoned = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return done;
}

void cos_engine_add_outcome(cos_engine *e, const char *id, long status, const char *error)
{
    cos_outcome *o = calloc(1, sizeof *o), *old = NULL;
    if (o == NULL)
        return;
    cos_strlcpy(o->id, id, sizeof o->id);
    o->status = status;
    o->error = error ? strdup(error) : NULL;
    pthread_mutex_lock(&e->mu);
    e->stats[error ? COS_STAT_DELETES_FAILED : COS_STAT_DELETES_DONE]++;
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
    pthread_mutex_lock(&e->mu);
    n = e->bg_pending;
    pthread_mutex_unlock(&e->mu);
    return n;
}

size_t cos_engine_wait_deletes(cos_engine *e, double ms)
{
    struct timespec ts;
    size_t n;
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
        free(o->error);
        free(o);
        o = next;
    }
}

int cos_engine_closed(cos_engine *e)
{
    int c;
    pthread_mutex_lock(&e->mu);
    c = e->closing || e->closed;
    pthread_mutex_unlock(&e->mu);
    return c;
}

void cos_engine_close(cos_engine *e)
{
    int started;
    pthread_mutex_lock(&e->mu);
    if (e->closing) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    e->closing = 1;
    started = e->started;
    if (!started)
        e->closed = 1;
    pthread_mutex_unlock(&e->mu);
    if (started) {
        curl_multi_wakeup(e->multi);
        pthread_join(e->thread, NULL);
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
    if (e->pid != getpid())
        return; /* a forked child: everything here belongs to the parent */
    cos_engine_close(e);
    /* the handles go only now: a caller still finishing a call may wake the
     * multi handle until the owner lets go of the engine */
    for (i = 0; i < e->pool_n; i++)
        curl_easy_cleanup(e->pool[i]);
    curl_multi_cleanup(e->multi);
    curl_share_cleanup(e->share);
    cos_outcomes_free(e->outcomes);
    pthread_cond_destroy(&e->bg_cv);
    pthread_mutex_destroy(&e->share_mu);
    pthread_mutex_destroy(&e->mu);
    free(e);
}
