#include "common.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void cos_err_clear(cos_err *err)
{
    memset(err, 0, sizeof *err);
}

void cos_err_set(cos_err *err, cos_kind kind, const char *fmt, ...)
{
    va_list ap;
    int n;
    err->kind = kind;
    va_start(ap, fmt);
    n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof err->msg) /* cut short: never inside a UTF-8 sequence */
        err->msg[cos_utf8_trim(err->msg, sizeof err->msg - 1)] = '\0';
}

int cos_kind_is_transient(cos_kind kind)
{
    return kind == COS_E_TRANSIENT || kind == COS_E_DEADLINE;
}

cos_kind cos_kind_for_status(long status)
{
    if (status >= 200 && status < 300)
        return COS_OK;
    if (status == 404)
        return COS_E_NOTFOUND;
    if (status == 409)
        return COS_E_CONFLICT;
    if (status == 429 || status == 408 || (status >= 500 && status < 600))
        return COS_E_TRANSIENT;
    if (status >= 300 && status < 500)
        return COS_E_UNAVAILABLE;
    return COS_E_PROTOCOL;
}

int cos_buf_reserve(cos_buf *b, size_t n)
{
    size_t need = b->len + n, cap;
    char *p;
    if (n > SIZE_MAX - b->len || (b->max && need > b->max))
        return -1;
    if (need <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 1024;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (b->max && cap > b->max)
        cap = b->max;
    if ((p = realloc(b->data, cap)) == NULL)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int cos_buf_append(cos_buf *b, const void *data, size_t n)
{
    if (n == 0)
        return 0;
    if (cos_buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    return 0;
}

void cos_buf_free(cos_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

size_t cos_utf8_cut(const char *s, size_t n, size_t room)
{
    size_t k;
    if (n <= room)
        return n;
    k = room;
    /* s[k] is the first byte left out: if it continues a sequence, the
     * sequence started inside the kept part and must go too. */
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    return k;
}

int cos_outbuf_append(cos_outbuf *b, const char *s, size_t n)
{
    size_t take;
    if (b->truncated || n == 0)
        return 0;
    take = cos_utf8_cut(s, n, b->buf.max - b->buf.len);
    if (take < n)
        b->truncated = 1;
    return cos_buf_append(&b->buf, s, take);
}

int cos_exec_out_init(cos_exec_out *x, size_t max_output)
{
    memset(x, 0, sizeof *x);
    if (pthread_mutex_init(&x->mu, NULL) != 0)
        return -1;
    x->out[0].buf.max = max_output;
    x->out[1].buf.max = max_output;
    x->error.max = COS_ERROR_TEXT_MAX;
    x->exit_code = -1;
    return 0;
}

void cos_exec_out_free(cos_exec_out *x)
{
    cos_buf_free(&x->out[0].buf);
    cos_buf_free(&x->out[1].buf);
    cos_buf_free(&x->error);
    pthread_mutex_destroy(&x->mu);
}

int cos_exec_out_add_error(cos_exec_out *x, const char *s, size_t n)
{
    size_t sep = x->error.len ? 1 : 0, room;
    if (x->error.len + sep >= x->error.max)
        return 0;
    room = x->error.max - x->error.len - sep;
    if (sep && cos_buf_append(&x->error, "\n", 1) < 0)
        return -1;
    return cos_buf_append(&x->error, s, cos_utf8_cut(s, n, room));
}

int cos_exec_out_take(cos_exec_out *x, int stream, char **data, size_t *len)
{
    cos_outbuf *b = &x->out[stream];
    int rc = 0;
    *data = NULL;
    *len = 0;
    pthread_mutex_lock(&x->mu);
    if (b->buf.len > b->delivered) {
        *len = b->buf.len - b->delivered;
        *data = malloc(*len);
        if (*data == NULL) {
            *len = 0;
            rc = -1;
        } else {
            memcpy(*data, b->buf.data + b->delivered, *len);
            b->delivered = b->buf.len;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

size_t cos_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t len, k;
    if (c < 0x80)
        return 1;
    if (c < 0xC2 || c > 0xF4)
        return 0; /* continuation byte, overlong lead (C0, C1), beyond U+10FFFF */
    len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c == 0xE0)
        lo = 0xA0; /* overlong */
    else if (c == 0xED)
        hi = 0x9F; /* surrogates */
    else if (c == 0xF0)
        lo = 0x90; /* overlong */
    else if (c == 0xF4)
        hi = 0x8F; /* beyond U+10FFFF */
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80)
            return 0;
    return len;
}

size_t cos_utf8_trim(const char *s, size_t n)
{
    size_t start = n, back;
    for (back = 0; back < 4 && start > 0; back++) {
        unsigned char c = (unsigned char)s[--start];
        if ((c & 0xC0) != 0x80)
            return cos_utf8_seq((const unsigned char *)s + start, n - start) ? n : start;
    }
    return n;
}

/* A run this long copied from the key counts as the key: servers that reflect
 * headers may cut them anywhere, and half a key is still a leak. */
#define SECRET_PIECE_MIN 8

static unsigned char ascii_lower(unsigned char c)
{
    return c >= 'A' && c <= 'Z' ? (unsigned char)(c + ('a' - 'A')) : c;
}

/* The character of s at *i, folded to lower case, and *i moved past it. With
 * unescape, a JSON escape of '"', '\\' or '/' reads as the character itself. */
static unsigned char text_char(const char *s, size_t n, size_t *i, int unescape)
{
    unsigned char c = (unsigned char)s[*i];
    if (unescape && c == '\\' && *i + 1 < n &&
        (s[*i + 1] == '"' || s[*i + 1] == '\\' || s[*i + 1] == '/'))
        c = (unsigned char)s[++*i];
    ++*i;
    return ascii_lower(c);
}

/* How many bytes at the start of s spell the longest run of the (folded)
 * secret found anywhere in it, read raw or JSON-unescaped; 0 when that run is
 * shorter than min characters. */
static size_t secret_run(const char *s, size_t n, const unsigned char *secret, size_t slen,
                         size_t min)
{
    size_t best = 0, j, first, starts = slen - min + 1; /* a run starts at j < starts */
    const unsigned char *p;
    int unescape;
    for (unescape = 0; unescape < 2; unescape++) {
        size_t at = 0;
        unsigned char c0 = text_char(s, n, &at, unescape);
        /* only where the secret has c0 (memchr: most text matches nowhere) */
        for (p = memchr(secret, c0, starts); p != NULL;
             p = j + 1 < starts ? memchr(secret + j + 1, c0, starts - j - 1) : NULL) {
            size_t i = at, k, end = at;
            j = (size_t)(p - secret);
            k = j + 1;
            while (i < n && k < slen) {
                first = i;
                if (text_char(s, n, &i, unescape) != secret[k]) {
                    i = first;
                    break;
                }
                k++;
                end = i;
            }
            if (k - j >= min && end > best)
                best = end;
        }
    }
    return best;
}

/* What one step of the sanitizer writes for the text at src[i]: a piece of
 * output (pointing into src or into esc), how many characters it counts for,
 * and how many input bytes it consumes. */
typedef struct {
    const char *piece;
    size_t len, chars, consumed;
    char esc[8];
} san_step;

/* The code point of a well-formed sequence s[0..seq) that is escaped as \uHHHH, else 0:
 * C1 controls, the line and paragraph separators (U+2028/9) and the bidirectional
 * formatting characters (Unicode's Bidi_Control: U+061C, U+200E/F, U+202A-E, U+2066-9),
 * which reorder what a terminal or a log viewer shows after them. */
static unsigned escaped_code_point(const unsigned char *s, size_t seq)
{
    if (seq == 2 && s[0] == 0xC2 && s[1] < 0xA0)
        return s[1]; /* C1 control */
    if (seq == 2 && s[0] == 0xD8 && s[1] == 0x9C)
        return 0x061Cu; /* Arabic letter mark */
    if (seq == 3 && s[0] == 0xE2 && s[1] == 0x80 &&
        (s[2] == 0x8E || s[2] == 0x8F || (s[2] >= 0xA8 && s[2] <= 0xAE)))
        return 0x2000u | (s[2] - 0x80u); /* LRM, RLM; U+2028/9; LRE, RLE, PDF, LRO, RLO */
    if (seq == 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] >= 0xA6 && s[2] <= 0xA9)
        return 0x2040u | (s[2] - 0x80u); /* LRI, RLI, FSI, PDI */
    return 0;
}

/* The step for the character at s: with escape, its escape when it is a control
 * character or ill-formed; else (or when it needs none) the character as it is. */
static void escape_step(san_step *st, const unsigned char *s, size_t n, int escape)
{
    size_t seq = cos_utf8_seq(s, n);
    unsigned cp = 0;
    st->piece = st->esc;
    st->consumed = seq ? seq : 1;
    if (!escape) {
        st->piece = (const char *)s; /* redaction only: every byte kept, NUL included */
        st->len = st->consumed;
        st->chars = 1;
        return;
    }
    if (seq == 0) {
        memcpy(st->esc, "?", 2); /* ill-formed: one byte at a time, never the ASCII after it */
    } else if (seq == 1 && (s[0] < 0x20 || s[0] == 0x7F)) {
        if (s[0] == '\n' || s[0] == '\r' || s[0] == '\t')
            snprintf(st->esc, sizeof st->esc, "\\%c",
                     s[0] == '\n'   ? 'n'
                     : s[0] == '\r' ? 'r'
                                    : 't');
        else
            snprintf(st->esc, sizeof st->esc, "\\x%02x", s[0]);
    } else if ((cp = escaped_code_point(s, seq)) == 0) {
        st->piece = (const char *)s;
        st->len = seq;
        st->chars = 1;
        return;
    }
    if (cp)
        snprintf(st->esc, sizeof st->esc, "\\u%04x", cp);
    st->len = strlen(st->esc);
    st->chars = st->len;
}

/* One pass: runs of the secret become the mark, with escape control characters and
 * ill-formed bytes their escapes, at most maxchars characters (then "..."); *outlen is the
 * length written (dst is NUL-terminated too). 1 when it wrote text of its own (a mark, an
 * escape, the cut); 0 when dst is src, whole and unchanged. */
static int sanitize_pass(char *dst, size_t dstcap, size_t *outlen, const char *src, size_t srclen,
                         const unsigned char *folded, size_t slen, size_t piece_min,
                         size_t maxchars, int escape)
{
    static const char mark[] = "[redacted]";
    size_t i = 0, o = 0, chars = 0;
    int cut = 0, ours = 0;

    while (i < srclen) {
        san_step st;
        size_t run = piece_min ? secret_run(src + i, srclen - i, folded, slen, piece_min) : 0;
        if (run) {
            st.piece = mark;
            st.len = st.chars = sizeof mark - 1;
            st.consumed = run;
        } else {
            escape_step(&st, (const unsigned char *)src + i, srclen - i, escape);
        }
        /* room for "..." and the NUL stays */
        if (chars + st.chars > maxchars || o + st.len > dstcap - 4) {
            cut = 1;
            break;
        }
        ours |= st.piece != src + i; /* the mark or an escape */
        memcpy(dst + o, st.piece, st.len);
        o += st.len;
        chars += st.chars;
        i += st.consumed;
    }
    if (cut) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
    *outlen = o;
    return ours | cut;
}

/* Whether a run of the secret at least piece_min long starts anywhere in s. */
static int has_secret_run(const char *s, size_t n, const unsigned char *folded, size_t slen,
                          size_t piece_min)
{
    size_t i;
    for (i = 0; piece_min && i < n; i++)
        if (secret_run(s + i, n - i, folded, slen, piece_min))
            return 1;
    return 0;
}

/* Whether s[0..n) may hold a run of the secret: 0 only when it holds none. Text without a
 * backslash (no JSON escape to read through) holds a run exactly when some stretch of as
 * many bytes as a run needs (8, or the whole key when shorter) is, folded, one of the key's
 * stretches of that length: each of the text's stretches, packed into a word, is looked up
 * in a table of the key's (at most 505), one multiply and a probe or two a byte, where
 * looking for runs costs a comparison or more per byte per place the key could start. Text
 * with a backslash is left to that search. */
static int may_hold_secret(const char *s, size_t n, const char *secret)
{
    uint64_t table[1024] = {0}, v = 0, mask;
    size_t slen = strlen(secret), need = slen < SECRET_PIECE_MIN ? slen : SECRET_PIECE_MIN;
    size_t i, k;

    if (need == 0 || n < need)
        return 0;
    if (memchr(s, '\\', n) != NULL)
        return 1;
    mask = need == 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * need)) - 1);
    for (i = 0; i < slen; i++) { /* the key's stretches; printable ASCII: never the word 0 */
        v = ((v << 8) | ascii_lower((unsigned char)secret[i])) & mask;
        if (i + 1 >= need) {
            for (k = (size_t)((v * 0x9E3779B97F4A7C15u) >> 54); table[k] != 0 && table[k] != v;)
                k = (k + 1) & 1023;
            table[k] = v;
        }
    }
    v = 0;
    for (i = 0; i < n; i++) {
        v = ((v << 8) | ascii_lower((unsigned char)s[i])) & mask;
        if (i + 1 < need)
            continue;
        for (k = (size_t)((v * 0x9E3779B97F4A7C15u) >> 54); table[k] != 0; k = (k + 1) & 1023)
            if (table[k] == v)
                return 1;
    }
    return 0;
}

