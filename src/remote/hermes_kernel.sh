#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# A kernel's directory, end and crash recovery on a kernel host.  The
# module runs this text as `sh -c SCRIPT hermes VERB ARG...` (locally, and
# as an EXEC with argv over ssh): values only ever arrive as arguments.
#
#   dir ROOT ID GATEWAY INSTANCE        make the kernel's dir, journal it
#   kill ROOT ID PID START INODE        end a kernel, unjournal it
#   recover ROOT GATEWAY INSTANCE       end what an earlier run left
#
# The journal, ROOT/hermes_journal_UID (0700, this user's only), says
# which kernels are this gateway's: one file per kernel, named by its id
# (exactly 32 lowercase hex), holding "GATEWAY INSTANCE INODE".  Recovery
# trusts it and nothing a kernel or another user can write: not the
# kernel dirs, not their names, not what is in them.
set -u
umask 077

# an id is exactly 32 lowercase hex, or nothing is done with it
is_id() {
    case $1 in *[!0-9a-f]*|'') return 1 ;; esac
    [ ${#1} -eq 32 ]
}

is_number() {
    case $1 in *[!0-9]*|'') return 1 ;; esac
}

journal_ok() {
    [ "$(stat -c %F:%u:%a -- "$1" 2>/dev/null)" = "directory:$uid:700" ]
}

# every process in the kernel's cgroups (root's sandbox), then the cgroups
kill_cgroups() {
    for c in /sys/fs/cgroup/hermes/"$1" /sys/fs/cgroup/*/hermes/"$1"; do
        [ -d "$c" ] || continue
        i=0
        while [ $i -lt 100 ] && ! rmdir -- "$c" 2>/dev/null; do
            # shellcheck disable=SC2046 # one pid a word
            kill -9 $(cat -- "$c/cgroup.procs" 2>/dev/null) 2>/dev/null
            sleep 0.02
            i=$((i + 1))
        done
    done
}

# the dir, if it is still the one made at spawn (INODE 0: unknown); a
# link there goes itself, never what it points to
remove_dir() {
    if [ "$2" = 0 ] || [ "$(stat -c %i -- "$1" 2>/dev/null)" = "$2" ]; then
        rm -rf -- "$1"
    fi
}

# Never a directory found there: a co-tenant who read the name first may
# have made it.  mkdir without -p fails on any existing path ("EEXIST",
# exit 4: the module picks another id).  The root must keep others from
# renaming our directory away (not writable by them, or sticky).  Prints
# "made", then "type:uid:mode:inode" of the dir, cells/ and rpc/, then
# this user's uid.
kernel_dir() {
    root=$1 kid=$2 gw=$3 inst=$4
    is_id "$kid" || { echo "bad kernel id"; exit 2; }
    case $gw$inst in *[!0-9a-f]*|'') echo "bad gateway id"; exit 2 ;; esac

    if [ -n "$(find "$root/" -maxdepth 0 -perm /022 ! -perm -1000)" ]; then
        echo "the kernels root $root is writable by others without the sticky bit"
        exit 3
    fi

    j=$root/hermes_journal_$uid
    mkdir -m 700 -- "$j" 2>/dev/null
    journal_ok "$j" || {
        echo "the journal $j is not a directory of uid $uid with mode 0700"
        exit 6
    }

    d=$root/hermes_rkernel_$kid

    if ! mkdir -m 700 -- "$d" 2>/dev/null; then
        if [ -e "$d" ] || [ -L "$d" ]; then
            echo EEXIST
            exit 4
        fi
        mkdir -m 700 -- "$d"
        exit 5
    fi

    echo made

    mkdir -m 700 -- "$d/cells" "$d/rpc" || exit 1
    st=$(stat -c '%F:%u:%a:%i' -- "$d" "$d/cells" "$d/rpc") || exit 1
    ino=$(stat -c %i -- "$d") || exit 1
    printf '%s %s %s\n' "$gw" "$inst" "$ino" >"$j/$kid" || exit 1
    printf '%s\n%s\n' "$st" "$uid"
}

# A PID (0: none) started at another time than START (0: not known yet, a
# spawn that failed) is a stranger's (the kernel's pid was reused): no
# signal.  A PID that names no process may still be our group's id, and
# then only ours.
kernel_kill() {
    root=$1 kid=$2 pid=$3 start=$4 ino=$5
    is_id "$kid" || { echo "bad kernel id"; exit 2; }
    if ! is_number "$pid" || ! is_number "$start" || ! is_number "$ino"; then
        echo "bad number"
        exit 2
    fi

    if [ "$pid" -gt 1 ]; then
        if s=$(cat "/proc/$pid/stat" 2>/dev/null); then
            s=${s##*) }
            # shellcheck disable=SC2086 # the fields of stat, split on purpose
            set -- $s
            if [ "$start" = 0 ] || [ "${20}" = "$start" ]; then
                kill -9 "-$pid" 2>/dev/null
            fi
        else
            kill -9 "-$pid" 2>/dev/null
        fi
    fi

    kill_cgroups "$kid"
    remove_dir "$root/hermes_rkernel_$kid" "$ino"
    rm -f -- "$root/hermes_journal_$uid/$kid"
}

# Prints each removed kernel's id; "!" and why when the journal is not
# ours.
kernel_recover() {
    root=$1 gw=$2 inst=$3
    j=$root/hermes_journal_$uid

    [ -e "$j" ] || [ -L "$j" ] || return 0
    journal_ok "$j" || {
        echo "!the journal $j is not a directory of uid $uid with mode 0700"
        exit 3
    }

    for e in "$j"/*; do
        kid=${e##*/}
        is_id "$kid" || continue
        if [ ! -f "$e" ] || [ -L "$e" ]; then continue; fi

        line=$(head -c 128 -- "$e") || continue
        # shellcheck disable=SC2086 # three words, split on purpose
        set -- $line
        if [ $# -ne 3 ] || [ "$1" != "$gw" ] || [ "$2" = "$inst" ]; then
            continue
        fi
        ino=$3
        is_number "$ino" || continue
        d=$root/hermes_rkernel_$kid

        # the dir made at spawn: its processes' groups
        if [ "$(stat -c %i -- "$d" 2>/dev/null)" = "$ino" ]; then
            for q in /proc/[0-9]*; do
                [ "$(readlink "$q/cwd" 2>/dev/null)" = "$d" ] || continue
                s=$(cat "$q/stat" 2>/dev/null) || continue
                s=${s##*) }
                # shellcheck disable=SC2086 # the fields of stat
                set -- $s
                [ "$3" -gt 1 ] && kill -9 "-$3" 2>/dev/null
            done
        fi

        kill_cgroups "$kid"
        remove_dir "$d" "$ino"
        rm -f -- "$e"
        echo "$kid"
    done
}

uid=$(id -u)
verb=${1-}
[ $# -gt 0 ] && shift

case $verb:$# in
    dir:4)     kernel_dir "$@" ;;
    kill:5)    kernel_kill "$@" ;;
    recover:3) kernel_recover "$@" ;;
    *)         echo "usage: dir|kill|recover ARG..."; exit 2 ;;
esac
exit 0
