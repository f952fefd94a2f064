/* LD_PRELOAD shim: pthread_create fails with EAGAIN (a process at its thread limit) once the
 * test calls shim_refuse_threads(1) through ctypes; every thread before that starts as usual.
 * Built by tests/native/test_process_model.py with gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

static atomic_int refusing;

void shim_refuse_threads(int on)
{
    atomic_store(&refusing, on);
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    create_fn real = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
    if (atomic_load(&refusing))
        return EAGAIN;
    return real(t, attr, fn, arg);
}
