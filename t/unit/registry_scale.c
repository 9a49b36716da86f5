
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The kernel registry at scale: with 100,000 entries, the lookup cost
 * stays flat (O(log n)) and an entry takes at most 512 bytes of zone.
 *
 * Links the real src/ngx_hermes_registry.c with nginx's own rbtree, slab
 * allocator, shmtx, crc32 and string code (see Makefile), in a shared zone
 * made as nginx makes one.  Fills the registry through the public calls a
 * cell makes (acquire -> spawned -> release DONE), then at each size times
 * random lookups of existing keys (acquire + release: what every execute
 * on an existing session costs) and measures the zone bytes per entry.
 *
 * Each size has its own zone; timing rounds go over the sizes in turn and
 * a size's best round counts, so that a busy machine slows all alike.  The
 * default ratio limit is 4, not 3: at 100,000 entries the zone (51 MB) is
 * past the caches and TLB, and every lower level of the tree is a miss, so
 * the 100k/1k ratio of a sound O(log n) registry measures 2.2-3.3 here;
 * O(sqrt n) would be 10, linear 100 (the mutant, see mutant_linear.pl).
 *
 * Knobs, from the environment (defaults in brackets):
 *
 *   HERMES_SCALE_SIZES        registry sizes, ascending [1000,10000,100000]
 *   HERMES_SCALE_LOOKUPS      random lookups per round and size [5000]
 *   HERMES_SCALE_ROUNDS       rounds; a size's best one counts [12]
 *   HERMES_SCALE_MAX_RATIO    cost at the largest size / at the smallest [4]
 *   HERMES_SCALE_MAX_BYTES    zone bytes per entry [512]
 *   HERMES_SCALE_OWNER_LEN    key sizes: owner [10],
 *   HERMES_SCALE_SESSION_LEN  session [16] (16..128),
 *   HERMES_SCALE_ROOT         kernels' root directory ["/tmp"]
 *   HERMES_SCALE_OWNERS       distinct owners [1000]
 *   HERMES_SCALE_TESTS        only these tests (names, comma-separated)
 *
 * Figures go to stdout as "# ..." lines; cmocka reports the tests.
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


#define SCALE_MAX_SIZES   8
#define SCALE_TAG         "0f1e2d3c4b5a6978"     /* a backend tag: 16 hex */


typedef struct {
    ngx_uint_t               entries;
    ngx_shm_zone_t           shm_zone;          /* a zone per size */
    ngx_http_hermes_zone_t   zone;
    double                   ns_acquire;        /* acquire + release */
    double                   ns_poll;           /* poll: a bare lookup */
    double                   bytes_per_entry;   /* slab pages, pfree delta */
    double                   bytes_used_stats;  /* registry_stats' view */
    double                   ns_stats;          /* linear, informational */
    double                   ns_list;
    double                   ns_shutdown;
    double                   ns_sweep_full;
} scale_point_t;


typedef struct {
    /* knobs */
    ngx_uint_t               sizes[SCALE_MAX_SIZES];
    ngx_uint_t               nsizes;
    ngx_uint_t               lookups;
    ngx_uint_t               rounds;
    double                   max_ratio;
    double                   max_bytes;
    size_t                   owner_len;
    size_t                   session_len;
    ngx_str_t                root;
    ngx_uint_t               owners;

    /* the keys: "owner \0 tag \0 session", all of key_len */
    size_t                   key_len;
    u_char                  *keys;
    ngx_uint_t               nkeys;

    scale_point_t            points[SCALE_MAX_SIZES];
    ngx_uint_t               measured;
} scale_t;


static ngx_uint_t
env_uint(const char *name, ngx_uint_t dflt)
{
    char  *v;

    v = getenv(name);

    return (v && *v) ? (ngx_uint_t) strtoul(v, NULL, 10) : dflt;
}


static double
env_double(const char *name, double dflt)
{
    char  *v;

    v = getenv(name);

    return (v && *v) ? strtod(v, NULL) : dflt;
}


static uint64_t
splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}


static double
now_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (double) ts.tv_sec * 1e9 + ts.tv_nsec;
}


/* len hex digits from a stream seeded by "seed": the first 16 are unique */

static u_char *
fill_hex(u_char *p, size_t len, uint64_t seed)
{
    size_t    i;
    uint64_t  v;

    static const u_char  hex[] = "0123456789abcdef";

    v = splitmix64(seed);

    for (i = 0; i < len; i++) {
        if (i && i % 16 == 0) {
            v = splitmix64(v);
        }

        *p++ = hex[(v >> (60 - 4 * (i % 16))) & 0xf];
    }

    return p;
}


/* key i, as ngx_hermes_cell.c builds it: owner \0 backend-tag \0 session */

