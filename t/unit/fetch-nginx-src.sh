#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# nginx-dev ships headers only; the unit tests compile a few nginx core .c
# files. Fetch them from Debian's source package (upstream nginx_1.22.1
# orig tarball) into the build dir, with apt's own tools, from the mirrors
# the machine's apt configuration names (as deb-src entries in a private
# list dir): the system's apt configuration is not touched, and no nginx
# source is kept in this repository.
# usage: fetch-nginx-src.sh OUTDIR
set -eu
out=$1
want=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' /usr/share/nginx/src/src/core/nginx.h)
[ -f "$out/nginx-$want/src/core/ngx_slab.c" ] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the machine's own mirrors (apt's configuration), each as a source entry
# of its own: the first that has the package's orig tarball wins (a
# security mirror may carry a newer revision but not its sources)
n=0
for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v out="$work/cand-$n" 'BEGIN { RS = "" }
        { sub(/(^|\n)Types:[^\n]*/, "\nTypes: deb-src");
          print > (out "-" NR ".sources") }' "$f"
    n=$((n + 1))
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" |
        while read -r line; do
            n=$((n + 1))
            echo "$line" >"$work/cand-l-$n-$(basename "$f").list"
        done
done

for c in "$work"/cand-*; do
    [ -f "$c" ] || continue
    rm -rf "$work/parts" "$work/lists"
    mkdir -p "$work/parts" "$work/lists/partial"
    cp "$c" "$work/parts/"
    set -- -o "Dir::Etc::SourceList=$work/none.list" \
        -o "Dir::Etc::SourceParts=$work/parts" -o "Dir::State::Lists=$work/lists"
    apt-get "$@" update -qq >/dev/null 2>&1 || continue
    (cd "$work" && apt-get "$@" source --download-only "nginx" >/dev/null 2>&1) || true
    [ -f "$work/nginx_$want.orig.tar.gz" ] && break
done

tarball=$work/nginx_$want.orig.tar.gz
[ -f "$tarball" ] || { echo "no mirror of apt's configuration has nginx $want's source" >&2; exit 1; }
mkdir -p "$out"
tar -xzf "$tarball" -C "$out" "nginx-$want/src/core" "nginx-$want/src/os/unix" "nginx-$want/LICENSE"
test -f "$out/nginx-$want/src/core/ngx_slab.c"
