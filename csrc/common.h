/* Shared plumbing of the C core: error records, bounded buffers, redaction,
 * clocks. No Python here: the core is fuzzed and unit-tested alone. */
#ifndef COS_COMMON_H
#define COS_COMMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    COS_OK = 0,
    COS_E_CONFIG,      /* refused before any request was sent */
    COS_E_UNAVAILABLE, /* non-429 4xx, 3xx, TLS verification, unsupported */
    COS_E_NOTFOUND,    /* 404 */
    COS_E_CONFLICT,    /* 409 */
    COS_E_TRANSIENT,   /* 429, 5xx, transport failure */
    COS_E_DEADLINE,    /* the call's whole deadline passed */
    COS_E_PROTOCOL,    /* bytes that are not the documented protocol */
    COS_E_CLOSED,      /* the client was closed during or before the call */
    COS_E_OS,          /* local I/O failure; os_errno set */
    COS_E_NOMEM,
    COS_E_ABORTED, /* the binding asked to stop; its own error is pending */
    COS_E_VALUE,   /* bad argument */
} cos_kind;

#define COS_MSG_MAX 2816
/* The longest API key accepted; redaction covers every length up to it. */
#define COS_KEY_MAX 512
#define COS_ID_MAX 256
#define COS_SERVER_TEXT_MAX 500 /* characters of server text in a message */
/* Largest error body kept (the rest is discarded, not an error). */
#define COS_ERROR_BODY_MAX ((size_t)64 << 10)

/* What a response said about itself, from its status line and headers. */
typedef struct cos_meta {
    long status; /* 0: no response */
    int has_retry_after;
    double retry_after;
    char request_id[COS_ID_MAX];
} cos_meta;

typedef struct cos_err {
    cos_kind kind;
    long status;
    int has_retry_after;
    double retry_after;
    int os_errno;
    char request_id[COS_ID_MAX];
    char code[COS_ID_MAX];
    char sandbox_id[COS_ID_MAX];
    char msg[COS_MSG_MAX];
} cos_err;

