#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# A kernel's life on a kernel host: its directory, files, start, end and
# crash recovery.  The module runs this text as `sh -c SCRIPT hermes VERB
# ARG...` (locally, and as an EXEC with argv over ssh): values only ever
# arrive as arguments, never as shell text.
#
#   dir ROOT ID GATEWAY INSTANCE        make the kernel's dir, journal it
#   ship ROOT ID NAME LEN...            write its files from stdin
#   start ROOT ID USER OR_USER MEMORY PIDS CPU SANDBOX BWRAP_OPTION...
#                                       start its runner, sandboxed
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

# a size or count for the shell's arithmetic: no sign, no leading zero
# (octal there), not past 64 bits
is_size() {
    case $1 in *[!0-9]*|''|0?*) return 1 ;; esac
    [ ${#1} -le 18 ]
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
# this user's uid.  A process each is most of a new session's time: the
# root and the journal take one stat together once the journal is there.
kernel_dir() {
    root=$1 kid=$2 gw=$3 inst=$4
    is_id "$kid" || { echo "bad kernel id"; exit 2; }
    case $gw$inst in *[!0-9a-f]*|'') echo "bad gateway id"; exit 2 ;; esac

    j=$root/hermes_journal_$uid
    nl='
'
    # the root's mode (%f: hex), and the journal's "type:uid:mode" when
    # it is there (-d: a link to one too, which stat then shows)
    if [ -d "$j" ]; then
        s=$(stat -c '%f %F:%u:%a' -- "$root/" "$j") || exit 1
        js=${s#*"$nl"}
        js=${js#* }
    else
        s=$(stat -c '%f' -- "$root/") || exit 1
        js=
    fi
    m=${s%%[ "$nl"]*}
    # writable by group or others (022), and not sticky (01000)
    if [ $((0x$m & 022)) -ne 0 ] && [ $((0x$m & 01000)) -eq 0 ]; then
        echo "the kernels root $root is writable by others without the sticky bit"
        exit 3
    fi

    if [ -z "$js" ]; then
        mkdir -m 700 -- "$j" 2>/dev/null
        js=$(stat -c %F:%u:%a -- "$j" 2>/dev/null)
    fi
    [ "$js" = "directory:$uid:700" ] || {
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
    # the dir's inode: the end of its line
    ino=${st%%"$nl"*}
    ino=${ino##*:}
    printf '%s %s %s\n' "$gw" "$inst" "$ino" >"$j/$kid" || exit 1
    printf '%s\n%s\n' "$st" "$uid"
}

# The files' bytes one after another on stdin, each NAME exactly LEN bytes
# of it ("head -c" reads no more from a pipe), each made new (noclobber: a
# path there already, a planted link too, fails) 0600, in the dir "dir"
# just made ours.  One shell for all of them: a round trip (over ssh) and
# processes fewer a file.
kernel_ship() {
    if [ $# -lt 4 ] || [ $(($# % 2)) -ne 0 ]; then usage; fi
    root=$1 kid=$2
    shift 2
    is_id "$kid" || { echo "bad kernel id"; exit 2; }

    # all checked before anything is written
    i=0
    for a in "$@"; do
        if [ $((i % 2)) -eq 0 ]; then
            case $a in ''|.|..|*/*) echo "bad file name"; exit 2 ;; esac
        else
            is_number "$a" || { echo "bad number"; exit 2; }
        fi
        i=$((i + 1))
    done

    # the dir "dir" made, never what a link in its place points to
    d=$root/hermes_rkernel_$kid
    if [ -L "$d" ] || [ ! -d "$d" ]; then
        echo "no kernel directory"
        exit 1
    fi

    set -C
    while [ $# -gt 0 ]; do
        head -c "$2" >"$d/$1" || exit 1
        shift 2
    done
}

# The runner starts in its dir: kernel.env becomes its fd 3 and is
# unlinked as it starts, so the token is in no process's environment or argv;
# it leads its own process group (setsid) and, sandboxed, is bwrap's
# child; -I: no script directory, user site or PYTHON* variables on its
# path.  USER (empty: the spawn is not root's) is the user a root spawn
# hands the dir and the kernel to, OR_USER (empty: none) the one used
# where USER does not exist.  MEMORY (bytes; 0: no limits), PIDS and CPU
# (microseconds a 100 ms; 0: none) are cgroups as root, else RLIMIT_AS.
# SANDBOX: off, bwrap, or auto (bwrap where it is installed).  PYTHON:
# the interpreter (a path, or a name on the sandbox's PATH); ROOTFS: the
# environment's tree bwrap's options bind its /usr and /etc from (empty:
# the host's), which must be on this host.  Prints the pid of the
# kernel's process group, then the uid the kernel runs as.
kernel_start() {
    [ $# -ge 10 ] || usage
    root=$1 kid=$2 user=$3 or_user=$4 memory=$5 pids=$6 cpu=$7 sandbox=$8
    python=$9 rootfs=${10}
    shift 10
    is_id "$kid" || { echo "bad kernel id"; exit 2; }
    if ! is_size "$memory" || ! is_size "$pids" || ! is_size "$cpu"; then
        echo "bad number"
        exit 2
    fi
    case $sandbox in
        off|bwrap|auto) ;;
        *) echo "bad sandbox"; exit 2 ;;
    esac
    case $python in
        /*|[A-Za-z0-9_]*) ;;
        *) echo "bad python"; exit 2 ;;
    esac
    # exit 3: this host lacks the environment (another may have it)
    if [ -n "$rootfs" ] && [ ! -d "$rootfs/usr" ]; then
        echo "no rootfs $rootfs on this host"
        exit 3
    fi

    d=$root/hermes_rkernel_$kid
    if [ -L "$d" ] || [ ! -d "$d" ]; then
        echo "no kernel directory"
        exit 1
    fi

    cd -- "$d" || exit 1

    # as shipped, never a link: a root spawn opens it as root
    if [ -L kernel.env ] || [ ! -f kernel.env ]; then
        echo "no kernel.env"
        exit 1
    fi

    # the kernel's uid and gid, looked up once (the user, else OR_USER):
    # the start fails where neither exists
    if [ -n "$user" ]; then
        pw=$(getent passwd -- "$user") \
            || { [ -n "$or_user" ] && pw=$(getent passwd -- "$or_user"); } \
            || { echo "no user $user${or_user:+ nor $or_user}"; exit 1; }
        # NAME:PASSWORD:UID:GID:...
        kuid=${pw#*:*:}
        kgid=${kuid#*:}
        kuid=${kuid%%:*}
        kgid=${kgid%%:*}
        if ! is_number "$kuid" || ! is_number "$kgid"; then
            echo "bad user entry"
            exit 1
        fi
    fi

    if [ -n "$user" ]; then
        # never root: the directory and the kernel go to the user
        chown -R -- "$kuid:$kgid" . || exit 1
    fi

    # kernel.env becomes the runner's fd 3, and is unlinked here while the
    # runner starts (not on its way): the token is in no process's
    # environment or argv, and on disk no longer than this step.  A
    # subshell of its own, detached: the command returns at once.
    exec 3<./kernel.env || exit 1
    runner "$@" >runner.log 2>&1 </dev/null &
    pid=$!
    exec 3<&-
    if ! rm -f ./kernel.env; then
        # it never runs with the token left on disk
        kill -9 "$pid"
        echo "kernel.env could not be removed"
        exit 1
    fi
    echo "$pid"

    # the kernel user's uid, else ours
    if [ -n "$user" ]; then
        echo "$kuid"
    else
        exec id -u
    fi
}

# the subshell that becomes the kernel (exec all the way: $! is its pid)
runner() {
    export HERMES_ENV_FD=3

    if [ "$sandbox" != off ] && [ "$memory" != 0 ]; then
        limits
    fi

    case $sandbox in
        off)
            run "$python" -I kernel_start.py ;;
        auto)
            # the default sandboxes where bwrap is, and says so where not
            if ! command -v bwrap >/dev/null; then
                echo 'hermes: bwrap is not installed, the kernel runs without a sandbox' >&2
                run "$python" -I kernel_start.py
            fi ;;
    esac

    # bwrap's parent is a shell that waits for it, in the kernel's process
    # group: --die-with-parent must see a parent that lives as long as the
    # kernel, not this command's shell, which exits at once (bwrap, and
    # the kernel with it, died whenever bwrap had set up the parent's
    # death signal before that shell was gone)
    # shellcheck disable=SC2016 # $@ is the inner shell's
    run sh -c '"$@"; exit $?' hermes-kernel bwrap "$@" \
        "$python" -I kernel_start.py
}

# the runner's start, this shell's pid kept (exec); as root, as the user
run() {
    if [ -n "$user" ]; then
        exec setsid setpriv --reuid="$kuid" --regid="$kgid" \
            --clear-groups --no-new-privs -- "$@"
    fi

    exec setsid "$@"
}

# As root, a cgroup of the kernel's own, joined by this shell ("0": the
# writer) so that everything it starts is in it: v2, else v1, else
# RLIMIT_AS.  Not as root, RLIMIT_AS alone: RLIMIT_NPROC would count every
# process of the user (nginx's own, as a worker that is not root).
limits() {
    if [ -z "$user" ]; then
        # shellcheck disable=SC3045 # dash's, bash's and busybox's have -v
        ulimit -v $((memory / 1024))
        return
    fi

    k=hermes/$kid
    c=/sys/fs/cgroup

    if [ -f $c/cgroup.controllers ]; then
        { [ -d $c/hermes ] || mkdir -p $c/hermes; } \
            && echo '+memory +pids +cpu' >$c/hermes/cgroup.subtree_control 2>/dev/null
        { mkdir "$c/$k" \
            && echo "$memory" >"$c/$k/memory.max" \
            && echo "$pids" >"$c/$k/pids.max" \
            && { [ "$cpu" = 0 ] || echo "$cpu 100000" >"$c/$k/cpu.max"; } \
            && echo 0 >"$c/$k/cgroup.procs"; } || exit 1

    elif [ -w $c/memory ]; then
        { mkdir -p "$c/memory/$k" "$c/pids/$k" "$c/cpu/$k" \
            && echo "$memory" >"$c/memory/$k/memory.limit_in_bytes" \
            && echo "$pids" >"$c/pids/$k/pids.max" \
            && { [ "$cpu" = 0 ] || echo "$cpu" >"$c/cpu/$k/cpu.cfs_quota_us"; } \
            && for h in memory pids cpu; do
                   echo 0 >"$c/$h/$k/cgroup.procs"
               done; } || exit 1

    else
        # shellcheck disable=SC3045 # as above
        ulimit -v $((memory / 1024))
    fi
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

usage() {
    echo "usage: dir|ship|start|kill|recover ARG..."
    exit 2
}

verb=${1-}
[ $# -gt 0 ] && shift

# uid: the journal's owner (not needed, not run, for ship and start)
case $verb:$# in
    dir:4)     uid=$(id -u); kernel_dir "$@" ;;
    ship:*)    kernel_ship "$@" ;;
    start:*)   kernel_start "$@" ;;
    kill:5)    uid=$(id -u); kernel_kill "$@" ;;
    recover:3) uid=$(id -u); kernel_recover "$@" ;;
    *)         usage ;;
esac
exit 0
