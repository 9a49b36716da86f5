#!/bin/bash
# `make bench`: ngx_hermes (local backend) side by side with jupyter-server,
# in one run, on loopback.
#
# Starts, each in its own temporary prefix and process group, on 127.0.0.1:
#   - a hermes nginx (2 workers, local backend, kernels dir 0700,
#     client_max_body_size 4m, hermes_max_stream 5m) with two locations:
#     /v1/execute with its kernels root in the prefix under /tmp (a disk
#     filesystem here), /v1/execute-tmpfs with its root under /dev/shm;
#   - Debian's jupyter-server with TCP_NODELAY set on the kernel websocket
#     (set_nodelay(True) in ZMQChannelsHandler.open, from a
#     jupyter_server_config.py), the variant SPEC section 6 compares with;
#   - unless BENCH_STOCK=0, a second jupyter-server without that patch
#     (stock Debian), for the trivial-cell round trip only.
# Then runs bench/bench.py against all of them, prints a table, writes
# bench/results.json, and stops everything it started (nginx, jupyter,
# both kinds of kernels) on any exit.
#
# Environment:
#   BENCH_STOCK=0          skip the stock jupyter-server
#   BENCH_TMPFS=0          skip the hermes location with its root on tmpfs
#   BENCH_JUPYTER_PAR=N    also run the parallel test on jupyter with N
#                          sessions (default 0: hermes only)
#   BENCH_TIMEOUT=SECONDS  hard limit on bench.py (default 420)
#   BENCH_KEEP=1           keep the temporary prefix (logs) after the run
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
module=$top/build/ngx_http_hermes_module.so

# --- the peer's Debian packages ---------------------------------------------
pkgs="jupyter-server python3-jupyter-server python3-ipykernel python3-websocket"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' \
        || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "bench: installing Debian packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    # install straight away if the lists know the packages, else update first
    apt-get install -y -qq $missing >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq $missing >/dev/null; }
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
if [ "${BENCH_TMPFS:-1}" = 1 ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    shm=$(mktemp -d /dev/shm/hermes-bench.XXXXXXXX)
    chmod 711 "$shm"
fi
pids=()           # group leaders we started (setsid): nginx, jupyter x2

# Kill, by pid, whatever still runs from our prefix: processes whose cwd is
# under it (hermes kernels run in PREFIX/kernels/hermes_rkernel_*) or whose
# command line names it (jupyter's kernels get -f PREFIX/.../kernel-*.json).
kill_strays() {
    "$PY" - "$prefix" $shm <<'EOF' || true
import os, signal, sys
prefixes = [p.rstrip("/") + "/" for p in sys.argv[1:]]
me = os.getpid()
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) in (me, os.getppid()):
        continue
    pid = int(d)
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd") + "/"
    except OSError:
        cwd = ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmd = ""
    if any(cwd.startswith(p) or p in cmd for p in prefixes):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
EOF
}

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
        for p in ${pids[@]+"${pids[@]}"}; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    # then by force: each group we started, then the strays (kernels)
    for p in ${pids[@]+"${pids[@]}"}; do kill -KILL -- "-$p" 2>/dev/null; done
    kill_strays
    sleep 0.2
    kill_strays
    [ -n "$shm" ] && rm -rf "$shm"
    if [ "${BENCH_KEEP:-0}" = 1 ] || [ $rc != 0 ]; then
        echo "bench: logs kept in $prefix" >&2
    else
        rm -rf "$prefix"
    fi
    exit $rc
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

    hermes_zone bench:4m max_kernels=128 max_kernels_per_owner=128 idle_timeout=10m;
    hermes_backend local root=$prefix/kernels;

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
$shm_location

        # tool calls: a subrequest through a real proxy hop
        location /tools {
            internal;
            proxy_pass http://127.0.0.1:$tport/;
        }
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
# ngx_hermes bench: TCP_NODELAY on the kernel websocket, as NGINX_NOTES.md
# describes (stock jupyter-server leaves Nagle on: ~44 ms a trivial cell).
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
start_jupyter() {   # NAME NODELAY -> sets jport_NAME
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
    eval "jport_$name=$port"
}

start_jupyter nodelay 1
[ "${BENCH_STOCK:-1}" = 1 ] && start_jupyter stock 0

wait_http "http://127.0.0.1:$hport/v1/execute"
wait_http "http://127.0.0.1:$jport_nodelay/api/status" "Authorization: token $token"
stock_arg=()
if [ "${BENCH_STOCK:-1}" = 1 ]; then
    wait_http "http://127.0.0.1:$jport_stock/api/status" "Authorization: token $token"
    stock_arg=(--jupyter-stock "http://127.0.0.1:$jport_stock")
fi

# --- the benchmark ----------------------------------------------------------------
# In the background and waited for, so that a signal to this script runs
# the cleanup at once (bash defers traps while a foreground child runs);
# timeout leads its own process group, which the cleanup also kills.
set +e
timeout --kill-after=10 "${BENCH_TIMEOUT:-420}" "$PY" "$top/bench/bench.py" \
    --hermes "http://127.0.0.1:$hport/v1/execute" \
    ${shm:+--hermes-tmpfs "http://127.0.0.1:$hport/v1/execute-tmpfs"} \
    --jupyter "http://127.0.0.1:$jport_nodelay" \
    ${stock_arg[@]+"${stock_arg[@]}"} \
    --jupyter-par "${BENCH_JUPYTER_PAR:-0}" \
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
fi
exit $rc
