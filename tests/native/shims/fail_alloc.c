/* LD_PRELOAD shim: out of memory on demand, for tests/native/test_outcome_oom.py. Once the test
 * calls shim_fail_strdup(prefix) through ctypes, strdup fails (ENOMEM) for every string that
 * starts with prefix; shim_fail_calloc(size) makes calloc(1, size) fail for that one size (0:
 * none); shim_failures() counts the failures made. Every other call goes to the C library.
 * Under AddressSanitizer the shim is never reached (ASan's allocator answers first), so the
 * test skips there. Built by the test with gcc. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_calloc(size_t nmemb, size_t size);
extern void *__libc_malloc(size_t size);

static char strdup_prefix[128];
static atomic_int strdup_armed;
static atomic_size_t calloc_size;
static atomic_int failures;

void shim_fail_strdup(const char *prefix)
{
    atomic_store(&strdup_armed, 0);
    strncpy(strdup_prefix, prefix ? prefix : "", sizeof strdup_prefix - 1);
    atomic_store(&strdup_armed, strdup_prefix[0] != '\0');
}

void shim_fail_calloc(size_t size)
{
    atomic_store(&calloc_size, size);
}

int shim_failures(void)
{
    return atomic_load(&failures);
}

char *strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *copy;
    if (atomic_load(&strdup_armed) && strncmp(s, strdup_prefix, strlen(strdup_prefix)) == 0) {
        atomic_fetch_add(&failures, 1);
        errno = ENOMEM;
        return NULL;
    }
    if ((copy = __libc_malloc(n)) != NULL)
        memcpy(copy, s, n);
    return copy;
}

void *calloc(size_t nmemb, size_t size)
{
    size_t armed = atomic_load(&calloc_size);
    if (armed != 0 && nmemb == 1 && size == armed) {
        atomic_fetch_add(&failures, 1);
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(nmemb, size);
}
