/* LD_PRELOAD shim: holds the I/O thread. The first STALL_DELETES (default 1) sends of an HTTP
 * request starting with "DELETE " block for STALL_SECONDS (default 8), signals or not, before
 * the bytes go out; SIGINT_AFTER seconds into the first stall (when set) the process gets a
 * SIGINT, as from Ctrl-C. Every other send goes straight through. Built by
 * tests/native/test_cleanup_interrupt.py with gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef ssize_t (*send_fn)(int, const void *, size_t, int);

static atomic_int stalled;

static void sleep_whole(double seconds)
{
    struct timespec left;
    left.tv_sec = (time_t)seconds;
    left.tv_nsec = (long)((seconds - (double)left.tv_sec) * 1e9);
    while (nanosleep(&left, &left) == -1 && errno == EINTR)
        ;
}

static double env_seconds(const char *name, double fallback)
{
    const char *s = getenv(name);
    return s && *s ? atof(s) : fallback;
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    send_fn real = (send_fn)dlsym(RTLD_NEXT, "send");
    if (len >= 7 && memcmp(buf, "DELETE ", 7) == 0) {
        int n = atomic_fetch_add(&stalled, 1);
        if (n < (int)env_seconds("STALL_DELETES", 1)) {
            double total = env_seconds("STALL_SECONDS", 8), sigint = env_seconds("SIGINT_AFTER", -1);
            if (n == 0 && sigint >= 0 && sigint < total) {
                sleep_whole(sigint);
                kill(getpid(), SIGINT);
                total -= sigint;
            }
            sleep_whole(total);
        }
    }
    return real(fd, buf, len, flags);
}
