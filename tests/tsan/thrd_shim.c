/* thrd_shim: C11 threads through pthreads, for the ThreadSanitizer build of
 * the tests only.
 *
 * librdkafka (Debian's 2.0.2) starts its threads and takes its locks with
 * glibc's C11 functions (thrd_create, mtx_lock, cnd_wait, ...), which GCC
 * 12's ThreadSanitizer does not intercept: a thread started that way runs
 * with no TSan state and crashes at its first allocation, and its locking
 * is invisible, so every access it protects looks like a race. Defined in
 * the test program, these functions take precedence over glibc's for
 * librdkafka (symbol interposition) and forward to the pthread functions
 * TSan does intercept. On glibc thrd_t, mtx_t and cnd_t are pthread_t,
 * pthread_mutex_t and pthread_cond_t, so the forwarding is exact. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

typedef struct start {
    thrd_start_t fn;
    void *arg;
} start_t;

static void *trampoline(void *p) {
    start_t s = *(start_t *)p;
    free(p);
    return (void *)(intptr_t)s.fn(s.arg);
}

static int result(int rc) {
    return rc == 0           ? thrd_success
           : rc == ETIMEDOUT ? thrd_timedout
           : rc == EBUSY     ? thrd_busy
           : rc == ENOMEM    ? thrd_nomem
                             : thrd_error;
}

int thrd_create(thrd_t *thr, thrd_start_t fn, void *arg) {
    start_t *s = malloc(sizeof(*s));
    if (!s) {
        return thrd_nomem;
    }
    s->fn = fn;
    s->arg = arg;
    int rc = pthread_create((pthread_t *)thr, NULL, trampoline, s);
    if (rc != 0) {
        free(s);
    }
    return result(rc);
}

int thrd_join(thrd_t thr, int *res) {
    void *ret = NULL;
    int rc = pthread_join((pthread_t)thr, &ret);
    if (rc == 0 && res) {
        *res = (int)(intptr_t)ret;
    }
    return result(rc);
}

int mtx_init(mtx_t *m, int type) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    if (type & mtx_recursive) {
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    }
    int rc = pthread_mutex_init((pthread_mutex_t *)m, &a);
    pthread_mutexattr_destroy(&a);
    return result(rc);
}

int mtx_lock(mtx_t *m) {
    return result(pthread_mutex_lock((pthread_mutex_t *)m));
}

int mtx_unlock(mtx_t *m) {
    return result(pthread_mutex_unlock((pthread_mutex_t *)m));
}

void mtx_destroy(mtx_t *m) {
    pthread_mutex_destroy((pthread_mutex_t *)m);
}

int cnd_init(cnd_t *c) {
    return result(pthread_cond_init((pthread_cond_t *)c, NULL));
}

int cnd_signal(cnd_t *c) {
    return result(pthread_cond_signal((pthread_cond_t *)c));
}

int cnd_broadcast(cnd_t *c) {
    return result(pthread_cond_broadcast((pthread_cond_t *)c));
}

int cnd_wait(cnd_t *c, mtx_t *m) {
    return result(pthread_cond_wait((pthread_cond_t *)c, (pthread_mutex_t *)m));
}

int cnd_timedwait(cnd_t *restrict c, mtx_t *restrict m, const struct timespec *restrict ts) {
    return result(pthread_cond_timedwait((pthread_cond_t *)c, (pthread_mutex_t *)m, ts));
}

void cnd_destroy(cnd_t *c) {
    pthread_cond_destroy((pthread_cond_t *)c);
}

void call_once(once_flag *flag, void (*fn)(void)) {
    pthread_once((pthread_once_t *)flag, fn);
}