/* An escape written next to text from the server can complete a run of the key (the
 * "f" of "\x7f" before "UZZ-SEC" spells "fUZZ-SEC": found by fuzz_exec_result), and so can
 * the mark. So the output is passed again until it holds no run; text that still does
 * after SANITIZE_PASSES passes, or that there is no memory to pass again, is withheld. */
#define SANITIZE_PASSES 4

/* cos_sanitize, or with escape 0 the redaction alone; *outlen is the length written.
 * 1 when the output differs from the input, else 0. */
static int sanitize_text(char *dst, size_t dstcap, size_t *outlen, const char *src, size_t srclen,
                         const char *secret, size_t maxchars, int escape)
{
    static const char withheld[] = "[withheld: text cannot be redacted]";
    unsigned char folded[COS_KEY_MAX + 1];
    size_t slen = 0, piece_min, k, n = 0;
    char *again = NULL;
    int pass, ours = 1;

    *outlen = 0;
    if (dstcap < sizeof withheld) {
        if (dstcap)
            dst[0] = '\0';
        return 1;
    }
    if (secret != NULL && (slen = strlen(secret)) > COS_KEY_MAX)
        goto withhold; /* fail closed: a key redaction cannot cover never reaches a message */
    for (k = 0; k < slen; k++)
        folded[k] = ascii_lower((unsigned char)secret[k]);
    piece_min = slen < SECRET_PIECE_MIN ? slen : SECRET_PIECE_MIN;
    ours = sanitize_pass(dst, dstcap, &n, src, srclen, folded, slen, piece_min, maxchars, escape);
    /* text copied unchanged holds no run (the pass looked at each of its characters):
     * only what the pass wrote of its own can have made one */
    for (pass = 1; ours && has_secret_run(dst, n, folded, slen, piece_min); pass++) {
        if (pass == SANITIZE_PASSES || (again == NULL && (again = malloc(dstcap)) == NULL))
            goto withhold;
        memcpy(again, dst, n + 1);
        /* the text is clean already: only runs change (the mark may make it longer than
         * maxchars: then it is cut again, and still ends in one "...") */
        sanitize_pass(dst, dstcap, &n, again, n, folded, slen, piece_min, maxchars, escape);
    }
    *outlen = n;
    goto done;
withhold:
    memcpy(dst, withheld, sizeof withheld);
    *outlen = sizeof withheld - 1;
done:
    free(again);
    cos_wipe(folded, sizeof folded);
    return ours;
}

