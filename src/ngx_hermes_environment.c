
/*
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * ngx_hermes: environments.  "hermes_environment NAME rootfs=DIR
 * python=PATH ro=PATH rw=PATH env=NAME=VALUE" names an image in the http
 * block; "hermes_environments NAME ..." says which a location allows, the
 * first its default; a request picks one with "environment".  A kernel
 * keeps the environment it was spawned in (the registry holds its id).
 */


#include "ngx_hermes.h"


static ngx_int_t ngx_http_hermes_environment_path(ngx_conf_t *cf,
    ngx_str_t *value, size_t skip, ngx_str_t *path);
static ngx_int_t ngx_http_hermes_environment_setting(ngx_conf_t *cf,
    ngx_str_t *value);
static ngx_int_t ngx_http_hermes_environment_exists(ngx_conf_t *cf,
    ngx_http_hermes_environment_t *env);
static char *ngx_http_hermes_environment_venv(ngx_conf_t *cf,
    ngx_http_hermes_environment_t *env);


/* hermes_environment NAME [rootfs=DIR] [python=PATH] [ro=PATH] [rw=PATH]
   [env=NAME=VALUE] [warm=N] */

char *
ngx_http_hermes_environment(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_main_conf_t *hmcf = conf;

    u_char                          c;
    ngx_int_t                       n;
    ngx_str_t                      *value, *s;
    ngx_uint_t                      i;
    ngx_array_t                   **list;
    ngx_http_hermes_environment_t  *env, **envs;

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].len > NGX_HTTP_HERMES_ENV_NAME_MAX) {
        goto bad_name;
    }

    for (i = 0; i < value[1].len; i++) {
        c = value[1].data[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
        {
            goto bad_name;
        }
    }

    envs = hmcf->environments.elts;

    for (i = 0; i < hmcf->environments.nelts; i++) {
        if (envs[i]->name.len == value[1].len
            && ngx_strncmp(envs[i]->name.data, value[1].data, value[1].len)
               == 0)
        {
            return "is duplicate";
        }
    }

    /* each its own: locations keep pointers to it */

    env = ngx_pcalloc(cf->pool, sizeof(ngx_http_hermes_environment_t));
    envs = ngx_array_push(&hmcf->environments);

    if (env == NULL || envs == NULL) {
        return NGX_CONF_ERROR;
    }

    *envs = env;

    env->name = value[1];
    env->id = ngx_crc32_short(value[1].data, value[1].len);
    env->id = env->id ? env->id : 1;          /* 0: no environment */
    ngx_str_set(&env->python, "python3");

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "rootfs=", 7) == 0) {
            if (ngx_http_hermes_environment_path(cf, &value[i], 7,
                                                 &env->rootfs)
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }

            env->usr.len = env->rootfs.len + sizeof("/usr") - 1;
            env->usr.data = ngx_pnalloc(cf->pool, env->usr.len + 1);
            env->etc.len = env->rootfs.len + sizeof("/etc") - 1;
            env->etc.data = ngx_pnalloc(cf->pool, env->etc.len + 1);

            if (env->usr.data == NULL || env->etc.data == NULL) {
                return NGX_CONF_ERROR;
            }

            ngx_sprintf(env->usr.data, "%V/usr%Z", &env->rootfs);
            ngx_sprintf(env->etc.data, "%V/etc%Z", &env->rootfs);
            continue;
        }

        if (ngx_strncmp(value[i].data, "python=", 7) == 0) {
            env->python.data = value[i].data + 7;
            env->python.len = value[i].len - 7;

            if (env->python.len == 0
                || ngx_strlchr(env->python.data,
                               env->python.data + env->python.len, '\n'))
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid python \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "ro=", 3) == 0
            || ngx_strncmp(value[i].data, "rw=", 3) == 0)
        {
            list = (value[i].data[1] == 'o') ? &env->ro : &env->rw;

            if (*list == NULL) {
                *list = ngx_array_create(cf->pool, 2, sizeof(ngx_str_t));
                if (*list == NULL) {
                    return NGX_CONF_ERROR;
                }
            }

            s = ngx_array_push(*list);
            if (s == NULL) {
                return NGX_CONF_ERROR;
            }

            if (ngx_http_hermes_environment_path(cf, &value[i], 3, s)
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "warm=", 5) == 0) {
            n = ngx_atoi(value[i].data + 5, value[i].len - 5);

            if (n == NGX_ERROR || n > NGX_HTTP_HERMES_WARM_MAX) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid \"%V\": 0 to %d expected",
                                   &value[i], NGX_HTTP_HERMES_WARM_MAX);
                return NGX_CONF_ERROR;
            }

            env->warm = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "env=", 4) == 0) {
            if (ngx_http_hermes_environment_setting(cf, &value[i])
                != NGX_OK)
            {
                return NGX_CONF_ERROR;
            }

            if (env->env == NULL) {
                env->env = ngx_array_create(cf->pool, 2, sizeof(ngx_str_t));
                if (env->env == NULL) {
                    return NGX_CONF_ERROR;
                }
            }

            s = ngx_array_push(env->env);
            if (s == NULL) {
                return NGX_CONF_ERROR;
            }

            s->data = value[i].data + 4;
            s->len = value[i].len - 4;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hermes_environment parameter \"%V\"",
                           &value[i]);
        return NGX_CONF_ERROR;
    }

    return ngx_http_hermes_environment_venv(cf, env);