void cos_err_clear(cos_err *err);
/* Set kind and a formatted message; leaves status/request_id alone. */
void cos_err_set(cos_err *err, cos_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int cos_kind_is_transient(cos_kind kind);
/* The error kind an HTTP status maps to (2xx gives COS_OK). */
cos_kind cos_kind_for_status(long status);

/* The one growable byte buffer: capacity doubles (from 1 KiB) and never passes
 * max when max is set (0: no limit but memory). */
typedef struct cos_buf {
    char *data;
    size_t len, cap, max;
} cos_buf;

/* Room for n more bytes: 0, or -1 on ENOMEM or when len + n would pass max. */
int cos_buf_reserve(cos_buf *b, size_t n);
int cos_buf_append(cos_buf *b, const void *data, size_t n); /* 0, or -1 as reserve */
void cos_buf_free(cos_buf *b);                              /* frees the data; keeps max */

/* Output of a guest stream: at most buf.max bytes, cut only on UTF-8
 * boundaries, with a cursor of what was already handed to the caller. */
typedef struct cos_outbuf {
    cos_buf buf;
    size_t delivered;
    int truncated;
} cos_outbuf;

int cos_outbuf_append(cos_outbuf *b, const char *s, size_t n); /* -1 on ENOMEM */
/* Length of the longest prefix of s[0..n) of at most room bytes that does not
 * split a UTF-8 sequence. */
size_t cos_utf8_cut(const char *s, size_t n, size_t room);

/* Everything an exec produced. The mutex guards out[] against the driver
 * (another thread, when the owner is not driving) while a stream is live. */
typedef struct cos_exec_out {
    pthread_mutex_t mu;
    cos_outbuf out[2]; /* 0 stdout, 1 stderr */
    long long exit_code;
    int has_exit;
    cos_buf error; /* the service's result.error / error frames, capped; no NUL kept */
    double exec_ms;
    int has_exec_ms;
    int streamed;
    int timed_out;
    size_t frames;
} cos_exec_out;

#define COS_ERROR_TEXT_MAX (64 * 1024)

int cos_exec_out_init(cos_exec_out *x, size_t max_output);
void cos_exec_out_free(cos_exec_out *x);
/* Record an error frame / result.error (appended, capped). */
int cos_exec_out_add_error(cos_exec_out *x, const char *s, size_t n);
/* Copy (malloc) the output of one stream (0 stdout, 1 stderr) that was not
 * taken yet; *data is NULL when there is none. -1 on ENOMEM. */
int cos_exec_out_take(cos_exec_out *x, int stream, char **data, size_t *len);

/* Length of the well-formed UTF-8 sequence that starts s[0..n) (1 to 4), or 0
 * when it is ill-formed: a stray continuation byte, an overlong form, a UTF-16
 * surrogate, a code point above U+10FFFF, or a sequence cut short (the Unicode
 * Standard, table 3-7). */
size_t cos_utf8_seq(const unsigned char *s, size_t n);
/* Length of s[0..n) without a last sequence that was cut short. */
size_t cos_utf8_trim(const char *s, size_t n);

/* The one sanitizer for text a server or a guest chose, on its way to Python
 * (messages, status strings, the exec error, delete outcomes). Copies src into
 * dst (NUL-terminated, at most dstcap-1 bytes):
 * - every run of 8 or more characters of the secret (all of it when shorter),
 *   in any case, raw or JSON-escaped (a server may reflect the header cut short
 *   or case-folded), becomes "[redacted]";
 * - control characters are escaped: \n \r \t, other C0 controls and DEL as
 *   \xHH, C1 controls, U+2028/U+2029 and the bidirectional formatting characters
 *   (U+061C, U+200E/F, U+202A-E, U+2066-9) as \uHHHH (no log injection, no text
 *   shown reordered);
 * - every byte of an ill-formed UTF-8 sequence becomes '?': the output is valid
 *   UTF-8 by construction;
 * - at most maxchars characters are kept, "..." appended when cut; nothing is
 *   cut in the middle. The secret is removed before the cut, so a cut can never
 *   expose a piece of it.
 * A secret longer than COS_KEY_MAX (refused by the constructor) withholds the
 * whole text (fail closed). */
void cos_sanitize(char *dst, size_t dstcap, const char *src, size_t srclen, const char *secret,
                  size_t maxchars);
/* The same into b, replacing its content (grown as needed; b->max ignored):
 * 0, or -1 on ENOMEM (b unchanged). */
int cos_sanitize_buf(cos_buf *b, const char *src, size_t srclen, const char *secret,
                     size_t maxchars);
/* 1 when cos_sanitize(s, n, secret, n characters) gives s back unchanged (no run of the
 * secret, nothing escaped or replaced), 0 when it would change it, -1 on ENOMEM. What a
 * server names things by (a sandbox id) must pass it: it is shown as it is. */
int cos_sanitize_unchanged(const char *s, size_t n, const char *secret);
/* The redaction of cos_sanitize alone, for the strings of a success answer (data, which
 * keeps its NUL and control characters): when s[0..n) holds a run of the secret, out gets
 * s with each run replaced by "[redacted]" (cut with "..." past 1.25 x n + 16 characters,
 * reachable only with a secret shorter than 8) and 1 is returned; 0 when s holds none (out
 * untouched), -1 on ENOMEM. */
int cos_redact(cos_buf *out, const char *s, size_t n, const char *secret);
/* Sanitize the exec error in place, once the exec is over (mutex taken). */
int cos_exec_out_seal(cos_exec_out *x, const char *secret);
/* ASCII only, whatever the process locale: setlocale() (which an application may
 * call) changes what the C library takes for a letter, for the lower case of 'I'
 * or for the decimal point. */
int cos_ascii_alnum(unsigned char c);
/* Whether a[0..n) and b[0..n) are equal, ASCII case ignored. */
int cos_ascii_caseeq(const char *a, const char *b, size_t n);

/* Zero memory in a way the compiler may not elide. */
void cos_wipe(void *p, size_t n);
/* Bounded copy, always NUL-terminated. */
void cos_strlcpy(char *dst, const char *src, size_t dstcap);

double cos_now_ms(void); /* CLOCK_MONOTONIC */
/* This process's pid without a system call: read once, then updated by a pthread_atfork
 * child handler in every forked child (common.c says why it is process-wide). */
pid_t cos_process_pid(void);
/* Whether this is the process's first thread, the one Python runs signal handlers on. */
int cos_on_main_thread(void);
struct timespec;
/* The CLOCK_MONOTONIC instant ms from now, for pthread_cond_timedwait. */
void cos_deadline_in(double ms, struct timespec *ts);

#endif