void cos_sanitize(char *dst, size_t dstcap, const char *src, size_t srclen, const char *secret,
                  size_t maxchars)
{
    size_t n;
    sanitize_text(dst, dstcap, &n, src, srclen, secret, maxchars, 1);
}

int cos_sanitize_unchanged(const char *s, size_t n, const char *secret)
{
    /* the buffer holds all of s and the longest step (the mark, 10 bytes) past it, and is
     * never under what the sanitizer needs to write anything (its "withheld" text) */
    size_t cap = n + 64, len;
    char *out = malloc(cap);
    int same;
    if (out == NULL)
        return -1;
    same = sanitize_text(out, cap, &len, s, n, secret, n, 1) == 0;
    free(out);
    return same;
}

int cos_redact(cos_buf *out, const char *s, size_t n, const char *secret)
{
    /* a run becomes the mark: 10 characters for at least 8 of the key (of every shorter
     * key); past 1.25 x the text's length plus 16 the result is cut, so the copy stays
     * within 5 x + 64 bytes whatever the key */
    size_t maxchars = n + n / 4 + 16, cap = 4 * maxchars + 16, len;
    char *buf;
    int changed = 0;

    if (secret == NULL || secret[0] == '\0')
        return 0;
    /* the common case, text with no run, costs one pass of table lookups */
    if (!may_hold_secret(s, n, secret))
        return 0;
    if ((buf = malloc(cap)) == NULL)
        return -1;
    changed = sanitize_text(buf, cap, &len, s, n, secret, maxchars, 0);
    if (changed) {
        cos_buf_free(out);
        out->data = buf;
        out->len = len;
        out->cap = cap;
    } else {
        free(buf);
    }
    return changed;
}

