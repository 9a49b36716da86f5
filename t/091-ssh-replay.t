#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The spawn commands of docs/internals.md ("Spawn"), which the module
# runs on the kernel host (over ssh: as EXECs of its agent), replayed
# through real shells under a temp root, payloads on stdin.
#
# Every step is a verb of src/remote/hermes_kernel.sh, run with argv as
# the module runs it (sh -c SCRIPT hermes VERB ARG...): "dir ROOT ID
# GATEWAY INSTANCE", "ship ROOT ID NAME LEN...", "start ROOT ID USER
# OR_USER MEMORY PIDS CPU SANDBOX BWRAP_OPTION...", "kill ROOT ID PID
# START INODE" (their hostile-argument cases are t/033's).  The start's
# arguments are composed at run time (hermes_sandbox, root or not), so
# they are recorded from a real nginx (its debug log shows every step's
# command), once with "hermes_sandbox off" and once with the default bwrap
# sandbox, and replayed with this test's kernel directory and id.  Every
# command is also checked against docs/internals.md: the test fails when
# the docs drift from what is sent.

use strict;
use warnings;
no warnings 'exec';

use Test::More;
use File::Temp ();
use File::Path qw(make_path);
use POSIX qw(:sys_wait_h);
use IO::Select;
use JSON::PP ();
use Time::HiRes qw(time sleep);

use Hermes::Test;

# a test stopped by a signal still runs END: what it started goes
$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $ROOT = Hermes::Test::repo_root();
my $C_KERNEL = "$ROOT/src/ngx_hermes_kernel.c";
my $SCRIPT = slurp("$ROOT/src/remote/hermes_kernel.sh") // die "no hermes_kernel.sh";
# the script with its start waited for at the end: the runner's exit code,
# the outer shell's environment and variables then
(my $WAITED = $SCRIPT) =~ s/\bexec (id -u)\b/$1/g == 1 or die "hermes_kernel.sh: not one exec id -u";
$WAITED =~ s/\nexit 0\n\z/\nwait \$!; echo "rc=\$?"; echo "--- env"; env; echo "--- set"; set\n/
    or die "hermes_kernel.sh does not end with exit 0";
my ($GW, $INST) = ('0123456789abcdef', 'fedcba9876543210');
my $DOCS = "$ROOT/docs/internals.md";
my $PY = -x '/usr/bin/python3' ? '/usr/bin/python3' : undef;
plan skip_all => '/usr/bin/python3 not found' unless $PY;

my $AS_ROOT = $> == 0;
my @MODES = ('off', -x '/usr/bin/bwrap' ? 'bwrap' : ());
diag 'bwrap not installed (Debian package bubblewrap): sandbox off only'
    if @MODES == 1;

###############################################################################
# the commands as documented (copied from docs/internals.md, section Spawn)

my %DOC = (
    dirs  => 'sh -c SCRIPT hermes dir ROOT ID GATEWAY INSTANCE',
    ship  => 'sh -c SCRIPT hermes ship ROOT ID kernel_runner.py LEN hermes_tools.py LEN kernel_start.py LEN kernel_runner.pyc LEN kernel.env LEN',
    start => 'sh -c SCRIPT hermes start ROOT ID USER OR_USER MEMORY PIDS CPU SANDBOX PYTHON ROOTFS BWRAP_OPTION...',
    kill  => 'sh -c SCRIPT hermes kill ROOT ID PID START INODE',
);

# the start step's arguments: as not root without a sandbox, and the
# pieces that replace some of them as root and with the default sandbox
my %START = (
    base     => q{sh -c SCRIPT hermes start ROOT ID '' '' 0 0 0 off python3 ''},
    user     => q{hermes-kernel nobody},
    limits   => q{MEMORY PIDS CPU auto},
    bwrap    => q{--unshare-all --share-net --die-with-parent --new-session --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin --symlink usr/sbin /sbin --ro-bind /etc /etc --proc /proc --dev /dev --size TMP --tmpfs /dev/shm --remount-ro /dev --size TMP --tmpfs /tmp --symlink ../tmp /var/tmp --bind DIR DIR --chdir DIR --remount-ro / --setenv PATH /usr/local/bin:/usr/bin:/bin --setenv HOME /tmp},
);

my $docs = slurp($DOCS) // '';
for my $k (sort keys %DOC) {
    ok(index($docs, "`$DOC{$k}`") >= 0, "docs/internals.md still documents the $k step as tested")
        or diag "expected in $DOCS:\n  `$DOC{$k}`";
}
for my $k (sort keys %START) {
    ok(index($docs, "`$START{$k}`") >= 0, "docs/internals.md documents the start step's $k piece as tested")
        or diag "expected in $DOCS:\n  `$START{$k}`";
}
like($docs, qr/HERMES_RPC_TOKEN.*HERMES_KERNEL_ID.*HERMES_IDLE_TIMEOUT/s,
    'docs: kernel.env holds HERMES_RPC_TOKEN, HERMES_KERNEL_ID, HERMES_IDLE_TIMEOUT');

# the start command the docs give for a spawn as root or not, in a mode
sub doc_start {
    my ($root, $mode) = @_;
    my $s = $START{base};
    my $put = sub {
        my ($old, $new) = @_;
        my $i = index($s, $old);
        die "docs piece not found: $old\n" if $i < 0;
        substr($s, $i, length $old) = $new;
    };
    $put->(q{'' ''}, $START{user}) if $root;
    $put->(q{0 0 0 off python3 ''}, "$START{limits} python3 '' $START{bwrap}")
        if $mode eq 'bwrap';
    return $s;
}

# the arguments of a logged command ("sh -c SCRIPT hermes ARG..."): split
# on blanks (this test's paths have none), '' an empty one
sub logged_args {
    my ($text) = @_;
    $text =~ s/^sh -c SCRIPT hermes // or return ();
    return map { $_ eq "''" ? '' : $_ } split / /, $text;
}

###############################################################################
# the kernel.env the C code writes