static void
make_key(scale_t *s, u_char *p, ngx_uint_t i, uint64_t session_seed)
{
    u_char  *q;
    u_char   num[NGX_INT_T_LEN + 1];
    size_t   n;

    /* owner: "user-" and its number, padded with zeros to owner_len */

    q = ngx_sprintf(num, "%ui", i % s->owners);
    n = q - num;

    ngx_memset(p, '0', s->owner_len);
    ngx_memcpy(p, "user-", ngx_min(5, s->owner_len));

    if (n <= s->owner_len) {
        ngx_memcpy(p + s->owner_len - n, num, n);
    }

    p += s->owner_len;
    *p++ = '\0';

    p = ngx_cpymem(p, SCALE_TAG, NGX_HTTP_HERMES_BACKEND_TAG_LEN);
    *p++ = '\0';

    (void) fill_hex(p, s->session_len, session_seed);
}


static void
set_ref(scale_t *s, ngx_http_hermes_kernel_ref_t *ref, u_char *key)
{
    ngx_memzero(ref, sizeof(ngx_http_hermes_kernel_ref_t));

    ref->key.data = key;
    ref->key.len = s->key_len;
    ref->owner.data = key;
    ref->owner.len = s->owner_len;
    ref->session.data = key + s->owner_len + 1
                        + NGX_HTTP_HERMES_BACKEND_TAG_LEN + 1;
    ref->session.len = s->session_len;
}


static ngx_pid_t
fake_pid(ngx_uint_t i)
{
    return (ngx_pid_t) (4000000 + i);
}


/* the request size and slab slot of one entry with these key sizes */

static size_t
entry_request(scale_t *s)
{
    return offsetof(ngx_http_hermes_node_t, data) + s->key_len
           + s->root.len + sizeof("/hermes_rkernel_") - 1
           + NGX_HTTP_HERMES_ID_LEN;
}


static size_t
slab_slot(size_t n)
{
    size_t  slot;

    if (n > ngx_pagesize / 2) {
        return ngx_align(n, ngx_pagesize);
    }

    for (slot = 8; slot < n; slot <<= 1) { /* void */ }

    return slot;
}


