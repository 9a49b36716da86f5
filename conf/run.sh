#!/bin/sh
# `make run`: a gateway on 127.0.0.1:PORT with the local backend, its
# prefix in ./run of the checkout, in the foreground.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
port=${1:-8088}
prefix=$top/run
mkdir -p "$prefix/logs" "$prefix/kernels" "$prefix/tmp"
# passable, not listable: a root worker's kernels run as another user
chmod 711 "$prefix/kernels"

user=""
[ "$(id -u)" = 0 ] && user="user root;"

sed -e "s|@MODULE@|$top/build/ngx_http_hermes_module.so|g" \
    -e "s|@PREFIX@|$prefix|g" \
    -e "s|@PORT@|$port|g" \
    -e "s|@USER@|$user|g" \
    "$top/conf/nginx.conf.in" > "$prefix/nginx.conf"

/usr/sbin/nginx -t -q -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/logs/error.log"

cat <<MSG
ngx_hermes is listening on http://127.0.0.1:$port (Ctrl-C stops it)
  config: $prefix/nginx.conf   log: $prefix/logs/error.log

Try:
  curl -sN http://127.0.0.1:$port/v1/execute -H 'Content-Type: application/json' \\
       -d '{"session":"demo","code":"import time\\nfor i in range(3):\\n    print(i); time.sleep(0.5)\\nx = 42"}'
  curl -s http://127.0.0.1:$port/v1/execute -H 'Content-Type: application/json' \\
       -H 'Accept: application/json' -d '{"session":"demo","code":"x + 1"}'
MSG

exec /usr/sbin/nginx -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/logs/error.log" \
     -g 'daemon off;'
