
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The kernel registry under contention: two concurrent first requests for
 * one key spawn exactly one kernel.
 *
 * Links the real src/ngx_hermes_registry.c with nginx's own rbtree, slab
 * allocator and shmtx (see Makefile) in a shared zone made as nginx makes
 * one, then forks processes, as nginx forks workers, that go through the
 * public calls a cell makes (acquire, poll while queued, spawned, release)
 * on the same few keys at once: a fresh set of keys every round, all
 * processes let go together at a barrier in shared memory.  Every key must
 * be spawned exactly once and be in the registry once.
 *
 * A registry that lets go of the lock between its lookup and its insert
 * fails this within a few hundred rounds on two cores.
 *
 * Knobs, from the environment (defaults in brackets):
 *
 *   HERMES_RACE_PROCS    processes [6]
 *   HERMES_RACE_ROUNDS   rounds [3000]
 *   HERMES_RACE_KEYS     keys a round [3]
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_hermes.h"
#include "ngx_hermes_registry_zone.h"
#include "ngx_unit_shim.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>


#define RACE_TAG        "0f1e2d3c4b5a6978"     /* a backend tag: 16 hex */
#define RACE_KEY_MAX    64


typedef struct {
    ngx_atomic_t             arrived;           /* the barrier */
    ngx_atomic_t             errors;
    ngx_atomic_t             spawns[1];         /* a counter a key */
} race_shared_t;


typedef struct {
    ngx_uint_t               procs;
    ngx_uint_t               rounds;
    ngx_uint_t               keys;
    ngx_str_t                root;
    ngx_shm_zone_t           shm_zone;
    ngx_http_hermes_zone_t   zone;
    race_shared_t           *shared;
    size_t                   shared_size;
} race_t;


static ngx_uint_t
env_uint(const char *name, ngx_uint_t dflt)
{
    char  *v;

    v = getenv(name);

    return (v && *v) ? (ngx_uint_t) strtoul(v, NULL, 10) : dflt;
}


/* key "owner \0 tag \0 session", as ngx_hermes_cell.c builds it */

