#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# `make run`: a gateway on 127.0.0.1:PORT with the local backend, its
# prefix in ./run of the checkout, in the foreground.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
port=${1:-8088}
prefix=$top/run
mkdir -p "$prefix/logs" "$prefix/tmp"

# The kernels root: a root worker's kernels run as another user, who must
# pass through every directory above it.  A checkout under a private
# directory (a home, mktemp -d) is not passable: then under /tmp.
kernels=$prefix/kernels
d=$prefix
while [ "$d" != / ]; do
    if [ -z "$(find "$d" -maxdepth 0 -perm -o+x)" ]; then
        kernels=/tmp/hermes-run-kernels-$(printf %s "$top" | cksum | cut -d' ' -f1)
        break
    fi
    d=$(dirname "$d")
done
mkdir -p "$kernels"
# passable, not listable
chmod 711 "$kernels"

user=""
[ "$(id -u)" = 0 ] && user="user root;"

sed -e "s|@MODULE@|$top/build/ngx_http_hermes_module.so|g" \
    -e "s|@PREFIX@|$prefix|g" \
    -e "s|@KERNELS@|$kernels|g" \
    -e "s|@PORT@|$port|g" \
    -e "s|@USER@|$user|g" \
    "$top/conf/nginx.conf.in" > "$prefix/nginx.conf"

/usr/sbin/nginx -t -q -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/logs/error.log"

# nginx first; the message only once the port is nginx's (it writes its
# pid file after it bound it): a port in use is nginx's error, said plainly
rm -f "$prefix/nginx.pid"
/usr/sbin/nginx -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/logs/error.log" \
    -g 'daemon off;' &
pid=$!
trap 'kill -QUIT $pid 2>/dev/null; wait $pid 2>/dev/null; exit 0' INT TERM

i=0
until [ "$(cat "$prefix/nginx.pid" 2>/dev/null)" = "$pid" ] \
      && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
do
    if ! kill -0 $pid 2>/dev/null; then
        echo "make run: nginx did not start (is port $port in use? PORT=... make run picks another); see $prefix/logs/error.log" >&2
        tail -n 3 "$prefix/logs/error.log" >&2
        exit 1
    fi
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "make run: nginx does not answer on port $port" >&2; kill $pid; exit 1; }
    sleep 0.1
done

cat <<MSG
ngx_hermes is listening on http://127.0.0.1:$port (Ctrl-C stops it)
  config: $prefix/nginx.conf   log: $prefix/logs/error.log
  kernels: $kernels

Try:
  curl -sN http://127.0.0.1:$port/v1/execute -H 'Content-Type: application/json' \\
       -d '{"session":"demo","code":"import time\\nfor i in range(3):\\n    print(i); time.sleep(0.5)\\nx = 42"}'
  curl -s http://127.0.0.1:$port/v1/execute -H 'Content-Type: application/json' \\
       -H 'Accept: application/json' -d '{"session":"demo","code":"x + 1"}'
  curl -s http://127.0.0.1:$port/v1/kernels          # your kernels
  curl -s http://127.0.0.1:$port/v1/status           # figures (?format=prometheus|html)
  claude mcp add --transport http hermes http://127.0.0.1:$port/mcp   # an MCP host
Every endpoint with a curl: docs/protocol.md, "Try every endpoint"
MSG

wait $pid