bad_name:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid environment name \"%V\": 1-64 of "
                       "[A-Za-z0-9._-] expected", &value[1]);
    return NGX_CONF_ERROR;
}


/* hermes_environments NAME ...: those defined above, the first the default */

char *
ngx_http_hermes_environments(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hermes_loc_conf_t *hlcf = conf;

    ngx_str_t                       *value;
    ngx_uint_t                       i, k;
    ngx_http_hermes_main_conf_t     *hmcf;
    ngx_http_hermes_environment_t  **env, **e;

    if (hlcf->environments != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    hmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_hermes_module);

    hlcf->environments = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                      sizeof(ngx_http_hermes_environment_t *));
    if (hlcf->environments == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;
    env = hmcf->environments.elts;

    for (i = 1; i < cf->args->nelts; i++) {

        for (k = 0; k < hmcf->environments.nelts; k++) {
            if (env[k]->name.len == value[i].len
                && ngx_strncmp(env[k]->name.data, value[i].data, value[i].len)
                   == 0)
            {
                break;
            }
        }

        if (k == hmcf->environments.nelts) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "unknown environment \"%V\": a "
                               "hermes_environment in the http block, above "
                               "this line, names it", &value[i]);
            return NGX_CONF_ERROR;
        }

        e = ngx_array_push(hlcf->environments);
        if (e == NULL) {
            return NGX_CONF_ERROR;
        }

        *e = env[k];
    }

    return NGX_CONF_OK;
}


/*
 * A location that runs cells: a rootfs needs bwrap to be bound as /; on
 * the local backend, what an environment names must be there now.
 */

