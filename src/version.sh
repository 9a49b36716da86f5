#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# The module's version and commit as C, for the build: version.sh OUT.c
#
# VERSION at the top of the tree is the one source of the version (the
# Debian package's and the changelogs' too).  The commit is, in order:
# git's HEAD when the tree is a git checkout of its own, with "-dirty"
# when what goes into the module differs from it; the commit git archive
# wrote into this file when the tree is a release tarball (make dist;
# .gitattributes asks for it); else "unknown".
#
# OUT is rewritten only when it changes, so that a build with nothing new
# relinks nothing although make runs this every time.

set -eu

out=$1
top=$(cd "$(dirname "$0")/.." && pwd -P)

version=$(cat "$top/VERSION")

# both end up in a Prometheus label and a C string: no quoting needed
case $version in
    '' | *[!0-9A-Za-z.+~-]*)
        echo "$0: VERSION: not a version: \"$version\"" >&2
        exit 1 ;;
esac

# git archive replaces this with the archived commit (export-subst)
# shellcheck disable=SC2016  # git's placeholder, not the shell's
archived='$Format:%H$'

commit=unknown

if [ "$(git -C "$top" rev-parse --show-toplevel 2>/dev/null)" = "$top" ]; then
    commit=$(git -C "$top" rev-parse HEAD)

    if [ -n "$(git -C "$top" status --porcelain --untracked-files=no -- \
                   VERSION config ngx_hermes_module.c src)" ]
    then
        commit=$commit-dirty
    fi

else
    case $archived in
        *[!0-9a-f]* | '') ;;
        *) commit=$archived ;;
    esac
fi

case $commit in
    *[!0-9a-z-]*) commit=unknown ;;
esac

mkdir -p "$(dirname "$out")"

cat >"$out.tmp" <<EOF
/* made by src/version.sh from VERSION and the commit: not to be edited */

#include <ngx_config.h>
#include <ngx_core.h>


ngx_str_t  ngx_http_hermes_version = ngx_string("$version");
ngx_str_t  ngx_http_hermes_commit = ngx_string("$commit");
EOF

if cmp -s "$out.tmp" "$out"; then
    rm -f "$out.tmp"
else
    mv -f "$out.tmp" "$out"
fi
