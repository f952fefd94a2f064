/* LD_PRELOAD shim: getaddrinfo for any name containing "stall" blocks for
 * STALL_SECONDS (default 20), signals or not, then fails; every other name resolves normally.
 * Built by tests/native/test_deadlines.py with gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    gai_fn real;
    if (node != NULL && strstr(node, "stall") != NULL) {
        const char *s = getenv("STALL_SECONDS");
        struct timespec left = {s ? atoi(s) : 20, 0};
        /* The whole stall even when a signal lands on this (resolver) thread: the test's
         * Ctrl-C is process-directed, and an interrupted sleep() would end the stall early. */
        while (nanosleep(&left, &left) == -1 && errno == EINTR)
            ;
        return EAI_AGAIN;
    }
    real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    return real(node, service, hints, res);
}
