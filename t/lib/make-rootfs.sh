#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# A Debian rootfs for kernels to run in (issue 20, environments): minbase
# and python3, made by mmdebstrap from the machine's own apt mirror, usable
# read-only as / by bwrap.  Cached: a rootfs that is there is used as it is.
#
#   t/lib/make-rootfs.sh [SUITE [DIR]]     default: trixie build/rootfs/SUITE
#
# Prints DIR and exits 0 when it is ready; exits 77 with the reason on
# stderr when it cannot be made here (no mmdebstrap and apt-get cannot
# install it, no mirror in apt's configuration, the mirror unreachable),
# 1 on any other failure.  HERMES_ROOTFS_MIRROR overrides the mirror.
# It is built in a temporary directory beside DIR and renamed into place
# once python3 ran in it, so a half-built rootfs is never used; DIR.build
# records how long it took and its size.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1

suite=${1:-trixie}
dir=${2:-build/rootfs/$suite}

skip() { echo "make-rootfs: $*" >&2; exit 77; }
fail() { echo "make-rootfs: $*" >&2; exit 1; }

# python3 -I runs in it, under bwrap, with it read-only as /
usable() {
    bwrap --ro-bind "$1" / --proc /proc --dev /dev --tmpfs /tmp \
        python3 -I -c 'import sys; print(sys.version)'
}

ready() {
    [ -f "$dir/.hermes-rootfs" ] && { echo "$dir"; exit 0; }
}

ready
command -v bwrap >/dev/null || skip "bwrap is not installed (Debian's package bubblewrap)"

# The first URI of apt's own configuration that serves the archive (not
# -security or -updates): deb822 .sources first, then one-line lists.
mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '
            function flush() {
                if (deb && uri != "" && main) { print uri; found = 1; exit }
                deb = 0; uri = ""; main = 0
            }
            /^[[:space:]]*$/ { flush(); next }
            /^#/ { next }
            tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "uris:" { uri = $2 }
            tolower($1) == "suites:" {
                for (i = 2; i <= NF; i++) if ($i !~ /-(security|updates|backports)$/ && $i !~ /\//) main = 1
            }
            END { if (!found) flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [options] URI SUITE COMPONENT...
        sed -E 's/\[[^]]*\]//' "$f" | awk '
            $1 == "deb" && $3 !~ /-(security|updates|backports)$/ && $3 !~ /\// { print $2 }'
    done
}

url=${HERMES_ROOTFS_MIRROR:-$(mirror | head -n 1)}
[ -n "$url" ] || skip "no Debian mirror in apt's configuration (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list)"

if ! command -v mmdebstrap >/dev/null; then
    [ "$(id -u)" = 0 ] || skip "mmdebstrap is not installed, and only root can install it"
    echo "make-rootfs: installing mmdebstrap" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq mmdebstrap; } >/dev/null 2>&1 \
        || skip "mmdebstrap is not installed, and apt-get could not install it"
fi

mkdir -p "$(dirname "$dir")" || fail "cannot make $(dirname "$dir")"

# a clear reason rather than mmdebstrap's, when the mirror does not answer
probe=$(mktemp "$dir.probe.XXXXXX") || fail "cannot make a temporary file"
if ! timeout 60 /usr/lib/apt/apt-helper download-file \
        "$url/dists/$suite/InRelease" "$probe" >/dev/null 2>&1; then
    rm -f -- "$probe"
    skip "no Debian mirror reachable: $url does not serve $suite"
fi
rm -f -- "$probe"

# one build at a time: tests that need it may start together
exec 9>"$dir.lock" || fail "cannot open $dir.lock"
flock 9 || fail "cannot lock $dir.lock"
ready

tmp=$(mktemp -d "$dir.tmp.XXXXXX") || fail "cannot make a temporary directory"
log=$tmp.log
trap 'rm -rf -- "$tmp" "$log"' EXIT

echo "make-rootfs: mmdebstrap --variant=minbase --include=python3 $suite $dir $url" >&2
start=$(date +%s)
if ! mmdebstrap --variant=minbase --include=python3 "$suite" "$tmp/root" "$url" \
        >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "mmdebstrap failed"
fi
secs=$(($(date +%s) - start))
# mktemp's 0700 is not the rootfs's: a kernel user must read it as /
chmod 755 "$tmp/root" || fail "chmod"

out=$(usable "$tmp/root" 2>&1) || fail "python3 does not run in the new rootfs: $out"
size=$(du -sb "$tmp/root" | cut -f1)
printf 'suite %s\nseconds %s\nbytes %s\npython %s\n' "$suite" "$secs" "$size" \
    "${out%% *}" >"$tmp/root/.hermes-rootfs"
cp "$tmp/root/.hermes-rootfs" "$dir.build"

mv -T -- "$tmp/root" "$dir" || fail "cannot rename the rootfs into $dir"
echo "make-rootfs: $dir: ${secs}s, $((size / 1048576)) MiB, python ${out%% *}" >&2
echo "$dir"
