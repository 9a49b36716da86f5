
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The few symbols of nginx's core that the registry and the nginx core
 * files compiled beside it (see Makefile) need at link time, and that
 * live in files of nginx we do not compile (nginx.c, ngx_cycle.c,
 * ngx_log.c, ngx_process.c, ngx_posix_init.c).
 *
 * Nothing here stands in for what is measured: the rbtree, the slab
 * allocator, the shmtx lock, crc32, the string functions and the cached
 * time are nginx's own code.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_unit_shim.h"


/* os/unix/ngx_process.c */
ngx_pid_t               ngx_pid;

/* os/unix/ngx_posix_init.c */
ngx_int_t               ngx_ncpu;

/* core/ngx_cycle.c: the slab allocator logs its errors to ngx_cycle->log */
volatile ngx_cycle_t   *ngx_cycle;

/*
 * event/ngx_event_posted.c: the registry posts a warm pool's refill;
 * the zones made here have no warm event, so the queue stays empty
 */
ngx_queue_t             ngx_posted_events;

static ngx_cycle_t      ngx_unit_cycle;
static ngx_log_t        ngx_unit_log;

ngx_uint_t              ngx_unit_log_errors;  /* lines at NGX_LOG_ERR or worse */


/*
 * core/ngx_log.c: one line to stderr, formatted by nginx's own
 * ngx_vslprintf(); lines at "error" or worse are counted so that a test
 * can fail on them (as the perl tests fail on an alert in error.log)
 */

void
ngx_log_error_core(ngx_uint_t level, ngx_log_t *log, ngx_err_t err,
    const char *fmt, ...)
{
    u_char   *p, *last;
    va_list   args;
    u_char    errstr[NGX_MAX_ERROR_STR];

    static const char  *levels[] = {
        "stderr", "emerg", "alert", "crit", "error", "warn", "notice",
        "info", "debug"
    };

    last = errstr + NGX_MAX_ERROR_STR - 1;

    p = ngx_slprintf(errstr, last, "nginx [%s] ",
                     levels[level < 9 ? level : 8]);

    va_start(args, fmt);
    p = ngx_vslprintf(p, last, fmt, args);
    va_end(args);

    if (err) {
        p = ngx_slprintf(p, last, " (%d: %s)", err, strerror(err));
    }

    *p++ = '\n';

    (void) ngx_write_fd(ngx_stderr, errstr, p - errstr);

    if (level <= NGX_LOG_ERR) {
        ngx_unit_log_errors++;
    }
}


/*
 * os/unix/ngx_process.c: nginx stops or aborts here if "debug_points" is
 * set, and goes on otherwise; the slab allocator calls it on a corrupted
 * pool, which a test must never go on from
 */

void
ngx_debug_point(void)
{
    ngx_abort();
}


/*
 * What nginx's main() does before any shared zone exists (nginx.c:
 * ngx_time_init(), ngx_os_init() -> ngx_os_specific_init/ngx_posix_init's
 * page size, cache line and cpu count, ngx_crc32_table_init(),
 * ngx_slab_sizes_init()), in the same order.
 */

ngx_int_t
ngx_unit_init(void)
{
    ngx_uint_t  n;

    ngx_unit_log.log_level = NGX_LOG_NOTICE;
    ngx_unit_cycle.log = &ngx_unit_log;
    ngx_cycle = &ngx_unit_cycle;

    ngx_queue_init(&ngx_posted_events);

    ngx_pid = getpid();

    ngx_time_init();

    ngx_pagesize = getpagesize();
    ngx_cacheline_size = NGX_CPU_CACHE_LINE;

    for (n = ngx_pagesize; n >>= 1; ngx_pagesize_shift++) { /* void */ }

    ngx_ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ngx_ncpu < 1) {
        ngx_ncpu = 1;
    }

    if (ngx_crc32_table_init() != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_slab_sizes_init();

    return NGX_OK;
}


/*
 * A shared zone as nginx makes one: os/unix/ngx_shmem.c's ngx_shm_alloc()
 * (an anonymous shared mapping), then ngx_cycle.c's ngx_init_zone_pool()
 * (the slab pool at the start of the zone, its mutex on the pool's lock).
 */

ngx_int_t
ngx_unit_shm_zone(ngx_shm_zone_t *shm_zone, char *name, size_t size)
{
    ngx_slab_pool_t  *sp;

    ngx_memzero(shm_zone, sizeof(ngx_shm_zone_t));

    shm_zone->shm.addr = (u_char *) mmap(NULL, size, PROT_READ|PROT_WRITE,
                                         MAP_ANON|MAP_SHARED, -1, 0);

    if (shm_zone->shm.addr == MAP_FAILED) {
        return NGX_ERROR;
    }

    shm_zone->shm.size = size;
    shm_zone->shm.name.data = (u_char *) name;
    shm_zone->shm.name.len = ngx_strlen(name);
    shm_zone->shm.log = &ngx_unit_log;
    shm_zone->shm.exists = 0;

    sp = (ngx_slab_pool_t *) shm_zone->shm.addr;

    sp->end = shm_zone->shm.addr + shm_zone->shm.size;
    sp->min_shift = 3;
    sp->addr = shm_zone->shm.addr;

#if !(NGX_HAVE_ATOMIC_OPS)
#error "the unit tests need NGX_HAVE_ATOMIC_OPS (no lock file)"
#endif

    if (ngx_shmtx_create(&sp->mutex, &sp->lock, NULL) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_slab_init(sp);

    return NGX_OK;
}


void
ngx_unit_shm_free(ngx_shm_zone_t *shm_zone)
{
    ngx_slab_pool_t  *sp;

    sp = (ngx_slab_pool_t *) shm_zone->shm.addr;

    ngx_shmtx_destroy(&sp->mutex);

    (void) munmap(shm_zone->shm.addr, shm_zone->shm.size);
}