static ngx_int_t
make_zone(ngx_shm_zone_t *shm_zone, ngx_http_hermes_zone_t *zone,
    char *name, size_t size, ngx_uint_t max_kernels)
{
    if (ngx_unit_shm_zone(shm_zone, name, size) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_memzero(zone, sizeof(ngx_http_hermes_zone_t));

    zone->shm_zone = shm_zone;
    zone->max_kernels = max_kernels;
    zone->max_kernels_per_owner = max_kernels;
    zone->idle_timeout = 7 * 24 * 3600 * 1000;     /* nothing goes idle */
    zone->sweep = 10000;

    shm_zone->data = zone;

    return ngx_http_hermes_registry_init_zone(shm_zone, NULL);
}


/* a new entry, as a cell makes one: acquire (spawn), spawned, release */


/* the spawn task's report: the id and directory asked for, a pid */
static ngx_int_t
spawned(ngx_http_hermes_zone_t *zone, ngx_http_hermes_kernel_ref_t *ref,
    ngx_pid_t pid)
{
    ngx_http_hermes_spawned_t  k;

    ngx_memzero(&k, sizeof(ngx_http_hermes_spawned_t));
    ngx_memcpy(k.kernel_id, ref->kernel_id, NGX_HTTP_HERMES_ID_LEN);
    ngx_memcpy(k.dir, ref->dir, ref->dir_len);
    k.dir_len = ref->dir_len;
    k.pid = pid;
    k.start = 1;
    k.ino = 1;

    return ngx_http_hermes_registry_spawned(zone, ref, &k);
}

static ngx_int_t
insert_key(ngx_http_hermes_zone_t *zone, scale_t *s, u_char *key,
    ngx_pid_t pid, ngx_http_hermes_victims_t *victims)
{
    ngx_int_t                     rc;
    ngx_http_hermes_kernel_ref_t  ref;

    set_ref(s, &ref, key);
    victims->n = 0;

    rc = ngx_http_hermes_registry_acquire(zone, &ref, &s->root, 8, victims);
    if (rc != NGX_HTTP_HERMES_ACQ_SPAWN) {
        return rc;
    }

    if (spawned(zone, &ref, pid) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_hermes_registry_release(zone, &ref, NGX_HTTP_HERMES_RELEASE_DONE,
                                     1);

    return NGX_HTTP_HERMES_ACQ_SPAWN;
}


static int
setup(void **state)
{
    char        *v, *p;
    scale_t     *s;
    ngx_uint_t   i;

    if (ngx_unit_init() != NGX_OK) {
        return -1;
    }

    s = calloc(1, sizeof(scale_t));
    if (s == NULL) {
        return -1;
    }

    v = getenv("HERMES_SCALE_SIZES");
    v = strdup((v && *v) ? v : "1000,10000,100000");

    for (p = strtok(v, ","); p && s->nsizes < SCALE_MAX_SIZES;
         p = strtok(NULL, ","))
    {
        s->sizes[s->nsizes++] = strtoul(p, NULL, 10);
    }

    free(v);

    s->lookups = env_uint("HERMES_SCALE_LOOKUPS", 5000);
    s->rounds = env_uint("HERMES_SCALE_ROUNDS", 12);
    s->max_ratio = env_double("HERMES_SCALE_MAX_RATIO", 4.0);
    s->max_bytes = env_double("HERMES_SCALE_MAX_BYTES", 512.0);
    s->owner_len = env_uint("HERMES_SCALE_OWNER_LEN", 10);
    s->session_len = env_uint("HERMES_SCALE_SESSION_LEN", 16);
    s->owners = env_uint("HERMES_SCALE_OWNERS", 1000);

    v = getenv("HERMES_SCALE_ROOT");
    s->root.data = (u_char *) ((v && *v) ? v : "/tmp");
    s->root.len = ngx_strlen(s->root.data);

    if (s->nsizes == 0 || s->lookups == 0 || s->rounds == 0
        || s->owners == 0
        || s->owner_len < 1 || s->owner_len > NGX_HTTP_HERMES_OWNER_MAX
        || s->session_len < 16 || s->session_len > NGX_HTTP_HERMES_SESSION_MAX)
    {
        fprintf(stderr, "registry_scale: bad HERMES_SCALE_* knobs\n");
        free(s);
        return -1;
    }

    for (i = 1; i < s->nsizes; i++) {
        if (s->sizes[i] <= s->sizes[i - 1]) {
            fprintf(stderr, "registry_scale: HERMES_SCALE_SIZES must ascend\n");
            free(s);
            return -1;
        }
    }

    s->key_len = s->owner_len + 1 + NGX_HTTP_HERMES_BACKEND_TAG_LEN + 1
                 + s->session_len;

    s->nkeys = s->sizes[s->nsizes - 1];
    s->keys = malloc(s->nkeys * s->key_len);
    if (s->keys == NULL) {
        free(s);
        return -1;
    }

    for (i = 0; i < s->nkeys; i++) {
        make_key(s, s->keys + i * s->key_len, i, i);
    }

    *state = s;

    return 0;
}


static int
teardown(void **state)
{
    scale_t  *s = *state;

    ngx_uint_t  i;

    if (s == NULL) {
        return 0;
    }

    for (i = 0; i < s->nsizes; i++) {
        if (s->points[i].shm_zone.shm.addr) {
            ngx_unit_shm_free(&s->points[i].shm_zone);
        }
    }

    free(s->keys);
    free(s);

    return 0;
}


/* what one entry costs by construction, before anything is measured */

static void
test_entry_layout(void **state)
{
    scale_t  *s = *state;

    size_t  n;

    n = entry_request(s);

    printf("# entry: node header %zu bytes, key %zu, dir %zu: "
           "slab request %zu bytes, slot %zu bytes\n",
           offsetof(ngx_http_hermes_node_t, data), s->key_len,
           s->root.len + sizeof("/hermes_rkernel_") - 1
           + NGX_HTTP_HERMES_ID_LEN,
           n, slab_slot(n));

    /* a full page per entry would make the pfree arithmetic below lie */
    assert_true(n <= ngx_pagesize / 2);
}


/* a reload finds the registry where it was: by the old zone, or the shm */

static void
test_init_zone_reuse(void **state)
{
    ngx_shm_zone_t          shm_zone, again;
    ngx_http_hermes_zone_t  zone, zone2, zone3;

    (void) state;

    assert_int_equal(make_zone(&shm_zone, &zone, "reuse", 1 << 20, 64),
                     NGX_OK);

    assert_non_null(zone.sh);
    assert_ptr_equal(zone.shpool->data, zone.sh);
    assert_int_equal(zone.sh->kernels, 0);

    /* reload with the same zone: init(shm_zone, old zone's data) */
    ngx_memzero(&zone2, sizeof(zone2));
    again = shm_zone;
    again.data = &zone2;
    zone2.shm_zone = &again;
    assert_int_equal(ngx_http_hermes_registry_init_zone(&again, &zone),
                     NGX_OK);
    assert_ptr_equal(zone2.sh, zone.sh);

    /* the shm existed already (binary upgrade) */
    ngx_memzero(&zone3, sizeof(zone3));
    again.data = &zone3;
    again.shm.exists = 1;
    zone3.shm_zone = &again;
    assert_int_equal(ngx_http_hermes_registry_init_zone(&again, NULL),
                     NGX_OK);
    assert_ptr_equal(zone3.sh, zone.sh);

    ngx_unit_shm_free(&shm_zone);
}


/*
 * Two keys with one crc32 are two entries: the tree falls back to the
 * keys (ngx_memn2cmp).  The colliding pair is found by brute force over
 * sessions of one owner (about 2^16 tries by the birthday bound).
 */

typedef struct {
    uint32_t    hash;
    uint32_t    seed;
} crc_seen_t;


static int
crc_seen_cmp(const void *a, const void *b)
{
    const crc_seen_t  *x = a, *y = b;

    return (x->hash > y->hash) - (x->hash < y->hash);
}


static void
test_crc32_collision(void **state)
{
    scale_t  *s = *state;

    u_char                        *a, *b;
    uint32_t                       i, n;
    ngx_int_t                      rc;
    crc_seen_t                    *seen;
    ngx_shm_zone_t                 shm_zone;
    ngx_http_hermes_zone_t         zone;
    ngx_http_hermes_victims_t      victims;
    ngx_http_hermes_kernel_ref_t   ref;
    ngx_str_t                      owner, session;

    n = 1 << 18;

    seen = malloc(n * sizeof(crc_seen_t));
    a = malloc(s->key_len);
    b = malloc(s->key_len);
    assert_non_null(seen);
    assert_non_null(a);
    assert_non_null(b);

    for (i = 0; i < n; i++) {
        make_key(s, a, 7, 0x5eed0000ULL + i);
        seen[i].hash = ngx_crc32_short(a, s->key_len);
        seen[i].seed = i;
    }

    qsort(seen, n, sizeof(crc_seen_t), crc_seen_cmp);

    for (i = 1; i < n; i++) {
        if (seen[i].hash == seen[i - 1].hash) {
            break;
        }
    }

    assert_true(i < n);

    make_key(s, a, 7, 0x5eed0000ULL + seen[i - 1].seed);
    make_key(s, b, 7, 0x5eed0000ULL + seen[i].seed);
    free(seen);

    assert_int_equal(ngx_crc32_short(a, s->key_len),
                     ngx_crc32_short(b, s->key_len));
    assert_memory_not_equal(a, b, s->key_len);

    assert_int_equal(make_zone(&shm_zone, &zone, "crc", 1 << 20, 64), NGX_OK);

    assert_int_equal(insert_key(&zone, s, a, 1111, &victims),
                     NGX_HTTP_HERMES_ACQ_SPAWN);
    assert_int_equal(insert_key(&zone, s, b, 2222, &victims),
                     NGX_HTTP_HERMES_ACQ_SPAWN);
    assert_int_equal(zone.sh->kernels, 2);

    /* each key finds its own kernel */

    set_ref(s, &ref, a);
    victims.n = 0;
    rc = ngx_http_hermes_registry_acquire(&zone, &ref, &s->root, 8, &victims);
    assert_int_equal(rc, NGX_HTTP_HERMES_ACQ_RUN);
    assert_int_equal(ref.pid, 1111);
    ngx_http_hermes_registry_release(&zone, &ref,
                                     NGX_HTTP_HERMES_RELEASE_DONE, 2);

    set_ref(s, &ref, b);
    rc = ngx_http_hermes_registry_acquire(&zone, &ref, &s->root, 8, &victims);
    assert_int_equal(rc, NGX_HTTP_HERMES_ACQ_RUN);
    assert_int_equal(ref.pid, 2222);
    ngx_http_hermes_registry_release(&zone, &ref,
                                     NGX_HTTP_HERMES_RELEASE_DONE, 2);

    /* shutting one down leaves the other */

    owner.data = a;
    owner.len = s->owner_len;
    session.data = a + s->owner_len + 1 + NGX_HTTP_HERMES_BACKEND_TAG_LEN + 1;
    session.len = s->session_len;

    victims.n = 0;
    assert_int_equal(ngx_http_hermes_registry_shutdown(&zone, &owner, &session,
                                                       0, &victims),
                     NGX_OK);
    assert_int_equal(victims.n, 1);
    assert_int_equal(victims.v[0].pid, 1111);
    assert_int_equal(zone.sh->kernels, 1);

    set_ref(s, &ref, b);
    victims.n = 0;
    rc = ngx_http_hermes_registry_acquire(&zone, &ref, &s->root, 8, &victims);
    assert_int_equal(rc, NGX_HTTP_HERMES_ACQ_RUN);
    assert_int_equal(ref.pid, 2222);
    ngx_http_hermes_registry_release(&zone, &ref,
                                     NGX_HTTP_HERMES_RELEASE_DONE, 3);

    set_ref(s, &ref, a);
    rc = ngx_http_hermes_registry_acquire(&zone, &ref, &s->root, 8, &victims);
    assert_int_equal(rc, NGX_HTTP_HERMES_ACQ_SPAWN);
    ngx_http_hermes_registry_release(&zone, &ref,
                                     NGX_HTTP_HERMES_RELEASE_GONE, 0);

    ngx_unit_shm_free(&shm_zone);
    free(a);
    free(b);
}


/* random existing keys, a fresh draw for every round, size and use */

static void
draw_picks(uint32_t *pick, ngx_uint_t n, ngx_uint_t entries, uint64_t seed)
{
    ngx_uint_t  j;

    for (j = 0; j < n; j++) {
        pick[j] = (uint32_t) (splitmix64(seed * 0x100000000ULL + j) % entries);
    }
}


/*
 * acquire + release of existing keys, as every execute on an existing
 * session does; each must find its own entry (the fake pid it spawned with)
 */

static ngx_int_t
acquire_release(scale_t *s, scale_point_t *pt, uint32_t *pick, ngx_uint_t n)
{
    u_char                        *key;
    ngx_int_t                      rc;
    ngx_uint_t                     j, k;
    ngx_http_hermes_victims_t      victims;
    ngx_http_hermes_kernel_ref_t   ref;

    for (j = 0; j < n; j++) {
        k = pick[j];
        key = s->keys + k * s->key_len;

        set_ref(s, &ref, key);
        victims.n = 0;

        rc = ngx_http_hermes_registry_acquire(&pt->zone, &ref, &s->root, 8,
                                              &victims);

        if (rc != NGX_HTTP_HERMES_ACQ_RUN || ref.pid != fake_pid(k)
            || victims.n != 0)
        {
            print_error("lookup of entry %lu of %lu: rc %ld, pid %ld, "
                        "victims %lu\n", (unsigned long) k,
                        (unsigned long) pt->entries, (long) rc,
                        (long) ref.pid, (unsigned long) victims.n);
            return NGX_ERROR;
        }

        ngx_http_hermes_registry_release(&pt->zone, &ref,
                                         NGX_HTTP_HERMES_RELEASE_DONE,
                                         ref.execution_count + 1);
    }

    return NGX_OK;
}


/*
 * poll with a stale ticket: the tree walk, the compare, "gone" (the
 * lookup alone, as a waiting request's poll costs)
 */

static ngx_int_t
poll_stale(scale_t *s, scale_point_t *pt, uint32_t *pick, ngx_uint_t n)
{
    ngx_int_t                      rc;
    ngx_uint_t                     j;
    ngx_http_hermes_kernel_ref_t   ref;

    for (j = 0; j < n; j++) {
        set_ref(s, &ref, s->keys + pick[j] * s->key_len);

        rc = ngx_http_hermes_registry_poll(&pt->zone, &ref, &s->root);

        if (rc != NGX_HTTP_HERMES_ACQ_GONE) {
            print_error("poll of entry %lu: rc %ld\n",
                        (unsigned long) pick[j], (long) rc);
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* the whole-registry walks: informational, they are linear by design */

static ngx_int_t
time_walks(scale_t *s, scale_point_t *pt)
{
    double                      t;
    ngx_str_t                   owner, session;
    ngx_pool_t                 *pool;
    ngx_array_t                 list;
    ngx_http_hermes_stats_t     st;
    ngx_http_hermes_victims_t   victims;

    t = now_ns();
    ngx_http_hermes_registry_stats(&pt->zone, &st, NULL, NULL);
    pt->ns_stats = now_ns() - t;

    pool = ngx_create_pool(16384, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    if (ngx_array_init(&list, pool, 16, sizeof(ngx_http_hermes_listing_t))
        != NGX_OK)
    {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    owner.data = s->keys;                               /* owner of key 0 */
    owner.len = s->owner_len;

    t = now_ns();
    if (ngx_http_hermes_registry_list(&pt->zone, &owner, &list) != NGX_OK) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }
    pt->ns_list = now_ns() - t;

    ngx_destroy_pool(pool);

    if (list.nelts == 0) {
        print_error("list found none of the owner's kernels\n");
        return NGX_ERROR;
    }

    /* shutting down a session that has no kernel */

    session.data = (u_char *) "no-such-session-xx";
    session.len = sizeof("no-such-session-xx") - 1;
    victims.n = 0;

    t = now_ns();
    if (ngx_http_hermes_registry_shutdown(&pt->zone, &owner, &session, 0,
                                          &victims)
        != NGX_DECLINED)
    {
        return NGX_ERROR;
    }
    pt->ns_shutdown = now_ns() - t;

    victims.n = 0;

    t = now_ns();
    ngx_http_hermes_registry_sweep(&pt->zone, &victims, 1);
    pt->ns_sweep_full = now_ns() - t;

    return (victims.n == 0) ? NGX_OK : NGX_ERROR;
}


/*
 * A zone per size, filled through the public calls; its slab pages
 * counted before and after.
 */

static void
test_scale_fill(void **state)
{
    scale_t  *s = *state;

    size_t                      zone_size, slot, used0;
    ngx_int_t                   rc;
    ngx_uint_t                  i, si, pfree0;
    scale_point_t              *pt;
    ngx_http_hermes_stats_t     st;
    ngx_http_hermes_victims_t   victims;

    slot = slab_slot(entry_request(s));

    printf("# keys: owner %zu, session %zu bytes, root \"%.*s\"\n",
           s->owner_len, s->session_len, (int) s->root.len, s->root.data);

    for (si = 0; si < s->nsizes; si++) {
        pt = &s->points[si];
        pt->entries = s->sizes[si];

        /* room for the entries, the slab's page array, and some */

        zone_size = ngx_align(pt->entries * (slot + slot / 64) + (2 << 20),
                              ngx_pagesize);

        assert_int_equal(make_zone(&pt->shm_zone, &pt->zone, "hermes_scale",
                                   zone_size, 10 * pt->entries),
                         NGX_OK);

        pfree0 = pt->zone.shpool->pfree;
        ngx_http_hermes_registry_stats(&pt->zone, &st, NULL, NULL);
        used0 = st.zone_bytes_used;

        for (i = 0; i < pt->entries; i++) {
            rc = insert_key(&pt->zone, s, s->keys + i * s->key_len,
                            fake_pid(i), &victims);

            if (rc != NGX_HTTP_HERMES_ACQ_SPAWN || victims.n != 0) {
                fail_msg("insert of entry %lu: rc %ld, victims %lu",
                         (unsigned long) i, (long) rc,
                         (unsigned long) victims.n);
            }
        }

        ngx_http_hermes_registry_stats(&pt->zone, &st, NULL, NULL);

        if (st.kernels != pt->entries) {
            fail_msg("%lu entries inserted, registry counts %lu",
                     (unsigned long) pt->entries, (unsigned long) st.kernels);
        }

        pt->bytes_per_entry = (double) (pfree0 - pt->zone.shpool->pfree)
                              * ngx_pagesize / pt->entries;
        pt->bytes_used_stats = (double) (st.zone_bytes_used - used0)
                               / pt->entries;

        printf("# entries=%lu bytes_per_entry=%.1f (registry_stats: %.1f) "
               "zone=%zuKB\n",
               (unsigned long) pt->entries, pt->bytes_per_entry,
               pt->bytes_used_stats, zone_size >> 10);
    }

    assert_int_equal(ngx_unit_log_errors, 0);
}


/*
 * Rounds go over the sizes in turn, so that a noisy neighbour slows all
 * sizes alike; a size's best round counts.  An untimed pass first warms
 * the caches for the zone, as a steady load would.
 */

static void
test_scale_lookups(void **state)
{
    scale_t  *s = *state;

    double          t, ns;
    uint32_t       *pick;
    ngx_uint_t      r, si, warm;
    scale_point_t  *pt;

    if (s->points[s->nsizes - 1].zone.sh == NULL) {
        fail_msg("the registries were not filled");
    }

    pick = malloc(s->lookups * sizeof(uint32_t));
    assert_non_null(pick);

    for (si = 0; si < s->nsizes; si++) {
        s->points[si].ns_acquire = 1e30;
        s->points[si].ns_poll = 1e30;
    }

    for (r = 0; r < s->rounds; r++) {
        for (si = 0; si < s->nsizes; si++) {
            pt = &s->points[si];

            warm = ngx_min(s->lookups, pt->entries);
            draw_picks(pick, warm, pt->entries, 3 * (r * SCALE_MAX_SIZES + si));

            if (acquire_release(s, pt, pick, warm) != NGX_OK) {
                goto failed;
            }

            draw_picks(pick, s->lookups, pt->entries,
                       3 * (r * SCALE_MAX_SIZES + si) + 1);

            t = now_ns();
            if (acquire_release(s, pt, pick, s->lookups) != NGX_OK) {
                goto failed;
            }
            ns = (now_ns() - t) / s->lookups;
            pt->ns_acquire = ngx_min(pt->ns_acquire, ns);

            draw_picks(pick, s->lookups, pt->entries,
                       3 * (r * SCALE_MAX_SIZES + si) + 2);

            t = now_ns();
            if (poll_stale(s, pt, pick, s->lookups) != NGX_OK) {
                goto failed;
            }
            ns = (now_ns() - t) / s->lookups;
            pt->ns_poll = ngx_min(pt->ns_poll, ns);
        }
    }

    free(pick);

    for (si = 0; si < s->nsizes; si++) {
        pt = &s->points[si];

        printf("# entries=%lu ns_per_lookup=%.1f ns_per_poll=%.1f "
               "bytes_per_entry=%.1f\n",
               (unsigned long) pt->entries, pt->ns_acquire, pt->ns_poll,
               pt->bytes_per_entry);
    }

    /* now that use has shuffled the LRU list as it would be in service */

    for (si = 0; si < s->nsizes; si++) {
        pt = &s->points[si];

        if (time_walks(s, pt) != NGX_OK) {
            fail_msg("stats/list/shutdown/sweep at %lu entries went wrong",
                     (unsigned long) pt->entries);
        }

        printf("#   entries=%lu: whole-registry walks under the zone lock "
               "(not asserted): stats %.0f us, list %.0f us, "
               "shutdown %.0f us, full sweep %.0f us\n",
               (unsigned long) pt->entries,
               pt->ns_stats / 1000, pt->ns_list / 1000,
               pt->ns_shutdown / 1000, pt->ns_sweep_full / 1000);
    }

    s->measured = s->nsizes;

    assert_int_equal(ngx_unit_log_errors, 0);

    return;

failed:

    free(pick);
    fail_msg("lookups went wrong");
}


static void
test_lookup_cost_flat(void **state)
{
    scale_t  *s = *state;

    double          ratio, poll_ratio;
    scale_point_t  *first, *last;

    if (s->measured != s->nsizes || s->nsizes < 2) {
        fail_msg("nothing to compare: %lu of %lu sizes measured",
                 (unsigned long) s->measured, (unsigned long) s->nsizes);
    }

    first = &s->points[0];
    last = &s->points[s->nsizes - 1];

    ratio = last->ns_acquire / first->ns_acquire;
    poll_ratio = last->ns_poll / first->ns_poll;

    printf("# lookup cost ratio %lu/%lu entries: acquire+release %.2fx, "
           "poll %.2fx (limit %.2fx on acquire+release; linear would be "
           "%.0fx)\n",
           (unsigned long) last->entries, (unsigned long) first->entries,
           ratio, poll_ratio, s->max_ratio,
           (double) last->entries / first->entries);

    if (ratio >= s->max_ratio) {
        fail_msg("lookup cost at %lu entries is %.2fx that at %lu "
                 "(%.1f vs %.1f ns): not flat (limit %.2fx)",
                 (unsigned long) last->entries, ratio,
                 (unsigned long) first->entries, last->ns_acquire,
                 first->ns_acquire, s->max_ratio);
    }
}


static void
test_zone_bytes_per_entry(void **state)
{
    scale_t  *s = *state;

    ngx_uint_t      i;
    scale_point_t  *pt;

    if (s->measured != s->nsizes) {
        fail_msg("nothing measured");
    }

    for (i = 0; i < s->nsizes; i++) {
        pt = &s->points[i];

        if (pt->bytes_per_entry > s->max_bytes) {
            fail_msg("%.1f zone bytes per entry at %lu entries "
                     "(limit %.0f; slab request %zu, slot %zu)",
                     pt->bytes_per_entry, (unsigned long) pt->entries,
                     s->max_bytes, entry_request(s),
                     slab_slot(entry_request(s)));
        }
    }
}


/*
 * A new session at the kernel cap behind many tombstones (entries whose
 * kernel died or was killed: RELEASE_LOST).  Tombstones have a queue of
 * their own, so the cap's eviction finds the oldest idle kernel at once
 * (it walked past every tombstone, under the zone lock, before: 782x).
 * Informational: printed, not asserted.
 */

static double
time_new_sessions_at_cap(scale_t *s, ngx_uint_t tombstones, ngx_uint_t *ok)
{
    u_char                        *key;
    double                         t = 0;
    ngx_int_t                      rc;
    ngx_uint_t                     i, n, evicted;
    ngx_shm_zone_t                 shm_zone;
    ngx_http_hermes_zone_t         zone;
    ngx_http_hermes_victims_t      victims;
    ngx_http_hermes_kernel_ref_t   ref;

    *ok = 0;

    if (make_zone(&shm_zone, &zone, "cap",
                  ngx_align((tombstones + 1000) * 520 + (2 << 20),
                            ngx_pagesize),
                  64)
        != NGX_OK)
    {
        return 0;
    }

    key = malloc(s->key_len);
    if (key == NULL) {
        ngx_unit_shm_free(&shm_zone);
        return 0;
    }

    for (i = 0; i < tombstones; i++) {
        make_key(s, key, i, 0x70b000000ULL + i);
        set_ref(s, &ref, key);
        victims.n = 0;

        if (ngx_http_hermes_registry_acquire(&zone, &ref, &s->root, 8,
                                             &victims)
            != NGX_HTTP_HERMES_ACQ_SPAWN)
        {
            goto done;
        }

        (void) spawned(&zone, &ref, fake_pid(i));
        ngx_http_hermes_registry_release(&zone, &ref,
                                         NGX_HTTP_HERMES_RELEASE_LOST, 0);
    }

    for (i = 0; i < 64; i++) {
        make_key(s, key, i, 0x1d1e000000ULL + i);
        if (insert_key(&zone, s, key, fake_pid(i), &victims)
            != NGX_HTTP_HERMES_ACQ_SPAWN)
        {
            goto done;
        }
    }

    n = 200;
    evicted = 0;

    t = now_ns();

    for (i = 0; i < n; i++) {
        make_key(s, key, i, 0x7e3000000ULL + i);
        rc = insert_key(&zone, s, key, fake_pid(i), &victims);

        if (rc != NGX_HTTP_HERMES_ACQ_SPAWN) {
            goto done;
        }

        evicted += victims.n;
    }

    t = (now_ns() - t) / n;

    *ok = (evicted == n && zone.sh->kernels == 64);

done:

    free(key);
    ngx_unit_shm_free(&shm_zone);

    return t;
}


static void
test_cap_behind_tombstones(void **state)
{
    scale_t  *s = *state;

    double      none, many;
    ngx_uint_t  ok, tombstones;

    tombstones = s->sizes[s->nsizes - 1];

    none = time_new_sessions_at_cap(s, 0, &ok);
    assert_true(ok);

    many = time_new_sessions_at_cap(s, tombstones, &ok);
    assert_true(ok);

    printf("# new session at max_kernels=64 (spawn + evict the LRU kernel), "
           "not asserted: %.1f us; behind %lu tombstones: %.1f us (%.0fx)\n",
           none / 1000, (unsigned long) tombstones, many / 1000, many / none);
}


/*
 * What a zone of a given size holds: filled until the first insert has to
 * evict (the registry makes room by evicting the least recently used idle
 * kernel rather than failing).  Counts the slab's page descriptors and the
 * zone's fixed overhead too; informational.
 */

static void
test_zone_capacity(void **state)
{
    scale_t  *s = *state;

    u_char                      *key;
    size_t                       size;
    ngx_int_t                    rc;
    ngx_uint_t                   i;
    ngx_shm_zone_t               shm_zone;
    ngx_http_hermes_zone_t       zone;
    ngx_http_hermes_victims_t    victims;

    size = 4 << 20;

    assert_int_equal(make_zone(&shm_zone, &zone, "capacity", size, 1 << 30),
                     NGX_OK);

    key = malloc(s->key_len);
    assert_non_null(key);

    for (i = 0; /* void */; i++) {
        make_key(s, key, i, 0xcafe000000ULL + i);

        rc = insert_key(&zone, s, key, fake_pid(i), &victims);

        if (rc != NGX_HTTP_HERMES_ACQ_SPAWN) {
            free(key);
            fail_msg("insert %lu into a full zone: rc %ld (expected an "
                     "eviction)", (unsigned long) i, (long) rc);
        }

        if (victims.n) {
            break;
        }
    }

    free(key);

    assert_int_equal(victims.n, 1);
    assert_int_equal(victims.v[0].pid, fake_pid(0));   /* the LRU one */
    assert_int_equal(zone.sh->counters.evicted_cap_total, 1);

    printf("# capacity: a %zu KB zone holds %lu entries: %.1f zone bytes "
           "per entry, all overhead included\n",
           size >> 10, (unsigned long) i, (double) size / i);

    ngx_unit_shm_free(&shm_zone);

    assert_int_equal(ngx_unit_log_errors, 0);
}


int
main(void)
{
    char        *only, *name;
    size_t       i, n;
    struct CMUnitTest  run[16];

    static const struct CMUnitTest  tests[] = {
        cmocka_unit_test(test_entry_layout),
        cmocka_unit_test(test_init_zone_reuse),
        cmocka_unit_test(test_crc32_collision),
        cmocka_unit_test(test_scale_fill),
        cmocka_unit_test(test_scale_lookups),
        cmocka_unit_test(test_lookup_cost_flat),
        cmocka_unit_test(test_zone_bytes_per_entry),
        cmocka_unit_test(test_zone_capacity),
        cmocka_unit_test(test_cap_behind_tombstones),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);

    /* HERMES_SCALE_TESTS: a comma-separated list of the tests to run */

    only = getenv("HERMES_SCALE_TESTS");
    n = 0;

    for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        if (only && *only) {
            name = strstr(only, tests[i].name);

            if (name == NULL
                || (name != only && name[-1] != ',')
                || (name[strlen(tests[i].name)] != ','
                    && name[strlen(tests[i].name)] != '\0'))
            {
                continue;
            }
        }

        run[n++] = tests[i];
    }

    if (n == 0) {
        fprintf(stderr, "registry_scale: no test named in HERMES_SCALE_TESTS\n");
        return 1;
    }

    return _cmocka_run_group_tests("registry_scale", run, n, setup, teardown);
}
