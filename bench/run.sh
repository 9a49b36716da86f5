#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# `make bench`: ngx_hermes (local and ssh backends) side by side with
# jupyter-server, in one run, on loopback.
#
# Starts, each in its own temporary prefix and process group, on 127.0.0.1:
#   - an OpenSSH sshd (a host key, a client key and known_hosts made for
#     the run) on which two bench users log in: hermes-bench, whose login
#     shell reads no rc (an empty HOME), and hermes-bench-rc, whose
#     ~/.bashrc sleeps 1 s (bash reads it for `ssh host cmd`), standing in
#     for the pyenv/conda init of real hosts.  The users are made once
#     (useradd --system, shell bash, no password, HOME set by the sshd);
#   - a hermes nginx (2 workers, client_max_body_size 4m, hermes_max_stream
#     5m) with the locations /v1/execute (local backend, kernels root in
#     the prefix under /tmp), /v1/execute-ssh and /v1/execute-ssh-rc (ssh
#     backend through that sshd as each user), /v1/execute-warm (the local
#     backend with warm=N, when the module takes it: nginx -t says),
#     /v1/execute-ssh-warm (the ssh backend as the dedicated user, its own
#     kernels root, warm=N), /v1/execute-env-warm (kernels in a Debian
#     trixie rootfs, build/rootfs/trixie, an environment with warm=N: the
#     rootfs is made by t/lib/make-rootfs.sh if it is not there yet), with BENCH_TMPFS=1, /v1/execute-tmpfs (a
#     kernels root on /dev/shm), and /v1/status, whose version and commit
#     of the module go into the results;
#   - Debian's jupyter-server with TCP_NODELAY set on the kernel websocket
#     (set_nodelay(True) in ZMQChannelsHandler.open, from a
#     jupyter_server_config.py), the variant the targets compare with;
#   - unless BENCH_STOCK=0, a second jupyter-server without that patch
#     (stock Debian), for the trivial-cell round trip only.
# Then runs bench/bench.py against all of them, prints the tables, writes
# bench/results.json and, with python3-matplotlib, the plot
# docs/benchmarks-latency.png; on any exit it stops everything it started
# (nginx, sshd and its sessions, jupyter, both kinds of kernels).
#
# Environment:
#   BENCH_SSH=0            skip the ssh backend (and the sshd)
#   BENCH_WARM=N           warm=N on the /v1/execute-warm and
#                          /v1/execute-ssh-warm locations (default 4; 0
#                          skips them)
#   BENCH_ENV=0            skip the environment's warm pool column
#   BENCH_RECORD=1         record this run's figures in bench/baseline.json
#                          instead of comparing with them
#   BENCH_STOCK=0          skip the stock jupyter-server
#   BENCH_TMPFS=1          add the local location with its root on tmpfs
#   BENCH_JUPYTER_PAR=N    also run the parallel test on jupyter with N
#                          sessions (default 0: hermes only)
#   BENCH_TIMEOUT=SECONDS  hard limit on bench.py (default 480)
#   BENCH_REST=SECONDS     rest before each column after the sessions of
#                          the one before ended (default 10)
#   BENCH_PLOT=FILE        where the plot goes (default
#                          docs/benchmarks-latency.png; empty: none)
#   BENCH_KEEP=1           keep the temporary prefix (logs) after the run
#   BENCH_HOLD=SECONDS     wait that long once everything is up, before the
#                          first column (the URLs are on bench.py's command
#                          line, in ps): to probe the servers by hand
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
module=$top/build/ngx_http_hermes_module.so

# --- the peer's Debian packages ---------------------------------------------
pkgs="jupyter-server python3-jupyter-server python3-ipykernel python3-websocket"
missing=()
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' \
        || missing+=("$p")
