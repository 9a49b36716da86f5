#!/bin/sh
# nginx-dev ships headers only; the unit tests compile a few nginx core .c
# files. Fetch them from Debian's source package (upstream nginx_1.22.1
# orig tarball) into the build dir, with apt's own tools and a private
# list dir: the system's apt configuration is not touched, and no nginx
# source is kept in this repository.
# usage: fetch-nginx-src.sh OUTDIR
set -eu
out=$1
want=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' /usr/share/nginx/src/src/core/nginx.h)
[ -f "$out/nginx-$want/src/core/ngx_slab.c" ] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/parts" "$work/lists/partial"
cat > "$work/parts/debian-src.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
opts="-o Dir::Etc::SourceList=$work/none.list -o Dir::Etc::SourceParts=$work/parts -o Dir::State::Lists=$work/lists"
apt-get $opts update -qq >/dev/null 2>&1 || true
(cd "$work" && apt-get $opts source --download-only "nginx" >/dev/null 2>&1)
tarball=$(ls "$work"/nginx_"$want".orig.tar.gz)
mkdir -p "$out"
tar -xzf "$tarball" -C "$out" "nginx-$want/src/core" "nginx-$want/src/os/unix" "nginx-$want/LICENSE"
test -f "$out/nginx-$want/src/core/ngx_slab.c"