int cos_sanitize_buf(cos_buf *b, const char *src, size_t srclen, const char *secret,
                     size_t maxchars)
{
    /* an output character is at most 4 bytes, an input byte at most 10 ("[redacted]") */
    size_t cap = (srclen < maxchars ? srclen : maxchars) * 10 + 64;
    char *out = malloc(cap);
    if (out == NULL)
        return -1;
    cos_sanitize(out, cap, src, srclen, secret, maxchars);
    free(b->data);
    b->data = out;
    b->len = strlen(out);
    b->cap = cap;
    return 0;
}

int cos_exec_out_seal(cos_exec_out *x, const char *secret)
{
    int rc = 0;
    pthread_mutex_lock(&x->mu);
    if (x->error.len > 0)
        rc = cos_sanitize_buf(&x->error, x->error.data, x->error.len, secret, COS_ERROR_TEXT_MAX);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int cos_ascii_alnum(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

int cos_ascii_caseeq(const char *a, const char *b, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (ascii_lower((unsigned char)a[i]) != ascii_lower((unsigned char)b[i]))
            return 0;
    return 1;
}

void cos_wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n--)
        *v++ = 0;
}

void cos_strlcpy(char *dst, const char *src, size_t dstcap)
{
    size_t n;
    if (dstcap == 0)
        return;
    n = strlen(src);
    if (n >= dstcap)
        n = dstcap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* The fork watch. Every engine entry point asks whether the process forked since the
 * engine was made; asking getpid() each time cost about 20 system calls per backend run
 * (issue 45). Instead a pthread_atfork child handler records the child's pid once per
 * fork, and the question is one atomic load. pthread_atfork gives its handlers no
 * argument, so what the handler writes cannot live in per-module state: this pid (and the
 * pthread_once that registers the handler) are the C core's only mutable globals, and are
 * process-wide by nature (a fork forks every module instance and every interpreter). The
 * handler stays registered for the life of the process, which is safe because CPython
 * never unloads an extension module. A fork that bypasses libc's fork() (a raw clone
 * system call) runs no handler and is not seen here; Python's os.fork, multiprocessing and
 * C code calling fork() all are. */
static pthread_once_t fork_watch_once = PTHREAD_ONCE_INIT;
static atomic_long process_pid;

static void fork_watch_child(void)
{
    atomic_store(&process_pid, (long)getpid()); /* async-signal-safe, as a handler must be */
}

static void fork_watch_start(void)
{
    atomic_store(&process_pid, (long)getpid());
    pthread_atfork(NULL, NULL, fork_watch_child);
}

pid_t cos_process_pid(void)
{
    pthread_once(&fork_watch_once, fork_watch_start);
    return (pid_t)atomic_load(&process_pid);
}

int cos_on_main_thread(void)
{
#ifdef SYS_gettid
    return (pid_t)syscall(SYS_gettid) == cos_process_pid();
#else
    return 1; /* unknown: look at signals, as every thread did before */
#endif
}

double cos_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

void cos_deadline_in(double ms, struct timespec *ts)
{
    double end = cos_now_ms() + (ms > 0 ? ms : 0);
    ts->tv_sec = (time_t)(end / 1000.0);
    ts->tv_nsec = (long)((end - (double)ts->tv_sec * 1000.0) * 1e6);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
    if (ts->tv_nsec < 0)
        ts->tv_nsec = 0;
}