static void
race_ref(ngx_http_hermes_kernel_ref_t *ref, u_char *buf, ngx_uint_t round,
    ngx_uint_t k)
{
    u_char  *p;

    ngx_memzero(ref, sizeof(ngx_http_hermes_kernel_ref_t));

    /* two owners, so that owners' runs of the tree interleave */

    p = ngx_sprintf(buf, "racer-%ui", k % 2);

    ref->owner.data = buf;
    ref->owner.len = p - buf;

    *p++ = '\0';
    p = ngx_cpymem(p, RACE_TAG, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
    *p++ = '\0';

    ref->session.data = p;
    p = ngx_sprintf(p, "round-%06ui-key-%ui", round, k);
    ref->session.len = p - ref->session.data;

    ref->key.data = buf;
    ref->key.len = p - buf;
}


/* one cell on a key: acquire, wait for the turn, spawn or run, release */

static ngx_int_t
race_cell(race_t *r, ngx_uint_t round, ngx_uint_t k)
{
    ngx_int_t                      rc;
    ngx_uint_t                     polls;
    ngx_http_hermes_victims_t      victims;
    ngx_http_hermes_kernel_ref_t   ref;
    ngx_http_hermes_spawned_t      sp;
    u_char                         buf[RACE_KEY_MAX];

    race_ref(&ref, buf, round, k);

    victims.n = 0;

    rc = ngx_http_hermes_registry_acquire(&r->zone, &ref, &r->root,
                                          r->procs, &victims);

    for (polls = 0; rc == NGX_HTTP_HERMES_ACQ_WAIT; polls++) {
        if (polls > 10000000) {
            return NGX_ERROR;
        }

        sched_yield();
        rc = ngx_http_hermes_registry_poll(&r->zone, &ref, &r->root);
    }

    switch (rc) {

    case NGX_HTTP_HERMES_ACQ_SPAWN:
        (void) ngx_atomic_fetch_add(&r->shared->spawns[round * r->keys + k],
                                    1);

        ngx_memzero(&sp, sizeof(ngx_http_hermes_spawned_t));
        ngx_memcpy(sp.kernel_id, ref.kernel_id, NGX_HTTP_HERMES_ID_LEN);
        ngx_memcpy(sp.dir, ref.dir, ref.dir_len);
        sp.dir_len = ref.dir_len;
        sp.pid = (ngx_pid_t) (4000000 + round);

        if (ngx_http_hermes_registry_spawned(&r->zone, &ref, &sp) != NGX_OK) {
            return NGX_ERROR;
        }

        break;

    case NGX_HTTP_HERMES_ACQ_RUN:
        break;

    default:
        return NGX_ERROR;
    }

    ngx_http_hermes_registry_release(&r->zone, &ref,
                                     NGX_HTTP_HERMES_RELEASE_DONE, 1);

    return NGX_OK;
}


static void
race_child(race_t *r, ngx_uint_t id)
{
    ngx_uint_t  round, i, k;

    /* the shmtx lock is taken in ngx_pid's name, as by a worker */
    ngx_pid = getpid();

    for (round = 0; round < r->rounds; round++) {

        (void) ngx_atomic_fetch_add(&r->shared->arrived, 1);

        while (r->shared->arrived < (round + 1) * r->procs) {
            sched_yield();
        }

        /* the keys in a different order in each process */

        for (i = 0; i < r->keys; i++) {
            k = (i + id) % r->keys;

            if (race_cell(r, round, k) != NGX_OK) {
                (void) ngx_atomic_fetch_add(&r->shared->errors, 1);
            }
        }
    }

    _exit(0);
}


static int
key_cmp(const void *a, const void *b)
{
    ngx_http_hermes_node_t  *x = *(ngx_http_hermes_node_t **) a;
    ngx_http_hermes_node_t  *y = *(ngx_http_hermes_node_t **) b;

    return ngx_memn2cmp(x->data, y->data, x->key_len, y->key_len);
}


static void
test_one_spawn_per_key(void **state)
{
    race_t  *r = *state;

    int                       status;
    pid_t                     pid, *pids;
    ngx_uint_t                i, n, nkeys, once, dups, bad;
    ngx_queue_t              *q;
    ngx_http_hermes_node_t  **all;

    pids = calloc(r->procs, sizeof(pid_t));
    assert_non_null(pids);

    for (i = 0; i < r->procs; i++) {
        pid = fork();
        assert_true(pid >= 0);

        if (pid == 0) {
            race_child(r, i);
        }

        pids[i] = pid;
    }

    bad = 0;

    for (i = 0; i < r->procs; i++) {
        if (waitpid(pids[i], &status, 0) != pids[i]
            || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        {
            bad++;
        }
    }

    free(pids);

    assert_int_equal(bad, 0);

    nkeys = r->rounds * r->keys;
    once = 0;

    for (i = 0; i < nkeys; i++) {
        if (r->shared->spawns[i] == 1) {
            once++;

        } else if (bad++ < 5) {
            printf("# key %lu of round %lu spawned %lu times\n",
                   (unsigned long) (i % r->keys),
                   (unsigned long) (i / r->keys),
                   (unsigned long) r->shared->spawns[i]);
        }
    }

    /* every key once in the registry: sorted, no two alike */

    all = malloc(nkeys * 2 * sizeof(ngx_http_hermes_node_t *));
    assert_non_null(all);

    n = 0;

    /* entries with a kernel, and those without */

    for (q = ngx_queue_head(&r->zone.sh->lru);
         q != ngx_queue_sentinel(&r->zone.sh->lru) && n < nkeys * 2;
         q = ngx_queue_next(q))
    {
        all[n++] = ngx_queue_data(q, ngx_http_hermes_node_t, queue);
    }

    for (q = ngx_queue_head(&r->zone.sh->lost);
         q != ngx_queue_sentinel(&r->zone.sh->lost) && n < nkeys * 2;
         q = ngx_queue_next(q))
    {
        all[n++] = ngx_queue_data(q, ngx_http_hermes_node_t, queue);
    }

    qsort(all, n, sizeof(ngx_http_hermes_node_t *), key_cmp);

    dups = 0;

    for (i = 1; i < n; i++) {
        if (key_cmp(&all[i - 1], &all[i]) == 0) {
            dups++;
        }
    }

    free(all);

    printf("# %lu processes, %lu rounds of %lu keys: %lu spawned once, "
           "%lu entries, %lu duplicates, %lu kernels, %lu cells failed\n",
           (unsigned long) r->procs, (unsigned long) r->rounds,
           (unsigned long) r->keys, (unsigned long) once, (unsigned long) n,
           (unsigned long) dups, (unsigned long) r->zone.sh->kernels,
           (unsigned long) r->shared->errors);

    assert_int_equal(once, nkeys);
    assert_int_equal(dups, 0);
    assert_int_equal(n, nkeys);
    assert_int_equal(r->zone.sh->kernels, nkeys);
    assert_int_equal(r->shared->errors, 0);
    assert_int_equal(ngx_unit_log_errors, 0);
}


static int
setup(void **state)
{
    size_t   size;
    race_t  *r;

    if (ngx_unit_init() != NGX_OK) {
        return -1;
    }

    r = calloc(1, sizeof(race_t));
    if (r == NULL) {
        return -1;
    }

    r->procs = env_uint("HERMES_RACE_PROCS", 6);
    r->rounds = env_uint("HERMES_RACE_ROUNDS", 3000);
    r->keys = env_uint("HERMES_RACE_KEYS", 3);

    if (r->procs < 2 || r->rounds == 0 || r->keys == 0
        || r->rounds > 999999)
    {
        fprintf(stderr, "registry_race: bad HERMES_RACE_* knobs\n");
        free(r);
        return -1;
    }

    ngx_str_set(&r->root, "/tmp");

    /* entries of 512 bytes, and room for the slab's own pages */

    size = ngx_align(r->rounds * r->keys * 1024 + (1 << 20), ngx_pagesize);

    if (ngx_unit_shm_zone(&r->shm_zone, "race", size) != NGX_OK) {
        free(r);
        return -1;
    }

    r->zone.shm_zone = &r->shm_zone;
    r->zone.max_kernels = (ngx_uint_t) -1;
    r->zone.max_kernels_per_owner = (ngx_uint_t) -1;
    r->zone.idle_timeout = 7 * 24 * 3600 * 1000;
    r->zone.sweep = 10000;
    r->shm_zone.data = &r->zone;

    if (ngx_http_hermes_registry_init_zone(&r->shm_zone, NULL) != NGX_OK) {
        ngx_unit_shm_free(&r->shm_zone);
        free(r);
        return -1;
    }

    /* what the processes report, shared as the zone is */

    r->shared_size = sizeof(race_shared_t)
                     + r->rounds * r->keys * sizeof(ngx_atomic_t);

    r->shared = mmap(NULL, r->shared_size, PROT_READ|PROT_WRITE,
                     MAP_ANON|MAP_SHARED, -1, 0);

    if (r->shared == MAP_FAILED) {
        ngx_unit_shm_free(&r->shm_zone);
        free(r);
        return -1;
    }

    *state = r;

    return 0;
}


static int
teardown(void **state)
{
    race_t  *r = *state;

    if (r == NULL) {
        return 0;
    }

    (void) munmap(r->shared, r->shared_size);
    ngx_unit_shm_free(&r->shm_zone);
    free(r);

    return 0;
}


int
main(void)
{
    static const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_one_spawn_per_key),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);

    return cmocka_run_group_tests_name("registry_race", tests, setup,
                                       teardown);
}