my @kernel_c = c_strings($C_KERNEL);
ok(scalar @kernel_c, "read the string literals of $C_KERNEL") or BAIL_OUT("no $C_KERNEL");

my %C;
for my $r (@kernel_c) {
    push @{ $C{envfmt} }, $r->[0] if $r->[0] =~ /^HERMES_RPC_TOKEN=/;
}
is(scalar @{ $C{envfmt} || [] }, 1, 'exactly one kernel.env format string in the C source')
    or diag explain $C{envfmt};
$C{envfmt} = $C{envfmt}[0] // '';
like($C{envfmt}, qr/^HERMES_RPC_TOKEN='%s'\nHERMES_KERNEL_ID='%\*s'\nHERMES_IDLE_TIMEOUT='%ui'\n$/,
    'C kernel.env: single-quoted KEY=value lines');

# no file of the module builds a kernel host command as shell text any
# more: what runs there is src/remote/, values as arguments
for my $f (sort(glob("$ROOT/src/*.c")), "$ROOT/ngx_hermes_module.c") {
    next unless -f $f;
    for my $r (c_strings($f)) {
        ok(0, "$f:$r->[1]: no shell text of a spawn step") or diag $r->[0]
            if $r->[0] =~ /umask 077|head -c|\bsetsid\b|\bbwrap --|\bcd '|exec 3</;
    }
}
ok(1, 'the C sources were searched for shell text');

