#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The ssh backend's kernel-host agent against a cell (same uid as the
# kernel) and a co-tenant on the kernel host: nothing the module runs comes
# from the kernel directory; a cell is shipped only into its own kernel's
# directory while that kernel's process runs; the agent opens a cell's
# files without following links, without blocking on FIFOs and bounded;
# the request is written as a new file only; a full disk keeps the kernel;
# only whole lines are forwarded while the cell runs.

use strict;
use warnings;

use Test::More;
use JSON::PP ();
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

my $t = Hermes::Test->new(error_log_level => 'info', workers => 1);
my $p = $t->prefix;

my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5), record => 1);
$s->start;

# a small disk of its own for the disk-full case (root only)
my $FULL = "$p/full";
mkdir $FULL, 0700;
my $full_ok = system("mount -t tmpfs -o size=4m,mode=0711 tmpfs '$FULL' "
                     . ">/dev/null 2>&1") == 0;
END { system("umount -l '$FULL' >/dev/null 2>&1") if $full_ok }

my $ssh = "host=127.0.0.1:" . $s->port . " known_hosts=" . $s->known_hosts
    . " user=root identity=" . $s->identity . " connect_timeout=3s";
$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 10s;
        hermes_max_output 64k;
        hermes_max_stream 64k;

        location = /x {
            hermes_execute;
            hermes_backend ssh $ssh root=%%KROOT%%;
            # the agent against a cell that reaches the kernel user's files
            # outside its directory, as it does without a sandbox
            hermes_sandbox off;
        }

        location = /full {
            hermes_execute;
            hermes_backend ssh $ssh root=$FULL;
        }

        location = /big {
            hermes_execute;
            hermes_backend ssh $ssh root=%%KROOT%%;
            hermes_max_stream 64m;
        }

        location = /short {
            hermes_execute;
            hermes_backend ssh $ssh root=%%KROOT%%;
            hermes_cell_timeout 2s grace=3s;
        }

        location /k {
            hermes_kernels;
        }

        location = /status { hermes_status; }
    }
CONF
$t->run;

sub dir_of { $t->kroot . "/hermes_rkernel_$_[0]" }