done
if [ ${#missing[@]} != 0 ]; then
    echo "bench: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # install straight away if the lists know the packages, else update first
    apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi

if [ ! -f "$module" ]; then
    make -C "$top" module
fi

# --- temporary prefix and cleanup ---------------------------------------------
prefix=$(mktemp -d /tmp/hermes-bench.XXXXXXXX)
# 0711: a root worker's kernels run as another user, who passes through
chmod 711 "$prefix"
# A second kernels root on tmpfs: the file protocol (a few files created,
# renamed and deleted a cell) costs much more on a disk filesystem.
shm=""
if [ "${BENCH_TMPFS:-0}" = 1 ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    shm=$(mktemp -d /dev/shm/hermes-bench.XXXXXXXX)
    chmod 711 "$shm"
fi
pids=()           # group leaders we started (setsid): nginx, sshd, jupyter x2

# Kill, by pid, whatever still runs from our prefix: processes whose cwd is
# under it (hermes kernels run in PREFIX/.../hermes_rkernel_*), whose
# command line names it (jupyter's kernels get -f PREFIX/.../kernel-*.json)
# or whose environment does (everything our sshd started for a login has
# HOME=PREFIX/ssh/home-*), and the descendants of our sshd listener (the
# per-connection sshd processes, which leave its process group).
# shellcheck disable=SC2317  # run by cleanup, the EXIT trap's
kill_strays() {
    "$PY" - "${sshd_pid:-0}" "$prefix" ${shm:+"$shm"} <<'EOF' || true
import os, signal, sys
root = int(sys.argv[1])
prefixes = [p.rstrip("/") + "/" for p in sys.argv[2:]]
me = os.getpid()
kids, victims = {}, set()
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) in (me, os.getppid()):
        continue
    pid = int(d)
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(pid)
    except (OSError, ValueError, IndexError):
        pass
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd") + "/"
    except OSError:
        cwd = ""
    text = ""
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                text += f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            pass
    if any(cwd.startswith(p) or p in text for p in prefixes):
        victims.add(pid)
todo = [root] if root > 1 else []
while todo:
    for c in kids.get(todo.pop(), []):
        if c not in victims and c != me:
            victims.add(c)
            todo.append(c)
for pid in victims:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
EOF
}

# shellcheck disable=SC2317  # the EXIT trap's
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    set +e
    # the client first (timeout and bench.py, one process group)
    if [ -n "${bench_pid:-}" ]; then
        kill -TERM -- "-$bench_pid" 2>/dev/null
        sleep 0.2
        kill -KILL -- "-$bench_pid" 2>/dev/null
    fi
    # polite first: nginx QUIT, jupyter TERM (it shuts its kernels down)
    [ -n "${nginx_pid:-}" ] && kill -QUIT "$nginx_pid" 2>/dev/null
    for p in ${jup_pids[@]+"${jup_pids[@]}"}; do kill -TERM "$p" 2>/dev/null; done
    for _ in $(seq 50); do
        alive=0
        for p in ${pids[@]+"${pids[@]}"}; do
            [ "$p" = "${sshd_pid:-}" ] && continue
            kill -0 "$p" 2>/dev/null && alive=1
        done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    # then by force: the strays (kernels, sshd's sessions: found while the
    # listener still lives), then each group we started, then strays again
    kill_strays
    for p in ${pids[@]+"${pids[@]}"}; do kill -KILL -- "-$p" 2>/dev/null; done
    kill_strays
    sleep 0.2
    kill_strays
    [ -n "$shm" ] && rm -rf "$shm"
    if [ "${BENCH_KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
        echo "bench: logs kept in $prefix" >&2
    else
        rm -rf "$prefix"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_http() {   # URL [header]: wait up to 30 s for an answer < 500
    local url=$1 hdr=${2:-X-Bench: 1}
    for _ in $(seq 300); do
        code=$(curl -s -o /dev/null -w '%{http_code}' -H "$hdr" "$url" 2>/dev/null || true)
        case $code in 2??|3??|4??) return 0;; esac
        sleep 0.1
    done
    echo "bench: $url did not come up" >&2
    return 1
}

# --- sshd on 127.0.0.1, two bench users -------------------------------------
# The ssh backend logs in to this machine: one user whose login shell reads
# no rc, one whose ~/.bashrc sleeps 1 s.  Keys, known_hosts, homes and the
# kernels roots are made for the run in PREFIX/ssh; the users themselves
# are system users made once (they are what sshd needs to log in as).
ssh_users="hermes-bench hermes-bench-rc"
ssh_why=""
sshd_pid=""
if [ "${BENCH_SSH:-1}" != 1 ]; then
    ssh_why="skipped (BENCH_SSH=0)"
elif [ "$(id -u)" != 0 ]; then
    ssh_why="n/a: needs root (logs in as two bench users)"
elif [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/bin/ssh-keygen ]; then
    ssh_why="n/a: openssh-server/openssh-client not installed (make deps)"
fi

ensure_user() {   # a login user with bash, no password (not locked)
    local u=$1
    if ! id -u "$u" >/dev/null 2>&1; then
        echo "bench: creating the system user $u (ssh bench logins)"
        useradd --system --no-create-home --home-dir / --shell /bin/bash "$u" \
            2>/dev/null || id -u "$u" >/dev/null
    fi
    # sshd refuses a locked account ("!" in shadow) without PAM; "*" only
    # means no password
    case $(getent shadow "$u" | cut -d: -f2) in
        '!'*) usermod -p '*' "$u" ;;
    esac
}

start_sshd() {
    local d=$prefix/ssh
    mkdir -p "$d"
    chmod 711 "$d"
    for u in $ssh_users; do ensure_user "$u"; done
    ssh-keygen -q -t ed25519 -N '' -C hermes-bench-host -f "$d/host_ed25519" </dev/null \
        || return 1
    ssh-keygen -q -t ed25519 -N '' -C hermes-bench-client -f "$d/id_ed25519" </dev/null \
        || return 1
    cp "$d/id_ed25519.pub" "$d/authorized_keys"
    chmod 644 "$d/authorized_keys"
    sport=$(free_port)
    echo "[127.0.0.1]:$sport $(cut -d' ' -f1,2 "$d/host_ed25519.pub")" >"$d/known_hosts"
    # HOME (set by sshd) is where bash looks for ~/.bashrc; the kernels
    # roots are the users' own, 0700
    mkdir -p "$d/home-plain" "$d/home-rc" "$d/kroot-plain" "$d/kroot-rc" \
        "$d/kroot-warm"
    # each run of it also leaves a line in ~/.rc-runs: bench.py counts them
    # shellcheck disable=SC2016  # $HOME is the login's, expanded by its bash
    printf '%s\n' '# hermes bench: a slow shell rc (pyenv/conda init stands here)' \
        'echo . >>"$HOME/.rc-runs" 2>/dev/null' 'sleep 1' >"$d/home-rc/.bashrc"
    chown -R hermes-bench: "$d/home-plain" "$d/kroot-plain" "$d/kroot-warm"
    chown -R hermes-bench-rc: "$d/home-rc" "$d/kroot-rc"
    chmod 700 "$d/home-plain" "$d/home-rc" "$d/kroot-plain" "$d/kroot-rc" \
        "$d/kroot-warm"
    mkdir -p /run/sshd && chmod 755 /run/sshd
    local conf="ListenAddress 127.0.0.1
Port $sport
HostKey $d/host_ed25519
AuthorizedKeysFile $d/authorized_keys
PidFile $d/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
AllowUsers $ssh_users
AllowAgentForwarding no
AllowTcpForwarding no
X11Forwarding no
PermitUserEnvironment no
PrintMotd no
PrintLastLog no
UseDNS no
LogLevel INFO
MaxStartups 100
MaxSessions 100
LoginGraceTime 30"
    local match="Match User hermes-bench
    SetEnv HOME=$d/home-plain
Match User hermes-bench-rc
    SetEnv HOME=$d/home-rc"
    # OpenSSH >= 9.8 penalizes sources that fail: off, where it exists
    printf '%s\nPerSourcePenalties no\n%s\n' "$conf" "$match" >"$d/sshd_config"
    if ! /usr/sbin/sshd -t -f "$d/sshd_config" 2>/dev/null; then
        printf '%s\n%s\n' "$conf" "$match" >"$d/sshd_config"
        /usr/sbin/sshd -t -f "$d/sshd_config" || return 1
    fi
    setsid /usr/sbin/sshd -D -e -f "$d/sshd_config" </dev/null \
        >>"$d/sshd.log" 2>&1 &
    sshd_pid=$!
    disown "$sshd_pid"      # no "Killed" line from bash when it is stopped
    pids+=("$sshd_pid")
    # up when both users get a shell (the rc user's takes 1 s)
    local u ok
    for u in $ssh_users; do
        ok=""
        for _ in $(seq 50); do
            if [ "$(ssh -F /dev/null -i "$d/id_ed25519" -o IdentitiesOnly=yes \
                    -o UserKnownHostsFile="$d/known_hosts" \
                    -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes \
                    -o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR \
                    -p "$sport" "$u@127.0.0.1" 'id -un' </dev/null 2>/dev/null)" = "$u" ]
            then
                ok=1
                break
            fi
            sleep 0.2
        done
        if [ -z "$ok" ]; then
            echo "bench: cannot log in as $u to the bench sshd; sshd.log:" >&2
            tail -5 "$d/sshd.log" >&2
            return 1
        fi
    done
}

if [ -z "$ssh_why" ] && ! start_sshd; then
    ssh_why="n/a: the bench sshd did not work (see above)"
fi
[ -n "$ssh_why" ] && echo "bench: ssh backend $ssh_why" >&2

# --- hermes nginx ---------------------------------------------------------------
hport=$(free_port)
tport=$(free_port)
mkdir -p "$prefix/nginx/logs" "$prefix/nginx/tmp" "$prefix/kernels"
# Load a private copy: `make module` rewrites build/*.so in place (cp keeps
# the inode), and a running master that has the file mapped then forks
# workers that crash at once (signal 11) in a loop.
cp "$module" "$prefix/nginx/ngx_http_hermes_module.so"
chmod 711 "$prefix/kernels"
user=""
[ "$(id -u)" = 0 ] && user="user root;"
shm_location=""
if [ -n "$shm" ]; then
    mkdir -p "$shm/kernels"
    chmod 711 "$shm/kernels"
    shm_location="
        location = /v1/execute-tmpfs {
            hermes_backend local root=$shm/kernels;
            hermes_execute;
            hermes_cell_timeout 60s;
            hermes_max_stream 5m;
        }"
fi
ssh_locations=""
if [ -z "$ssh_why" ]; then
    sd=$prefix/ssh
    for v in plain rc; do
        u=hermes-bench
        [ $v = rc ] && u=hermes-bench-rc
        loc=/v1/execute-ssh
        [ $v = rc ] && loc=/v1/execute-ssh-rc
        ssh_locations="$ssh_locations
        location = $loc {
            hermes_backend ssh host=127.0.0.1:$sport user=$u
                identity=$sd/id_ed25519 known_hosts=$sd/known_hosts
                root=$sd/kroot-$v;
            hermes_execute;
            hermes_cell_timeout 60s;
            hermes_max_stream 5m;
            hermes_tools echo;
            hermes_tools_pass /tools;
            hermes_max_tool_calls 1000;
        }"
    done
fi
# The warm pool (hermes_backend ... warm=N) on a location of its own, where
# the module takes it: nginx -t on the whole configuration says.
warm=${BENCH_WARM:-4}
warm_location=""
warm_why=""
if [ "$warm" = 0 ]; then
    warm_why="skipped (BENCH_WARM=0)"
else
    mkdir -p "$prefix/kernels-warm"
    chmod 711 "$prefix/kernels-warm"
    warm_location="
        location = /v1/execute-warm {
            hermes_backend local root=$prefix/kernels-warm warm=$warm;
            hermes_execute;
            hermes_cell_timeout 60s;
            hermes_max_stream 5m;
        }"
fi
# The same on the ssh backend, as the dedicated user: a kernels root of its
# own, so that its backend (user, root, hosts) is not /v1/execute-ssh's
# and the ssh dedicated column's new sessions still spawn.
ssh_warm_location=""
ssh_warm_why=""
if [ -n "$ssh_why" ]; then
    ssh_warm_why=$ssh_why
elif [ "$warm" = 0 ]; then
    ssh_warm_why=$warm_why
else
    ssh_warm_location="
        location = /v1/execute-ssh-warm {
            hermes_backend ssh host=127.0.0.1:$sport user=hermes-bench
                identity=$sd/id_ed25519 known_hosts=$sd/known_hosts
                root=$sd/kroot-warm warm=$warm;
            hermes_execute;
            hermes_cell_timeout 60s;
            hermes_max_stream 5m;
        }"
fi
# An environment's warm pool (a trixie rootfs, python 3.13): a location of
# its own, its own kernels root, no warm pool but the environment's.
env_http=""
env_location=""
env_why=""
if [ "$warm" = 0 ]; then
    env_why=$warm_why
elif [ "${BENCH_ENV:-1}" = 0 ]; then
    env_why="skipped (BENCH_ENV=0)"
elif ! env_out=$("$top/t/lib/make-rootfs.sh" trixie "$top/build/rootfs/trixie" 2>&1); then
    env_why="n/a: no trixie rootfs ($(printf '%s' "$env_out" | tail -1))"
else
    mkdir -p "$prefix/kernels-env"
    chmod 711 "$prefix/kernels-env"
    env_http="hermes_environment trixie rootfs=$top/build/rootfs/trixie warm=$warm;"
    env_location="
        location = /v1/execute-env-warm {
            hermes_backend local root=$prefix/kernels-env;
            hermes_environments trixie;
            hermes_execute;
            hermes_cell_timeout 60s;
            hermes_max_stream 5m;
        }"
fi
write_conf() {   # WARM_LOCATIONS
cat > "$prefix/nginx/nginx.conf" <<EOF
load_module $prefix/nginx/ngx_http_hermes_module.so;
$user
worker_processes 2;
pid $prefix/nginx/nginx.pid;
error_log $prefix/nginx/logs/error.log info;

events {
    worker_connections 1024;
}

http {
    access_log off;
    client_body_temp_path $prefix/nginx/tmp;

    hermes_zone bench:4m max_kernels=512 max_kernels_per_owner=512 idle_timeout=10m;
    hermes_backend local root=$prefix/kernels;
    $env_http

    server {
        listen 127.0.0.1:$hport;
        client_max_body_size 4m;
        keepalive_requests 100000;

        location = /v1/execute {
            hermes_execute;
            hermes_cell_timeout 60s;
            hermes_max_stream 5m;
            hermes_tools echo;
            hermes_tools_pass /tools;
            hermes_max_tool_calls 1000;
        }
$shm_location$ssh_locations$1

        # the floor a cell cannot beat: a keep-alive round trip to nginx
        location = /floor {
            return 200 "{}";
        }

        # the build measured: its version and commit go into the results
        location = /v1/status {
            hermes_status;
        }

        # tool calls: a subrequest through a real proxy hop, its
        # connections kept (docs/directives.md, hermes_tools_pass)
        location /tools {
            internal;
            proxy_pass http://bench_tools/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }

    upstream bench_tools {
        server 127.0.0.1:$tport;
        keepalive 16;
    }

    # the tool endpoint: a JSON answer, nothing else
    server {
        listen 127.0.0.1:$tport;
        location / {
            default_type application/json;
            return 200 '{"echo":true}';
        }
    }
}
EOF
}
# whether nginx -t takes the configuration written last; if not, its
# [emerg] line in $said
conf_taken() {
    local out
    out=$(/usr/sbin/nginx -t -q -p "$prefix/nginx" -c "$prefix/nginx/nginx.conf" \
              -e "$prefix/nginx/logs/warm-test.log" 2>&1) && return 0
    said=$(printf '%s' "$out" | grep -m1 emerg | sed 's/.*\[emerg\] //')
    return 1
}
if [ -n "$warm_location" ]; then
    write_conf "$warm_location"
    if ! conf_taken; then
        warm_why="n/a: module has no warm="
        echo "bench: warm pool $warm_why; nginx -t said: $said" >&2
        warm_location=""
    fi
fi
if [ -n "$ssh_warm_location" ] && [ -z "$warm_location" ]; then
    ssh_warm_why=$warm_why
    ssh_warm_location=""
elif [ -n "$ssh_warm_location" ]; then
    write_conf "$warm_location$ssh_warm_location"
    if ! conf_taken; then
        ssh_warm_why="n/a: module has no warm= on ssh backends"
        echo "bench: ssh warm pool $ssh_warm_why; nginx -t said: $said" >&2
        ssh_warm_location=""
    fi
fi
if [ -n "$env_location" ]; then
    write_conf "$warm_location$ssh_warm_location$env_location"
    if ! conf_taken; then
        env_why="n/a: module has no environments"
        echo "bench: environment warm pool $env_why; nginx -t said: $said" >&2
        env_location=""
        env_http=""
    fi
fi
write_conf "$warm_location$ssh_warm_location$env_location"
/usr/sbin/nginx -t -q -p "$prefix/nginx" -c "$prefix/nginx/nginx.conf" -e "$prefix/nginx/logs/error.log"
setsid /usr/sbin/nginx -p "$prefix/nginx" -c "$prefix/nginx/nginx.conf" \
    -e "$prefix/nginx/logs/error.log" -g 'daemon off;' </dev/null \
    >"$prefix/nginx/logs/stderr.log" 2>&1 &
nginx_pid=$!
pids+=("$nginx_pid")

# --- jupyter-server(s) ------------------------------------------------------------
# the token: random, handed over in the environment (JUPYTER_TOKEN), never argv
token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
export JUPYTER_TOKEN=$token
mkdir -p "$prefix/jupyter/config" "$prefix/jupyter/data" "$prefix/jupyter/root"
cat > "$prefix/jupyter/config/jupyter_server_config.py" <<'EOF'
# ngx_hermes bench: TCP_NODELAY on the kernel websocket when
# HERMES_BENCH_NODELAY=1 (stock jupyter-server leaves Nagle on: ~44-48 ms a
# trivial cell).
import os
c = get_config()  # noqa: F821
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.open_browser = False
c.ServerApp.port_retries = 0
c.ServerApp.allow_root = True
if os.environ.get("HERMES_BENCH_NODELAY") == "1":
    from jupyter_server.services.kernels.handlers import ZMQChannelsHandler
    _open = ZMQChannelsHandler.open

    def open(self, *args, **kwargs):
        self.set_nodelay(True)
        return _open(self, *args, **kwargs)

    ZMQChannelsHandler.open = open
EOF

jup_pids=()
declare -A jport=()
start_jupyter() {   # NAME NODELAY -> sets jport[NAME]
    local name=$1 nodelay=$2 port
    port=$(free_port)
    mkdir -p "$prefix/jupyter/$name/runtime"
    (
        cd "$prefix/jupyter/root"
        export JUPYTER_CONFIG_DIR=$prefix/jupyter/config
        export JUPYTER_DATA_DIR=$prefix/jupyter/data
        export JUPYTER_RUNTIME_DIR=$prefix/jupyter/$name/runtime
        export IPYTHONDIR=$prefix/jupyter/$name/ipython
        export HERMES_BENCH_NODELAY=$nodelay
        exec setsid "$PY" -m jupyter_server --port="$port" \
            --ServerApp.root_dir="$prefix/jupyter/root" </dev/null \
            >"$prefix/jupyter/$name/server.log" 2>&1
    ) &
    pids+=("$!")
    jup_pids+=("$!")
    jport[$name]=$port
}

start_jupyter nodelay 1
[ "${BENCH_STOCK:-1}" = 1 ] && start_jupyter stock 0

wait_http "http://127.0.0.1:$hport/v1/execute"
wait_http "http://127.0.0.1:${jport[nodelay]}/api/status" "Authorization: token $token"
stock_arg=()
if [ "${BENCH_STOCK:-1}" = 1 ]; then
    wait_http "http://127.0.0.1:${jport[stock]}/api/status" "Authorization: token $token"
    stock_arg=(--jupyter-stock "http://127.0.0.1:${jport[stock]}")
fi

# --- the benchmark ----------------------------------------------------------------
# In the background and waited for, so that a signal to this script runs
# the cleanup at once (bash defers traps while a foreground child runs);
# timeout leads its own process group, which the cleanup also kills.
extra=()
if [ -n "$ssh_why" ]; then
    extra+=(--ssh-why "$ssh_why")
else
    extra+=(--hermes-ssh "http://127.0.0.1:$hport/v1/execute-ssh"
            --hermes-ssh-rc "http://127.0.0.1:$hport/v1/execute-ssh-rc"
            --ssh-rc-runs "$prefix/ssh/home-rc/.rc-runs")
fi
if [ -n "$warm_location" ]; then
    extra+=(--hermes-warm "http://127.0.0.1:$hport/v1/execute-warm" --warm "$warm")
else
    extra+=(--warm-why "$warm_why")
fi
if [ -n "$ssh_warm_location" ]; then
    extra+=(--hermes-ssh-warm "http://127.0.0.1:$hport/v1/execute-ssh-warm")
else
    extra+=(--ssh-warm-why "$ssh_warm_why")
fi
if [ -n "$env_location" ]; then
    extra+=(--hermes-env-warm "http://127.0.0.1:$hport/v1/execute-env-warm")
else
    extra+=(--env-warm-why "$env_why")
fi
rm -f "$top/bench/results.json"     # no plot from an earlier run's figures
set +e
timeout --kill-after=10 "${BENCH_TIMEOUT:-480}" "$PY" "$top/bench/bench.py" \
    --hermes "http://127.0.0.1:$hport/v1/execute" \
    --floor "http://127.0.0.1:$hport/floor" \
    ${shm:+--hermes-tmpfs "http://127.0.0.1:$hport/v1/execute-tmpfs"} \
    --jupyter "http://127.0.0.1:${jport[nodelay]}" \
    ${stock_arg[@]+"${stock_arg[@]}"} \
    "${extra[@]}" \
    --jupyter-par "${BENCH_JUPYTER_PAR:-0}" \
    --hermes-status "http://127.0.0.1:$hport/v1/status" \
    --hermes-log "$prefix/nginx/logs/error.log" --hermes-pid "$nginx_pid" \
    --out "$top/bench/results.json" &
bench_pid=$!
wait "$bench_pid"
rc=$?
bench_pid=""
set -e
if [ $rc != 0 ]; then
    echo "bench: bench.py failed ($rc); last lines of the hermes error log:" >&2
    tail -20 "$prefix/nginx/logs/error.log" >&2 || true
elif [ "${BENCH_RECORD:-0}" = 1 ]; then
    "$PY" "$top/bench/guard.py" --record "$top/bench/results.json" "$top/bench/baseline.json"
else
    # the regression guard: worse than recorded beyond the noise band fails
    "$PY" "$top/bench/guard.py" "$top/bench/results.json" "$top/bench/baseline.json" || rc=1
fi
# the plot, from results.json (python3-matplotlib, Debian's)
plot=${BENCH_PLOT-$top/docs/benchmarks-latency.png}
if [ -n "$plot" ] && [ -s "$top/bench/results.json" ]; then
    if "$PY" -c 'import matplotlib' 2>/dev/null; then
        timeout 60 "$PY" "$top/bench/plot.py" "$top/bench/results.json" "$plot" \
            || echo "bench: the plot failed" >&2
    else
        echo "bench: no plot (python3-matplotlib missing; make bench installs it)" >&2
    fi
fi
exit $rc