# every run of adjacent C string literals in a file: [text, line]
sub c_strings {
    my ($file) = @_;
    my $src = slurp($file) // return ();
    my (@runs, $cur, $line);
    my $ln = 1;
    while ($src =~ m{\G(?:
            ("(?:[^"\\\n]|\\.)*")            # 1 string literal
          | ('(?:[^'\\\n]|\\.)*')            # 2 char literal
          | (/\*.*?\*/)                      # 3 block comment
          | (//[^\n]*)                       # 4 line comment
          | (\s+)                            # 5 blanks
          | ([^"'/\s]+|/)                    # 6 anything else
        )}gsx)
    {
        my ($str, $blank, $com) = ($1, $5, $3 // $4);
        my $tok = $&;
        if (defined $str) {
            my $s = substr($str, 1, -1);
            $s =~ s/\\(n|t|"|\\|')/{ n => "\n", t => "\t", '"' => '"', '\\' => '\\', "'" => "'" }->{$1}/ge;
            if (defined $cur) { $cur .= $s } else { $cur = $s; $line = $ln }
        } elsif (defined $blank || defined $com) {
            # adjacent literals may be split by blanks and comments
        } else {
            push @runs, [$cur, $line] if defined $cur;
            undef $cur;
        }
        $ln += ($tok =~ tr/\n//);
    }
    push @runs, [$cur, $line] if defined $cur;
    return @runs;
}

# the ship step for a directory and [name, bytes] pairs, as the module
# runs it: the arguments, and the payload (the bytes one after another)
sub ship_args {
    my ($dir, @files) = @_;
    my ($root, $kid) = $dir =~ m{^(.*)/hermes_rkernel_([^/]*)$} or die "not a kernel dir: $dir\n";
    return (['ship', $root, $kid, map { ($_->[0], length $_->[1]) } @files],
            join '', map { $_->[1] } @files);
}

###############################################################################
# the commands a real nginx sends, from its debug log

my %REC;    # mode => {start, dir, kid}
{
    my $t = Hermes::Test->new(workers => 1, error_log_level => 'debug');
    $t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 20s;

        location = /off {
            hermes_execute;
            hermes_sandbox off;
        }

        location = /bwrap {
            hermes_execute;
        }
    }
CONF
    $t->run;

    my %kid;
    for my $mode (@MODES) {
        my $r = $t->execute("/$mode", {session => "replay-$mode", code => 'print(6 * 7)'});
        is($r->{result}{output}, "42\n", "recording: a cell ran in a kernel spawned with sandbox $mode")
            or diag explain $r;
        $kid{$mode} = ($r->{events}[0] // {})->{kernel_id} // '';
    }
    my $log = $t->error_log;
    $t->stop;
    $t->kill_strays;

    my @steps;
    for my $line (split /\n/, $log) {
        next unless $line =~ /\[debug\] .*?hermes: spawn step "([^"]*)": (.*)$/;
        my ($step, $cmd) = ($1, $2);
        $cmd =~ s/\\x([0-9a-f]{2})/chr hex $1/ge;
        push @steps, [$step, $cmd];
    }
    ok(scalar @steps, 'the debug log shows the spawn steps');
    unlike($log, qr/[0-9a-f]{64}/, 'no token (64 hex) in the debug log');

    for my $mode (@MODES) {
        my $kid = $kid{$mode};
        my $dir = $t->kroot . "/hermes_rkernel_$kid";
        my @mine = grep { index($_->[1], "/hermes_rkernel_$kid") >= 0 || index($_->[1], " $kid ") >= 0 } @steps;
        my %by;
        push @{ $by{$_->[0]} }, $_->[1] for @mine;
        is_deeply([ sort keys %by ], [ 'directory setup', 'ship', 'start' ],
            "$mode: the steps of its spawn logged");

        # the script, its values as arguments
        my $groot = $t->kroot;
        die "the kernels root holds a blank: $groot\n" if $groot =~ /\s/;
        like(($by{'directory setup'} || [])->[0] // '',
            qr/^sh -c SCRIPT hermes dir \Q$groot\E \Q$kid\E [0-9a-f]{16} [0-9a-f]{16}$/,
            "$mode: the directory step: the script, its values as arguments");
        # one ship step: the runner's files as they are in src/remote/ and
        # its bytecode as built, kernel.env last (the start step reads it)
        my @ship = @{ $by{ship} || [] };
        is(scalar @ship, 1, "$mode: one ship step");
        my ($verb, $sroot, $skid, @files) = logged_args($ship[0] // '');
        is("$verb $sroot $skid", "ship $groot $kid", "$mode: the ship step: the root and the id")
            or diag $ship[0];
        my %len;
        my @names;
        while (@files) { my ($n, $l) = splice @files, 0, 2; $len{$n} = $l; push @names, $n }
        is("@names", 'kernel_runner.py hermes_tools.py kernel_start.py kernel_runner.pyc kernel.env',
            "$mode: the runner, the tools client, the runner's start and bytecode, kernel.env last")
            or diag $ship[0];
        for my $py (qw(kernel_runner.py hermes_tools.py kernel_start.py)) {
            is($len{$py}, -s "$ROOT/src/remote/$py", "$mode: $py shipped, its length as in src/remote/");
        }
        is($len{'kernel_runner.pyc'}, -s "$ROOT/build/gen/kernel_runner.pyc",
            "$mode: kernel_runner.pyc shipped, its length as built");
        (my $sd = $ship[0] // '') =~ s/^(sh -c SCRIPT hermes ship) \Q$groot $kid\E/$1 ROOT ID/;
        $sd =~ s/ \d+\b/ LEN/g;
        is($sd, $DOC{ship}, "$mode: the ship step sent = docs");

        my $start = ($by{start} || [])->[0] // '';
        is(scalar @{ $by{start} || [] }, 1, "$mode: one start command");
        like($start, $mode eq 'bwrap' ? qr{ --setenv HOME /tmp$} : qr/ off python3 ''$/,
            "$mode: the start command logged whole (one line, not cut)");
        unlike($start, qr/TOKEN|[0-9a-f]{64}/, "$mode: no token on the start command line");

        # docs: the recorded arguments, each value named as docs name it
        my @a = logged_args($start);
        my @d = @a;
        @d[0 .. 2] = ('start', 'ROOT', 'ID') if $a[1] eq $groot && $a[2] eq $kid;
        if ($mode eq 'bwrap') {
            is("@a[5 .. 7]", '1073741824 256 0', "$mode: the default limits: 1 GiB, 256 pids, no CPU quota");
            @d[5 .. 7] = qw(MEMORY PIDS CPU);
            $_ = $_ eq $dir ? 'DIR' : $_ eq '67108864' ? 'TMP' : $_ for @d[9 .. $#d];
        }
        my $doc = join ' ', 'sh -c SCRIPT hermes', map { $_ eq '' ? "''" : $_ } @d;
        is($doc, doc_start($AS_ROOT, $mode),
            "$mode: the start command sent = docs (" . ($AS_ROOT ? 'as root' : 'not root') . ')');

        $REC{$mode} = { args => \@a, dir => $dir, kid => $kid, root => $groot };
    }
}
for my $mode (@MODES) {
    die "no start command recorded for sandbox $mode: nothing to replay\n"
        unless @{ $REC{$mode}{args} || [] } && $REC{$mode}{kid};
}

###############################################################################
# replay

my $tmp = File::Temp->newdir('hermes-replay-XXXXXXXX', TMPDIR => 1, CLEANUP => !$ENV{HERMES_KEEP});
chmod 0755, "$tmp";
my $CLEAN_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

# what END cleans up if a test fails halfway: [pid, start time], kernel
# ids, the (unique) arguments of the sleeps runners start
my (@STARTED, @KIDS, @SLEEPS);

# the uid the runner gets: the kernel user's as root
my $KUID = $>;
if ($AS_ROOT) {
    my @pw = getpwnam('hermes-kernel');
    @pw = getpwnam('nobody') unless @pw;
    $KUID = $pw[2];
}

# cgroups the start makes (root and bwrap only): v2, else v1, else none
my $CGROUP = !$AS_ROOT ? ''
    : -f '/sys/fs/cgroup/cgroup.controllers' ? 'v2'
    : -w '/sys/fs/cgroup/memory' ? 'v1' : '';

sub cgroup_dirs {
    my ($kid) = @_;
    return grep { -d } "/sys/fs/cgroup/hermes/$kid", glob("/sys/fs/cgroup/*/hermes/$kid");
}

# sh_start($shell, $cmd, stdin => $bytes) -> handle; sh_finish($h, timeout)
# -> {rc, out, err, elapsed (until stdout EOF and exit)}
# The shell starts with umask 022 and a clean environment, stdout a pipe:
# the command must close it (a detached child holding it would hang a
# remote channel) and exit.
sub sh_start {
    my ($shell, $cmd, %o) = @_;
    my $in = "$tmp/stdin." . $$ . '.' . int(rand 1e9);
    open my $ifh, '>:raw', $in or die; print $ifh $o{stdin} // ''; close $ifh;
    pipe my $rd, my $wr or die "pipe: $!";
    my $t0 = time;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        close $rd;
        if (length($o{stdin} // '')) {
            # a pipe, as from the module, in pieces: the ship step's
            # "head -c" must read exactly each file's length from it
            pipe my $pr, my $pw or POSIX::_exit(127);
            my $w = fork // POSIX::_exit(127);
            if ($w == 0) {
                close $pr;
                open my $src, '<:raw', $in or POSIX::_exit(1);
                local $/ = \1000;
                while (my $chunk = <$src>) { syswrite $pw, $chunk or last }
                POSIX::_exit(0);
            }
            close $pw;
            open STDIN, '<&', $pr or POSIX::_exit(127);
            close $pr;
        } else {
            open STDIN, '<', $in or POSIX::_exit(127);
        }
        open STDOUT, '>&', $wr or POSIX::_exit(127);
        open STDERR, '>', "$in.err" or POSIX::_exit(127);
        close $wr;
        umask 022;
        %ENV = (PATH => $CLEAN_PATH, LANG => 'C', HOME => '/root');
        chdir '/';
        exec { $shell } $shell, '-c', $cmd, @{ $o{args} || [] };
        POSIX::_exit(127);
    }
    close $wr;
    return { pid => $pid, rd => $rd, in => $in, t0 => $t0 };
}

sub sh_finish {
    my ($h, $timeout) = @_;
    my $out = '';
    my $sel = IO::Select->new($h->{rd});
    my $deadline = time + ($timeout // 10);
    my $eof = 0;
    while (!$eof && time < $deadline) {
        next unless $sel->can_read($deadline - time);
        my $n = sysread($h->{rd}, my $buf, 65536);
        if (!$n) { $eof = 1; last }
        $out .= $buf;
    }
    my $rc;
    my $exited = wait_until(sub {
        my $w = waitpid($h->{pid}, WNOHANG);
        $rc = $? >> 8 if $w == $h->{pid};
        $w == $h->{pid} || $w == -1;
    }, $deadline - time > 0 ? $deadline - time : 0.01);
    my $elapsed = time - $h->{t0};
    unless ($eof && $exited) {
        kill 'KILL', $h->{pid};
        waitpid $h->{pid}, 0;
        $rc = -1;
    }
    close $h->{rd};
    my $err = slurp("$h->{in}.err") // '';
    unlink $h->{in}, "$h->{in}.err";
    return { rc => $rc, out => $out, err => $err, elapsed => $elapsed,
             timed_out => !($eof && $exited) };
}

sub run_sh {
    my ($shell, $cmd, %o) = @_;
    return sh_finish(sh_start($shell, $cmd, %o), $o{timeout});
}

sub mode { my @s = lstat $_[0]; return @s ? sprintf('%o', $s[2] & 07777) : 'missing' }

# A stand-in kernel_runner.py: takes kernel.env from HERMES_ENV_FD the way
# kernel_runner.py's _read_env_fd does, reports what it was given and sees
sub standin_runner {
    my (%o) = @_;
    my $sleep = $o{sleep} // 0;
    my $exit = $o{exit} // 0;
    my $child = '';
    $child .= "subprocess.Popen(['sleep', '$o{child}'])\n" if $o{child};
    $child .= "subprocess.Popen(['sleep', '$o{setsid_child}'], start_new_session=True)\n"
        if $o{setsid_child};
    return <<"PY";
# stand-in kernel_runner.py (t/091-ssh-replay.t): reports what it was given
import json, os, stat, subprocess, sys, time
old = os.umask(0)
os.umask(old)
info = {"env_fd": os.environ.pop("HERMES_ENV_FD", None)}
env = {}
if info["env_fd"] is not None:
    fd = int(info["env_fd"])
    st = os.fstat(fd)
    info["env_fd_regular"] = stat.S_ISREG(st.st_mode)
    info["env_fd_links"] = st.st_nlink
    data = os.pread(fd, 65536, 0).decode()
    os.close(fd)
    for line in data.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("HERMES_"):
            env[key] = value.strip("'")
def listdir(d):
    try:
        return sorted(os.listdir(d))
    except OSError as e:
        return [type(e).__name__]
status = open("/proc/self/status").read()
info.update({
    "token": env.get("HERMES_RPC_TOKEN"),
    "token_len": len(env.get("HERMES_RPC_TOKEN", "")),
    "kernel_id": env.get("HERMES_KERNEL_ID"),
    "idle": env.get("HERMES_IDLE_TIMEOUT"),
    "environ_hermes": sorted(k for k in os.environ if k.startswith("HERMES_")),
    "env_file_present": os.path.exists("kernel.env"),
    "cwd": os.getcwd(),
    "siblings": listdir(os.path.dirname(os.getcwd())),
    "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
    "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(),
    "no_new_privs": "NoNewPrivs:\\t1" in status,
    "umask": old,
    "argv": sys.argv,
    "stdin_devnull": os.path.samestat(os.fstat(0), os.stat("/dev/null")),
})
with open("standin.json.tmp", "w") as f:
    json.dump(info, f)
os.rename("standin.json.tmp", "standin.json")
print("runner stdout line", flush=True)
sys.stderr.write("runner stderr line\\n")
sys.stderr.flush()
$child
# the ready file the way docs/internals.md says: {"pid": N}, NAME.tmp renamed
fd = os.open("ready.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
os.write(fd, ('{"pid":%d}' % os.getpid()).encode())
os.close(fd)
os.rename("ready.tmp", "ready")
time.sleep($sleep)
sys.exit($exit)
PY
}

sub env_payload {
    my ($token, $kid, $idle) = @_;
    my $f = $C{envfmt};
    $f =~ s/%\*s/$kid/g;
    $f =~ s/%ui/$idle/g;
    $f =~ s/%s/$token/g;
    return $f;
}

# the recorded start arguments, for this test's directory and kernel id
sub start_args {
    my ($mode, $dir, $kid) = @_;
    my $rec = $REC{$mode} or die "no start command recorded for $mode\n";
    my ($root) = $dir =~ m{^(.*)/hermes_rkernel_[^/]*$} or die "not a kernel dir: $dir\n";
    my @a = @{ $rec->{args} };
    @a[1, 2] = ($root, $kid);
    $_ eq $rec->{dir} and $_ = $dir for @a[3 .. $#a];
    push @KIDS, $kid;
    return @a;
}

# hermes_kernel.sh VERB ARG... as the module runs it
sub run_script {
    my ($shell, @args) = @_;
    my %o = ref $args[-1] eq 'HASH' ? %{ pop @args } : ();
    return run_sh($shell, $o{script} // $SCRIPT, %o, args => ['hermes', @args]);
}

# the directory step for a kernel dir ROOT/hermes_rkernel_KID
sub run_dirs {
    my ($shell, $dir) = @_;
    my ($root, $kid) = $dir =~ m{^(.*)/hermes_rkernel_([^/]*)$} or die "not a kernel dir: $dir\n";
    return run_script($shell, 'dir', $root, $kid, $GW, $INST);
}

# the kill step for a pid, its start time, the dir's inode
sub run_kill {
    my ($shell, $pid, $start, $ino, $dir, $kid) = @_;
    my ($root) = $dir =~ m{^(.*)/hermes_rkernel_[^/]*$} or die "not a kernel dir: $dir\n";
    return run_script($shell, 'kill', $root, $kid, $pid, $start, $ino);
}

sub proc_start {
    my $s = slurp("/proc/$_[0]/stat") // return 0;
    $s =~ s/.*\) //s;
    return (split ' ', $s)[19];
}

# [ppid, pgrp, session] of a pid
sub proc_ids {
    my $s = slurp("/proc/$_[0]/stat") // return ();
    $s =~ /\) \S (\d+) (\d+) (\d+)/s or return ();
    return ($1, $2, $3);
}

# a pid and every process below it
sub proc_tree {
    my ($top) = @_;
    my %kids;
    opendir my $dh, '/proc' or return ();
    for my $p (grep { /^\d+$/ } readdir $dh) {
        my ($pp) = proc_ids($p);
        push @{ $kids{$pp} }, $p if defined $pp;
    }
    my @r;
    my @q = ($top);
    while (@q) {
        my $p = shift @q;
        push @r, $p;
        push @q, @{ $kids{$p} || [] };
    }
    return @r;
}

# the runner's pid as this host sees it (in a sandbox: not its own)
sub host_runner {
    my ($pid) = @_;
    for my $p (proc_tree($pid)) {
        my $c = slurp("/proc/$p/cmdline") // next;
        return $p if $c =~ /^python3\0-I\0kernel_start\.py\0/;
    }
    return undef;
}

sub proc_uids {
    my $s = slurp("/proc/$_[0]/status") // return '';
    return $s =~ /^Uid:\s+(.*)$/m ? join(',', split ' ', $1) : '';
}

sub dirs_out {
    my ($dir) = @_;
    my $uid = $>;
    my $l = join '', map { my @s = lstat $_; "directory:$uid:700:$s[1]\n" } $dir, "$dir/cells", "$dir/rpc";
    return "made\n$l$uid\n";
}

sub new_token { join '', map { sprintf '%02x', int rand 256 } 1 .. 32 }
sub new_kid   { join '', map { sprintf '%02x', int rand 256 } 1 .. 16 }

sub read_json { my $c = slurp($_[0]); defined $c ? eval { JSON::PP->new->decode($c) } : undef }

sub ready_pid {
    my ($dir) = @_;
    my $r = read_json("$dir/ready") or return undef;
    return $r->{pid};
}

sub cmdlines_with {
    my ($needle) = @_;
    my $all = all_cmdlines();
    return grep { index($all->{$_}, $needle) >= 0 } keys %$all;
}

sub environs_with {
    my ($needle) = @_;
    my $all = all_environs();
    return grep { index($all->{$_}, $needle) >= 0 } keys %$all;
}

# directories, the runner (or a stand-in) behind the real kernel_start.py
# and kernel.env, each step checked
sub prepare {
    my ($sh, $shell, $dir, %o) = @_;
    my $r = run_dirs($shell, $dir);
    is($r->{out}, dirs_out($dir), "$sh: $o{what}: directories made") or diag $r->{err};
    my %files = ('kernel_start.py' => slurp("$ROOT/src/remote/kernel_start.py"), %{ $o{files} });
    my ($args, $in) = ship_args($dir, (map { [$_, $files{$_}] } sort keys %files),
        ['kernel.env', env_payload($o{token}, $o{kid}, $o{idle} // 0)]);
    $r = run_script($shell, @$args, { stdin => $in });
    is($r->{rc}, 0, "$sh: $o{what}: shipped its files and kernel.env") or diag $r->{err};
}

# start: prints the pid and the kernel's uid, at once
sub start {
    my ($sh, $shell, $mode, $dir, $kid, $what) = @_;
    my $r = run_script($shell, start_args($mode, $dir, $kid));
    is($r->{rc}, 0, "$sh: $what: start exits 0") or diag $r->{err};
    like($r->{out}, qr/^\d+\n\d+\n$/, "$sh: $what: start prints the pid and the uid")
        or diag $r->{out};
    my ($pid, $uid) = $r->{out} =~ /^(\d+)\n(\d+)\n/;
    $pid //= 0;
    push @STARTED, [$pid, proc_start($pid)] if $pid > 1;
    return ($pid, $uid, $r);
}

for my $shell ('/bin/sh', '/bin/bash') {
    next unless -x $shell;
    my $sh = $shell =~ s{.*/}{}r;
    my $root = "$tmp/root-$sh";
    make_path($root);
    chmod 0755, $root;
    my $kid = new_kid();
    my $token = new_token();
    my $dir = "$root/hermes_rkernel_$kid";

    # 1. directories
    my $r = run_dirs($shell, $dir);
    is($r->{rc}, 0, "$sh: directory step exits 0") or diag $r->{err};
    is($r->{out}, dirs_out($dir), "$sh: directory step: made, three owner-only directories and the uid");
    is(mode($dir), '700', "$sh: DIR 0700 under an outer umask 022");
    is(mode("$dir/cells"), '700', "$sh: DIR/cells 0700");
    is(mode("$dir/rpc"), '700', "$sh: DIR/rpc 0700");

    # 2. the runner (a stand-in), hermes_tools.py and kernel.env in one
    #    step; a hostile payload travels byte for byte, never interpreted,
    #    and each file ends where its length says
    my $runner = standin_runner(sleep => 1.5, exit => 7);
    my $tools = "# tools\n'\$(touch $root/pwned)'\"`touch $root/pwned2`\"\0\xff\n";
    my $env = env_payload($token, $kid, 1830);
    my @ship = (['kernel_runner.py', $runner], ['hermes_tools.py', $tools], ['kernel.env', $env]);
    {
        my ($args, $in) = ship_args($dir, @ship);
        $r = run_script($shell, @$args, { stdin => $in });
    }
    is($r->{rc}, 0, "$sh: ship exits 0") or diag $r->{err};
    is(slurp("$dir/kernel_runner.py"), $runner, "$sh: runner shipped byte for byte");
    is(slurp("$dir/hermes_tools.py"), $tools, "$sh: a payload with quotes, \$(), NUL shipped byte for byte");
    is(slurp("$dir/kernel.env"), $env, "$sh: kernel.env shipped byte for byte");
    ok(!-e "$root/pwned" && !-e "$root/pwned2", "$sh: the payload was not interpreted");
    is(mode("$dir/$_"), '600', "$sh: $_ 0600 under an outer umask 022")
        for qw(kernel_runner.py hermes_tools.py kernel.env);

    # noclobber: a path there already (a planted link) fails the step and
    # nothing is written through it
    {
        my $d = "$root/hermes_rkernel_" . new_kid();
        mkdir $d, 0700 or die;
        symlink "$root/clobber-target", "$d/kernel_runner.py" or die;
        my ($args, $in) = ship_args($d, ['kernel_runner.py', "x\n"]);
        $r = run_script($shell, @$args, { stdin => $in });
        isnt($r->{rc}, 0, "$sh: shipping over an existing path fails");
        ok(!-e "$root/clobber-target", "$sh: ... and writes nothing through a link");
    }

    # a root others may write without the sticky bit: refused, nothing made
    for my $m (0777, 0775, 01777) {
        my $open = sprintf("$root/open-%o", $m);
        mkdir $open or die;
        chmod $m, $open;
        my $d = "$open/hermes_rkernel_" . new_kid();
        $r = run_dirs($shell, $d);
        if ($m == 01777) {
            is($r->{rc}, 0, "$sh: a sticky world-writable root (as /tmp) is fine");
        } else {
            is($r->{rc}, 3, sprintf("$sh: a %o root: exit 3", $m));
            like($r->{out}, qr/writable by others without the sticky bit/, "$sh: ... and why");
            ok(!-e $d, "$sh: ... nothing made");
        }
    }

    # a path that exists, whatever it is, is never taken over or changed
    for my $plant (qw(dir file symlink)) {
        my $d = "$root/hermes_rkernel_" . new_kid();
        if ($plant eq 'dir') { mkdir $d, 0755 or die }
        elsif ($plant eq 'file') { open my $f, '>', $d or die; close $f }
        else { mkdir "$d.target", 0755 or die; symlink "$d.target", $d or die }
        $r = run_dirs($shell, $d);
        is($r->{rc}, 4, "$sh: an existing $plant: exit 4");
        is($r->{out}, "EEXIST\n", "$sh: an existing $plant: EEXIST, nothing else");
        if ($plant eq 'symlink') {
            is(mode("$d.target"), '755', "$sh: the symlink's target untouched");
            ok(!-e "$d.target/cells", "$sh: nothing made through the symlink");
        } elsif ($plant eq 'dir') {
            is(mode($d), '755', "$sh: the existing dir untouched");
            ok(!-e "$d/cells", "$sh: nothing made in it");
        }
    }

    # fail-closed steps: a non-zero status, nothing made, nothing started
    my $nope = "/proc/hermes-nope-$$/hermes_rkernel_$kid";
    $r = run_dirs($shell, $nope);
    isnt($r->{rc}, 0, "$sh: directory step under an unusable root fails");
    unlike($r->{out}, qr/^made/, "$sh: and does not say it made it");
    ok(!-e "/proc/hermes-nope-$$", "$sh: nothing created");

    my $gone = "$root/hermes_rkernel_" . new_kid();
    {
        my ($args, $in) = ship_args($gone, ['kernel_runner.py', "x\n"]);
        $r = run_script($shell, @$args, { stdin => $in });
    }
    isnt($r->{rc}, 0, "$sh: shipping into a missing DIR fails");
    for my $mode (@MODES) {
        $r = run_script($shell, start_args($mode, $gone, new_kid()));
        isnt($r->{rc}, 0, "$sh: $mode: start in a missing DIR fails");
        unlike($r->{out}, qr/^\d+$/m, "$sh: $mode: and prints no pid");
    }
    ok(!-e $gone, "$sh: nothing made by failed steps");

    for my $mode (@MODES) {
        my $bw = $mode eq 'bwrap';
        my $m = "$sh, sandbox $mode";

        # 4. start: returns at once with the pid and the uid, the runner
        #    detached; a sibling of its directory it must not see
        my $mkid = new_kid();
        my $mtoken = new_token();
        my $mdir = "$root/hermes_rkernel_$mkid";
        my $child = 3000 + int(rand 900);
        my $schild = $child + 1000;
        push @SLEEPS, $child, $schild;
        prepare($m, $shell, $mdir, what => 'start', kid => $mkid, token => $mtoken, idle => 1830,
            files => { 'kernel_runner.py' => standin_runner(sleep => 60, child => $child,
                                                             $bw ? (setsid_child => $schild) : ()) });
        open my $sib, '>', "$root/sibling-$mode" or die;
        close $sib;
        my ($pid, $uid, $sr) = start($m, $shell, $mode, $mdir, $mkid, 'start');
        ok($sr->{elapsed} < 1.0, sprintf("$m: start returns (stdout closed, shell gone) while the runner runs (%.2fs)",
            $sr->{elapsed}));
        is($uid, $KUID, "$m: the uid printed is the kernel's (" . ($AS_ROOT ? 'the kernel user' : 'ours') . ')');

        # 5. ready, and what the runner was given
        ok(wait_until(sub { defined ready_pid($mdir) && -e "$mdir/standin.json" }, 10), "$m: ready written")
            or diag slurp("$mdir/runner.log");
        my $info = read_json("$mdir/standin.json") // {};
        my $hpid = host_runner($pid) // 0;
        ok($hpid, "$m: the runner runs under the printed pid");
        if ($bw) {
            # a shell that waits for bwrap: bwrap's --die-with-parent must
            # see a parent that lives as long as the kernel
            like(slurp("/proc/$pid/cmdline") // '', qr/^sh\0-c\0"\$\@"; exit \$\?\0hermes-kernel\0bwrap\0/,
                "$m: the printed pid is the shell that waits for bwrap");
            my @kids = grep { (proc_ids($_))[0] == $pid } proc_tree($pid);
            ok(@kids == 1 && (slurp("/proc/$kids[0]/cmdline") // '') =~ /^bwrap\0/,
                "$m: and bwrap is its one child, in its process group")
                && is((proc_ids($kids[0]))[1], $pid, "$m: bwrap's group is the printed pid's");
            is(ready_pid($mdir), $info->{pid}, "$m: ready holds the runner's pid (in its pid namespace)");
            ok(@{ $info->{procs} || [] } && @{ $info->{procs} } <= 3,
                "$m: its /proc shows its own processes only (@{ $info->{procs} || [] })");
            is_deeply($info->{siblings}, ["hermes_rkernel_$mkid"], "$m: the runner sees its own directory alone");
        } else {
            is($hpid, $pid, "$m: the printed pid is the runner itself (exec, no wrapper)");
            is(ready_pid($mdir), $pid, "$m: ready holds the pid the start step printed");
            is($info->{pid}, $pid, "$m: the runner says so too");
        }
        my @ids = proc_ids($pid);
        is("@ids[1, 2]", "$pid $pid", "$m: the printed pid leads its own process group and session");
        if ($bw) {
            # --new-session: the sandbox's init (pid 1) leads a session of
            # its own, the runner's, not the printed pid's
            is("$info->{pgid} $info->{sid}", '1 1', "$m: the runner is in the process group and session of its sandbox's init");
            my ($pp, $pg, $ps) = proc_ids($hpid);
            ok($ps && $ps == $pp && $pg == $pp && $ps != $pid, "$m: a new session (host: $ps), not the printed pid's ($pid)");
        } else {
            is($info->{pgid}, $info->{pid}, "$m: the runner leads its own process group");
            is($info->{sid}, $info->{pid}, "$m: and its own session (setsid)");
        }
        ok(pid_alive($pid), "$m: the runner is alive after the start command returned");
        is($info->{env_fd}, '3', "$m: the runner got HERMES_ENV_FD=3");
        ok($info->{env_fd_regular}, "$m: fd 3 is a regular file");
        is($info->{env_fd_links}, 0, "$m: kernel.env unlinked before the runner started");
        is($info->{token_len}, 64, "$m: kernel.env reached the runner: HERMES_RPC_TOKEN of 64 hex");
        is($info->{token}, $mtoken, "$m: the token is the one shipped");
        is($info->{kernel_id}, $mkid, "$m: HERMES_KERNEL_ID reached the runner");
        is($info->{idle}, '1830', "$m: HERMES_IDLE_TIMEOUT reached the runner");
        is_deeply($info->{environ_hermes}, [], "$m: no HERMES_ variable in the runner's environment but HERMES_ENV_FD");
        ok(!$info->{env_file_present}, "$m: kernel.env gone before the runner started");
        ok(!-e "$mdir/kernel.env", "$m: kernel.env gone");
        is($info->{cwd}, $mdir, "$m: the runner runs in DIR");
        is($info->{umask}, 077, "$m: the runner has umask 077");
        ok($info->{stdin_devnull}, "$m: the runner's stdin is /dev/null");
        is($info->{uid}, $KUID, "$m: the runner's uid, as it sees it");
        is(proc_uids($hpid), join(',', ($KUID) x 4), "$m: the runner's uids, as the host sees them"
            . ($AS_ROOT ? ': the kernel user, not root' : ''));
        if ($AS_ROOT) {
            is_deeply($info->{groups}, [], "$m: no supplementary groups");
            ok($info->{no_new_privs}, "$m: no new privileges");
            is((lstat $mdir)[4], $KUID, "$m: DIR handed to the kernel user");
        }
        is(mode("$mdir/ready"), '600', "$m: ready (written by the runner with 0666) is 0600");
        is(mode("$mdir/runner.log"), '600', "$m: runner.log 0600");
        is(mode("$mdir/standin.json"), '600', "$m: a file the runner makes is 0600");
        ok(wait_until(sub { (slurp("$mdir/runner.log") // '') =~ /runner stdout line\n.*runner stderr line/s }, 5),
            "$m: the runner's stdout and stderr go to runner.log");
        ok(wait_until(sub { procs_matching(qr/^sleep $child$/) }, 5), "$m: the runner's child is up");
        ok(wait_until(sub { procs_matching(qr/^sleep $schild$/) }, 5), "$m: and one in a session of its own")
            if $bw;

        # the token in no process's argv or environment; those of this
        # start (the bwrap processes, the runner) among those read
        my @tree = proc_tree($pid);
        my $environs = all_environs();
        ok(!grep({ !defined $environs->{$_} } @tree), "$m: the environment of every process of the start read (@tree)");
        like($environs->{$hpid} // '', qr/(?:^|\0)HERMES_ENV_FD=3\0/, "$m: (the runner's holds HERMES_ENV_FD=3)");
        is(join(',', environs_with($mtoken)), '', "$m: the token is in no process's environment");
        is(join(',', cmdlines_with($mtoken)), '', "$m: the token is in no process's argv");

        my @cg = $bw ? cgroup_dirs($mkid) : ();
        if ($bw && $CGROUP) {
            ok(scalar @cg, "$m: the kernel has cgroups of its own ($CGROUP: @cg)");
            like(slurp("/proc/$hpid/cgroup") // '', qr{/hermes/\Q$mkid\E$}m, "$m: the runner is in them");
        } else {
            is("@cg", '', "$m: no cgroup made (" . ($bw ? 'none this host lets us write' : 'no sandbox') . ')');
        }

        # the kill command: a pid started at another time, a directory with
        # another inode are a stranger's, left alone (with cgroups, the
        # kernel's cgroups go whatever the pid: they are named by its id)
        my $start = proc_start($pid);
        my $ino = (lstat $mdir)[1];
        unless (@cg) {
            $r = run_kill($shell, $pid, $start + 1, $ino + 1, $mdir, $mkid);
            is($r->{rc}, 0, "$m: the kill command exits 0") or diag $r->{err};
            sleep 0.2;
            ok(pid_alive($pid), "$m: kill: a pid started at another time is not signalled");
            ok(procs_matching(qr/^sleep $child$/), "$m: kill: nor its group");
            ok(-d $mdir, "$m: kill: a directory with another inode is not removed");
        }

        $r = run_kill($shell, $pid, $start, $ino, $mdir, $mkid);
        is($r->{rc}, 0, "$m: the kill command exits 0") or diag $r->{err};
        ok(wait_until(sub { !pid_alive($pid) }, 5), "$m: kill: the runner is gone");
        ok(wait_until(sub { !grep { pid_alive($_) } @tree }, 5), "$m: kill: every process of the start is gone");
        ok(wait_until(sub { !procs_matching(qr/^sleep $child$/) }, 5), "$m: kill: its child is gone");
        ok(wait_until(sub { !procs_matching(qr/^sleep $schild$/) }, 5),
            "$m: kill: and the child that left for a session of its own")
            if $bw;
        ok(!-e $mdir, "$m: kill: the directory is removed");
        is(join(' ', cgroup_dirs($mkid)), '', "$m: kill: no cgroup of the kernel left");
        ok(-e "$root/sibling-$mode", "$m: (the sibling was there all along)");

        # the same start, waited for: the command's status is the runner's
        # exit code; while it runs, the token is in no environment (the
        # outer shell's either), nothing of kernel.env in the outer shell
        my $wkid = new_kid();
        my $wtoken = new_token();
        my $wdir = "$root/hermes_rkernel_$wkid";
        prepare($m, $shell, $wdir, what => 'waited', kid => $wkid, token => $wtoken,
            files => { 'kernel_runner.py' => standin_runner(sleep => 1.5, exit => 7) });
        my $h = sh_start($shell, $WAITED, args => ['hermes', start_args($mode, $wdir, $wkid)]);
        ok(wait_until(sub { -e "$wdir/standin.json" }, 10), "$m: waited: the runner is up");
        my @wtree = proc_tree($h->{pid});
        my $wenv = all_environs();
        ok(@wtree >= ($bw ? 4 : 2) && !grep({ !defined $wenv->{$_} } @wtree),
            "$m: waited: the environment of every process of the replay read: shell, "
            . ($bw ? 'bwrap, its init, ' : '') . "runner (@wtree)");
        is(join(',', grep { index($wenv->{$_}, $wtoken) >= 0 } keys %$wenv), '',
            "$m: waited: the token is in no process's environment");
        $r = sh_finish($h, 10);
        like($r->{out}, qr/^\d+\n\d+\nrc=7\n/, "$m: waited: the runner's exit code (7) is the command's (wait \$!)")
            or diag "$r->{out}\n$r->{err}";
        ok(index($r->{out}, $wtoken) < 0, "$m: waited: the token is not in the outer shell's env or variables");
        unlike($r->{out}, qr/^HERMES_\w*=/m, "$m: waited: no HERMES_ variable in the outer shell");
        like($r->{out}, qr/--- env\n.*PATH=.*--- set\n/s, "$m: waited: (env and set did print)");
        is((read_json("$wdir/standin.json") // {})->{token}, $wtoken, "$m: waited: while the runner had it");
        # the runner is gone: its cgroups and directory
        $r = run_kill($shell, 0, 0, (lstat $wdir)[1] // 0, $wdir, $wkid);
        ok(!-e $wdir && !cgroup_dirs($wkid), "$m: waited: the kill command without a pid: directory and cgroups removed");
    }
}

# the real runner, started by the replayed commands, comes up: ready, the
# wake FIFO, the token in no environment; the kill command ends it
for my $mode (@MODES) {
    my $shell = '/bin/bash';
    my $root = "$tmp/root-real";
    make_path($root);
    chmod 0755, $root;
    my $kid = new_kid();
    my $token = new_token();
    my $dir = "$root/hermes_rkernel_$kid";
    my $m = "real runner, sandbox $mode";
    prepare($m, $shell, $dir, what => 'setup', kid => $kid, token => $token, idle => 60,
        files => { (map { $_ => slurp("$ROOT/src/remote/$_") // die "read $_" }
                    qw(kernel_runner.py hermes_tools.py)),
                   'kernel_runner.pyc' => slurp("$ROOT/build/gen/kernel_runner.pyc") // die 'no .pyc' });
    my ($pid, $uid) = start($m, $shell, $mode, $dir, $kid, 'start');
    ok(wait_until(sub { defined ready_pid($dir) }, 10), "$m: ready")
        or diag slurp("$dir/runner.log");
    is(ready_pid($dir), $pid, "$m: ready holds the printed pid") if $mode eq 'off';
    my $hpid = host_runner($pid) // 0;
    ok($hpid, "$m: the runner runs under the printed pid");
    is(proc_uids($hpid), join(',', ($KUID) x 4), "$m: the runner runs as " . ($AS_ROOT ? 'the kernel user' : 'us'));
    ok(-p "$dir/wake", "$m: wake FIFO");
    is(mode("$dir/wake"), '600', "$m: wake 0600");
    ok(!-e "$dir/kernel.env", "$m: kernel.env gone");
    is(join(',', environs_with($token)), '', "$m: the token is in no process's environment");
    is(join(',', cmdlines_with($token)), '', "$m: the token is in no process's argv");
    my @tree = proc_tree($pid);
    my $r = run_kill($shell, $pid, proc_start($pid), (lstat $dir)[1], $dir, $kid);
    is($r->{rc}, 0, "$m: the kill command exits 0");
    ok(wait_until(sub { !grep { pid_alive($_) } @tree }, 5), "$m: killed, all of it");
    ok(!-e $dir, "$m: its directory removed");
    is(join(' ', cgroup_dirs($kid)), '', "$m: no cgroup of it left");
}

# what a failed test left: the processes it started, their cgroups
END {
    for my $s (@STARTED) {
        my ($pid, $start) = @$s;
        next unless $start && proc_start($pid) eq $start;
        kill_group($pid);
        kill 'KILL', $pid;
    }
    for my $n (@SLEEPS) {
        kill 'KILL', procs_matching(qr/^sleep $n$/);
    }
    for my $kid (@KIDS) {
        for my $d (cgroup_dirs($kid)) {
            wait_until(sub { rmdir $d }, 2);
        }
    }
}

sub slurp {
    my ($f) = @_;
    open my $fh, '<:raw', $f or return undef;
    local $/;
    my $c = <$fh>;
    return $c // '';
}

done_testing;