sub kid_of { ((($_[0] // {})->{result} // {})->{kernel} // {})->{kernel_id} // '' }

sub slurp {
    open my $fh, '<', $_[0] or return undef;
    local $/;
    return scalar <$fh>;
}

sub stdout_of {
    my ($r) = @_;
    return join '', map { $_->{text} // '' }
        grep { ($_->{type} // '') eq 'stdout' } @{ $r->{events} };
}

# the cell's own id: one after the last cell's result, which cells/ keeps
# while the next cell runs (its request may have come inline, through the
# wake FIFO, and its output file is made only at its first line)
my $ME = <<'PY';
import glob, os, time
r = sorted(glob.glob('cells/cell_res_*.json'))   # the last cell's: this id - 1
n = '%06d' % (int(r[-1].split('_')[-1].split('.')[0]) + 1 if r else 1)
def plant(name, kind):
    tmp = 'cells/.plant'
    if kind == 'fifo':
        os.mkfifo(tmp, 0o600)
    elif kind == 'dir':
        os.mkdir(tmp, 0o700)
    os.rename(tmp, 'cells/' + name)
PY

###############################################################################
# a cell writes hermes_agent.py into its kernel dir: nothing runs it, the
# agent comes from the module's own copy

{
    my $mark = "$p/agent-ran";
    my $r = $t->execute('/x', { session => 'rewrite', code =>
        "x = 3\nopen('hermes_agent.py', 'w').write("
        . "\"open('$mark', 'w').write('ran')\\n\")" });
    is(($r->{result} // {})->{status}, 'success', 'agent rewrite: the cell ran');
    my $kid = kid_of($r);
    my $n0 = () = $s->commands;
    $r = $t->execute('/x', { session => 'rewrite', code => 'print(x)' });
    ok(!-e $mark, "agent rewrite: the cell's hermes_agent.py was not run");
    is(($r->{result} // {})->{output}, "3\n", 'agent rewrite: the next cell ran, state kept')
        or diag explain $r->{result} // $r;
    is(kid_of($r), $kid, 'agent rewrite: on the same kernel');
    my @sent = ($s->commands)[$n0 .. (() = $s->commands) - 1];
    is(join("\n", grep { index($_, dir_of($kid) . '/') >= 0 && /python3/ } @sent), '',
        'no command runs a file of the kernel dir for a cell');
    like(join("\n", $s->commands), qr/^exec python3 -I -c .*hermes_agent\.py/m,
        'the agent runs under python3 -I');
}

###############################################################################
# cell_res planted as a FIFO: the agent is not stuck on it, the cell ends
# at once with status error

{
    my $t0 = time;
    my $r = $t->execute('/x', { session => 'fifo-res', code =>
        "${ME}plant('cell_res_' + n + '.json', 'fifo')\ntime.sleep(6)" },
        timeout => 20);
    my $took = time - $t0;
    is(($r->{result} // {})->{status}, 'error', 'cell_res FIFO: status error')
        or diag explain $r->{result} // $r;
    is(($r->{result} // {})->{error}, 'the kernel wrote an unreadable result',
        'cell_res FIFO: the error says why');
    ok($took < 5, sprintf('cell_res FIFO: answered in %.2fs, not at the timeout', $took));
}

# a result bigger than the module's bound (6 * max_output + 64k) is not
# read, even when it is well-formed
{
    my $r = $t->execute('/x', { session => 'big-res', code => $ME
        . "import json\nd = json.dumps({'id': int(n), 'status': 'success',"
        . " 'output': 'y' * 500000, 'error': None, 'execution_count': 1})\n"
        . "open('cells/.big', 'w').write(d)\n"
        . "os.rename('cells/.big', 'cells/cell_res_' + n + '.json')\ntime.sleep(6)" },
        timeout => 20);
    is(($r->{result} // {})->{status}, 'error', 'a 500 kB result: status error')
        or diag explain { %{ $r->{result} // {} }, output => '...' };
    is(($r->{result} // {})->{error}, 'the kernel wrote an unreadable result',
        'a 500 kB result: unreadable');
}

# a 300 MB sparse cell_out: the agent reads no more than the module's bound
{
    my $t0 = time;
    my $r = $t->execute('/x', { session => 'sparse', code => $ME
        . "print('before', flush=True)\n"
        . "os.truncate('cells/cell_out_' + n, 300 * 2**20)\n"
        . "time.sleep(0.5)" }, timeout => 30);
    my $took = time - $t0;
    my $bytes = length($r->{raw} // '');
    ok($bytes < 1024 * 1024, "300 MB sparse cell_out: the client got $bytes bytes");
    is(($r->{result} // {})->{status}, 'success', '300 MB sparse cell_out: the result')
        or diag explain $r->{result} // substr($r->{raw} // '', -300);
    ok(($r->{result} // {})->{stream_truncated}, '... which says the stream was cut');
    is(stdout_of($r), "before\n", '... and the whole lines before it');
    ok($took < 4, sprintf('300 MB sparse cell_out: answered in %.2fs', $took));
}

###############################################################################
# interrupts over ssh: the timeout's, and an agent's

{
    my $r = $t->execute('/short', { session => 'intr', code => 'kept = 7' });
    my $kid = kid_of($r);
    my $t0 = time;
    $r = $t->execute('/short', { session => 'intr',
        code => "import time\nprint('zzz', flush=True)\nkept = 8\ntime.sleep(60)" }, timeout => 20);
    my $took = time - $t0;
    is(($r->{result} // {})->{status}, 'timeout', 'ssh: a cell past its timeout is interrupted');
    like(($r->{result} // {})->{error} // '', qr/was interrupted; the kernel and its state are kept/,
        '... and says so');
    ok($took < 4.5, sprintf('... within its timeout and grace (%.2fs)', $took));
    $r = $t->execute('/short', { session => 'intr', code => 'print(kept)' });
    is(stdout_of($r), "8\n", '... the kernel kept its state');
    is(kid_of($r), $kid, '... the same kernel');

    # killed after the grace: the result still has what the cell printed
    $r = $t->execute('/short', { session => 'intr3',
        code => "import time\nprint('kept output', flush=True)\n"
              . "while True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass" },
        json => 1, timeout => 20);
    is(($r->{json} // {})->{status}, 'timeout', 'ssh: a cell that ignores its interrupt is killed');
    like(($r->{json} // {})->{output} // '', qr/^kept output\n/, '... its JSON result keeps what it printed');

    my $a = $t->execute_async('/x', { session => 'intr2',
        code => "import time\nprint('on', flush=True)\ntime.sleep(30)" });
    sleep 1.5;
    my $c0 = () = $s->commands;
    my $x = $t->http(POST => '/k/intr2/interrupt');
    is($x->{status}, 202, 'ssh: POST SESSION/interrupt: 202');
    $r = $a->wait(15);
    is(($r->{result} // {})->{status}, 'interrupted', '... the cell answers "interrupted"');
    is(scalar(() = $s->commands), $c0, '... by a frame to the agent: no command ran');

    # a burst of interrupts of one cell: frames, never a command (a
    # python3 and a pool slot) each
    my $b = $t->execute_async('/x', { session => 'intr4',
        code => "import time\nprint('on', flush=True)\nn = 0\nwhile n < 200:\n"
              . "    try:\n        time.sleep(30)\n    except KeyboardInterrupt:\n        n += 1" },
        timeout => 40);
    ok(wait_until(sub { $t->http(GET => '/k/intr4')->{status} == 200 }, 10), 'ssh: a cell that takes interrupts runs');
    sleep 1;
    my $n0 = () = $s->commands;
    my $ok = 0;
    for (1 .. 60) {
        $ok++ if $t->http(POST => '/k/intr4/interrupt')->{status} == 202;
    }
    is($ok, 60, 'ssh: 60 interrupts in a row: 202 each');
    sleep 1;
    my @sent = ($s->commands)[$n0 .. (() = $s->commands) - 1];
    is(scalar(@sent), 0, '... and no command on the host for any of them')
        or diag explain \@sent;
    # meanwhile a new session on the host starts as fast as ever
    $r = $t->execute('/x', { session => 'intr5', code => 'print(5)' });
    is(stdout_of($r), "5\n", '... a new session beside them runs');
    $t->http(DELETE => '/k/intr4?force=1');
    $b->wait(15);
}

###############################################################################
# the agent ships nothing into a kernel dir that is not owner-only: a dir
# at 0750 or cells/ at 0755 (another user could read or plant there) is a
# dead kernel, its cell never written there

for my $c (['', 0750, 'the kernel dir at 0750'], ['cells', 0755, 'cells/ at 0755']) {
    my ($sub, $mode, $what) = @$c;
    my $sess = "mode-" . ($sub || 'dir');
    my $r = $t->execute('/x', { session => $sess, code => 'x = 1' });
    my $kid = kid_of($r);
    my $d = dir_of($kid);
    chmod $mode, $sub ? "$d/$sub" : $d or die "chmod: $!";
    $r = $t->execute('/x', { session => $sess, code => "print(globals().get('x'))" });
    isnt(kid_of($r), $kid, "$what: the kernel is taken for dead");
    is(stdout_of($r), "None\n", "$what: the cell ran in a new kernel, no state carried");
    ok(!-e "$d/cells/cell_req_000002.json" && !-e "$d/cells/cell_out_000002",
        "$what: nothing of the cell shipped into the old dir");
}

###############################################################################
# a slow client that leaves while its stream waits for it: the cell is not
# taken for timed out (the kernel, and its state, stay)

{
    my $r = $t->execute('/big', { session => 'slow', code => 'kept = 5' });
    my $kid = kid_of($r);
    my $body = JSON::PP->new->encode({ session => 'slow', code =>
        "import sys\nsys.stdout.write(('z' * 99 + '\\n') * 300000)\nsys.stdout.flush()" });
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0))
        or die "connect: $!";
    setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 4096);
    print $c "POST /big HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        . "Content-Length: " . length($body) . "\r\n\r\n$body";
    sleep 2;
    close $c;
    sleep 1;
    $r = $t->execute('/big', { session => 'slow', code => 'print(kept)' }, timeout => 20);
    is(stdout_of($r), "5\n", 'a slow client that left: the kernel kept its state');
    is(kid_of($r), $kid, '... the same kernel');
}

###############################################################################
# the next request's tmp name planted: a FIFO, a directory, a hard link to
# a file of the user, a symlink.  502 ship_failed, the kernel gone,
# state_lost next, the target untouched

for my $kind (qw(fifo dir hardlink symlink)) {
    my $sess = "plant-$kind";
    my $target = "$p/target-$kind";
    open my $f, '>', $target or die; print $f "keep\n"; close $f;
    # a file of the kernel's own user (a root spawn runs it as another)
    if ($> == 0) {
        my ($uid, $gid) = (getpwnam('hermes-kernel'))[2, 3];
        ($uid, $gid) = (getpwnam('nobody'))[2, 3] unless defined $uid;
        chown $uid, $gid, $target;
    }
    my $tmp = "'cells/cell_req_%06d.json.tmp' % (int(n) + 1)";
    my $plant = $kind eq 'symlink' ? "os.symlink('$target', $tmp)"
              : $kind eq 'hardlink' ? "os.link('$target', $tmp)"
              : "plant('cell_req_%06d.json.tmp' % (int(n) + 1), '$kind')";
    my $r = $t->execute('/x', { session => $sess, code => "$ME$plant\nx = 1" });
    is(($r->{result} // {})->{status}, 'success', "$kind at the next request's tmp name: planted")
        or diag explain $r->{result} // $r;
    my $kid = kid_of($r);

    # a request too large for the wake FIFO: a file
    my $t0 = time;
    $r = $t->execute('/x', { session => $sess, code => "print(x)\n#" . ('p' x 5000) },
        timeout => 20);
    my $took = time - $t0;
    is($r->{status}, 502, "$kind: 502") or diag explain $r->{result} // $r->{json};
    is((($r->{json} // {})->{error} // {})->{code}, 'ship_failed', "$kind: ship_failed");
    ok($took < 5, sprintf("$kind: answered in %.2fs", $took));
    ok(wait_until(sub { !-e dir_of($kid) }, 5), "$kind: the kernel is gone");
    is(slurp($target), "keep\n", "$kind: the target is untouched");

    $r = $t->execute('/x', { session => $sess, code => 'print(1)' });
    is(($r->{result} // {})->{status}, 'success', "$kind: the next cell runs");
    ok((($r->{result} // {})->{kernel} // {})->{state_lost}, "$kind: ... on a new kernel, state_lost");
}

###############################################################################
# a co-tenant makes the kernel's directory again, with a reader on its wake
# FIFO: while the runner still runs (the path now names another directory),
# and after it died with its pid taken by the co-tenant's reader

sub recreate {
    my ($dir) = @_;
    rename $dir, "$dir.old" or die "rename $dir: $!";
    mkdir $dir, 0700 or die;
    mkdir "$dir/cells", 0700;
    mkdir "$dir/rpc", 0700;
    system('mkfifo', '-m', '600', "$dir/wake") == 0 or die;
}

# a child holding $dir/wake open for reading, with pid $want if asked
sub reader {
    my ($dir, $want) = @_;
    for (1 .. ($want ? 500 : 1)) {
        if ($want) {
            open my $l, '>', '/proc/sys/kernel/ns_last_pid' or return undef;
            print $l $want - 1;
            close $l or return undef;
        }
        my $pid = fork // die;
        if (!$pid) {
            POSIX::_exit(0) if $want && $$ != $want;
            open my $w, '+<', "$dir/wake";
            sleep 30;
            POSIX::_exit(0);
        }
        return $pid if !$want || $pid == $want;
        waitpid $pid, 0;
    }
    return undef;
}

for my $case ('runner alive', 'runner dead, its pid reused') {
    my $sess = $case =~ /dead/ ? 'stale-dead' : 'stale-alive';
    my $r = $t->execute('/x', { session => $sess, code => 'y = 5' });
    my $kid = kid_of($r);
    my $dir = dir_of($kid);
    my $pid = runner_pid($kid);
    ok($pid, "$case: the runner runs");
    if ($case =~ /dead/) {
        kill_group($pid);
        ok(wait_until(sub { !-e "/proc/$pid" }, 5), "$case: the runner is gone");
    }
    recreate($dir);
    my $holder = reader($dir, $case =~ /dead/ ? $pid : undef);
    SKIP: {
        skip "$case: could not get pid $pid again", 6 unless $holder;
        sleep 0.2;
        $r = $t->execute('/x', { session => $sess, code => 'print("secret")' }, timeout => 20);
        opendir my $dh, "$dir/cells";
        my @got = grep { /cell_req/ } readdir $dh;
        # a small request would come inline, into the FIFO
        sysopen my $fifo, "$dir/wake", POSIX::O_RDONLY() | POSIX::O_NONBLOCK();
        sysread($fifo, my $sent, 65536) if $fifo;
        push @got, "wake: $sent" if length($sent // '');
        is("@got", '', "$case: nothing shipped into the directory made again");
        is(($r->{result} // {})->{status}, 'success', "$case: the cell ran")
            or diag explain $r->{result} // $r;
        isnt(kid_of($r), $kid, "$case: ... on a new kernel");
        ok((($r->{result} // {})->{kernel} // {})->{state_lost}, "$case: ... which says the state is lost");
        ok(-d $dir && -p "$dir/wake", "$case: the co-tenant's directory is left alone");
        ok(pid_alive($holder), "$case: the co-tenant's process is left alone");
        kill 'KILL', $holder;
        waitpid $holder, 0;
    }
    if ($case =~ /alive/) {
        ok(wait_until(sub { !pid_alive($pid) }, 5), "$case: the old runner is killed");
    }
    system('rm', '-rf', $dir, "$dir.old");
}

###############################################################################
# the kernel's half-written line (the runner drops it again when its write
# fails half-way, as on a full disk) never reaches the stream

{
    my $r = $t->execute('/x', { session => 'half', code => $ME
        . "print('one', flush=True)\n"
        . "f = os.open('cells/cell_out_' + n, os.O_WRONLY | os.O_APPEND)\n"
        . "size = os.fstat(f).st_size\n"
        . "os.write(f, b'{\"type\":\"stdout\",\"text\":\"HA')\n"
        . "time.sleep(0.5)\nos.ftruncate(f, size)\nos.close(f)\n"
        . "print('two', flush=True)\ntime.sleep(0.2)" });
    is(($r->{result} // {})->{status}, 'success', 'half a line: the cell ran');
    is(stdout_of($r), "one\ntwo\n", 'half a line: the stream has whole lines only')
        or diag $r->{raw};
    unlike($r->{raw} // '', qr/HA/, '... and not the dropped half');
}

###############################################################################
# the kernel host's disk is full when the cell is shipped: 503 disk_full,
# the kernel and its state kept (a request too large for the wake FIFO: a
# small one goes inline and runs, its result into the reserve)

SKIP: {
    skip 'cannot mount a tmpfs (needs root)', 7 unless $full_ok;
    my $r = $t->execute('/full', { session => 'full', code => 'z = 11' });
    is(($r->{result} // {})->{status}, 'success', 'a kernel on a small disk');
    my $kid = kid_of($r);
    {
        open my $f, '>', "$FULL/fill" or die;
        my $chunk = "\0" x 65536;
        1 while syswrite $f, $chunk;
        close $f;
    }
    $r = $t->execute('/full', { session => 'full', code => "print(z)\n#" . ('p' x 5000) },
        timeout => 20);
    is($r->{status}, 503, 'disk full: 503') or diag $r->{content};
    is((($r->{json} // {})->{error} // {})->{code}, 'disk_full', 'disk full: disk_full');
    ok(-d "$FULL/hermes_rkernel_$kid" && runner_pid($kid), 'disk full: the kernel is kept');
    unlink "$FULL/fill";
    $r = $t->execute('/full', { session => 'full', code => 'print(z)' });
    is(($r->{result} // {})->{output}, "11\n", 'space again: the next cell runs, state kept')
        or diag explain $r->{result} // $r;
    is(kid_of($r), $kid, '... on the same kernel');
    ok(!(($r->{result} // {})->{kernel} // {})->{state_lost}, '... state not lost');
}

$t->stop;
$t->kill_strays;
$s->stop;
done_testing;