char *
ngx_http_hermes_environment_check(ngx_conf_t *cf,
    ngx_http_hermes_loc_conf_t *hlcf)
{
    ngx_uint_t                       i;
    ngx_http_hermes_environment_t  **env;

    if (hlcf->environments == NULL) {
        return NGX_CONF_OK;
    }

    env = hlcf->environments->elts;

    for (i = 0; i < hlcf->environments->nelts; i++) {

        if ((env[i]->rootfs.len || env[i]->ro || env[i]->rw)
            && hlcf->sandbox->mode != NGX_HTTP_HERMES_SANDBOX_BWRAP)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "environment \"%V\" binds paths (rootfs=, "
                               "ro=, rw=): its locations need "
                               "\"hermes_sandbox bwrap\"", &env[i]->name);
            return NGX_CONF_ERROR;
        }

        if (hlcf->backend->ops == &ngx_http_hermes_backend_local_ops
            && ngx_http_hermes_environment_exists(cf, env[i]) != NGX_OK)
        {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/*
 * The environment a request names (name empty: the location's default,
 * the first of hermes_environments; *env NULL: none, the host's python).
 * NGX_DECLINED: one the location does not allow.
 */

ngx_int_t
ngx_http_hermes_environment_pick(ngx_http_hermes_loc_conf_t *hlcf,
    ngx_str_t *name, ngx_http_hermes_environment_t **env)
{
    ngx_uint_t                       i;
    ngx_http_hermes_environment_t  **e;

    *env = NULL;

    if (hlcf->environments == NULL) {
        return name->len ? NGX_DECLINED : NGX_OK;
    }

    e = hlcf->environments->elts;

    if (name->len == 0) {
        *env = e[0];
        return NGX_OK;
    }

    for (i = 0; i < hlcf->environments->nelts; i++) {
        if (e[i]->name.len == name->len
            && ngx_strncmp(e[i]->name.data, name->data, name->len) == 0)
        {
            *env = e[i];
            return NGX_OK;
        }
    }

    return NGX_DECLINED;
}


/*
 * A python of the host outside /usr (a venv's DIR/bin/python3) is in a
 * tree the sandbox does not show: DIR is bound read-only, as ro= would.
 */

static char *
ngx_http_hermes_environment_venv(ngx_conf_t *cf,
    ngx_http_hermes_environment_t *env)
{
    u_char  *p, *bin;

    if (env->rootfs.len || env->python.data[0] != '/'
        || ngx_strncmp(env->python.data, "/usr/", 5) == 0)
    {
        return NGX_CONF_OK;
    }

    bin = NULL;

    for (p = env->python.data + env->python.len - 1;
         p > env->python.data;
         p--)
    {
        if (*p != '/') {
            continue;
        }

        if (bin) {
            break;
        }

        bin = p;
    }

    if (bin == NULL || p == env->python.data) {
        /* /bin/python3, /python3: the host's own tree */
        return NGX_CONF_OK;
    }

    env->venv.len = p - env->python.data;
    env->venv.data = ngx_pnalloc(cf->pool, env->venv.len + 1);
    if (env->venv.data == NULL) {
        return NGX_CONF_ERROR;
    }

    *ngx_cpymem(env->venv.data, env->python.data, env->venv.len) = '\0';

    return NGX_CONF_OK;
}


/* PARAM=/absolute/path: NUL-ended in place, no trailing "/" */

static ngx_int_t
ngx_http_hermes_environment_path(ngx_conf_t *cf, ngx_str_t *value,
    size_t skip, ngx_str_t *path)
{
    path->data = value->data + skip;
    path->len = value->len - skip;

    while (path->len > 1 && path->data[path->len - 1] == '/') {
        path->len--;
    }

    path->data[path->len] = '\0';

    if (path->len < 2 || path->data[0] != '/'
        || ngx_strlchr(path->data, path->data + path->len, '\n'))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid \"%V\": an absolute path other than / "
                           "expected", value);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * env=NAME=VALUE: NAME a shell variable's name not of ours (HERMES_*),
 * VALUE one line without quotes: kernel.env carries it to the runner,
 * never argv, as the token
 */

static ngx_int_t
ngx_http_hermes_environment_setting(ngx_conf_t *cf, ngx_str_t *value)
{
    u_char  *p, *eq, *last;

    p = value->data + 4;
    last = value->data + value->len;
    eq = ngx_strlchr(p, last, '=');

    if (eq == NULL || eq == p
        || (*p >= '0' && *p <= '9')
        || ngx_strncmp(p, "HERMES_", 7) == 0)
    {
        goto invalid;
    }

    for ( /* void */ ; p < eq; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
              || (*p >= '0' && *p <= '9') || *p == '_'))
        {
            goto invalid;
        }
    }

    for (p = eq + 1; p < last; p++) {
        if (*p == '\n' || *p == '\r' || *p == '\'' || *p == '\0') {
            goto invalid;
        }
    }

    return NGX_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid \"%V\": env=NAME=VALUE expected, NAME of "
                       "[A-Za-z0-9_] not starting with a digit or HERMES_, "
                       "VALUE one line without quotes", value);
    return NGX_ERROR;
}


/* the rootfs and its python, or the host's python, there now */

static ngx_int_t
ngx_http_hermes_environment_exists(ngx_conf_t *cf,
    ngx_http_hermes_environment_t *env)
{
    u_char           *p;
    ngx_uint_t        i;
    ngx_file_info_t   fi;
    u_char            path[NGX_MAX_PATH];
    static char      *dirs[] = { "/usr/local/bin/", "/usr/bin/", "/bin/" };

    if (env->rootfs.len) {
        if (ngx_file_info(env->rootfs.data, &fi) == NGX_FILE_ERROR
            || !ngx_is_dir(&fi))
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                               "environment \"%V\": its rootfs \"%V\" is not "
                               "a directory here", &env->name, &env->rootfs);
            return NGX_ERROR;
        }
    }

    if (env->python.data[0] == '/') {
        p = ngx_snprintf(path, sizeof(path) - 1, "%V%V", &env->rootfs,
                         &env->python);
        *p = '\0';

        /* lstat: inside a rootfs a link may point at the rootfs' own / */

        if (ngx_link_info(path, &fi) == NGX_FILE_ERROR
            || (!env->rootfs.len && access((char *) path, X_OK) != 0))
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                               "environment \"%V\": its python \"%s\" is not "
                               "there", &env->name, path);
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    if (env->rootfs.len == 0) {
        /* a name: the kernel's PATH has it, or its start says so */
        return NGX_OK;
    }

    for (i = 0; i < sizeof(dirs) / sizeof(char *); i++) {
        p = ngx_snprintf(path, sizeof(path) - 1, "%V%s%V", &env->rootfs,
                         dirs[i], &env->python);
        *p = '\0';

        if (ngx_link_info(path, &fi) != NGX_FILE_ERROR) {
            return NGX_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "environment \"%V\": no \"%V\" in its rootfs \"%V\" "
                       "(/usr/local/bin, /usr/bin, /bin)", &env->name,
                       &env->python, &env->rootfs);
    return NGX_ERROR;
}
