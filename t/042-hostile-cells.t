#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A cell's code is an adversary with the kernel's uid: it replaces the
# files of its own kernel dir with FIFOs, symlinks, directories and huge
# sparse files.  The worker never blocks on one (one worker: a status
# request answered meanwhile proves it), never reads more than its bound,
# and a cell is never shipped into a directory that is no longer its
# kernel's.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use JSON::PP ();
use POSIX ();
use Time::HiRes qw(time sleep);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 20s;

        location = /x {
            hermes_execute;
            hermes_max_stream 64k;
        }

        location = /big {
            hermes_execute;
            hermes_max_stream 64m;
        }

        location = /status { hermes_status; }
    }
CONF
$t->run;

my ($worker) = $t->worker_pids;

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

# a status request on another connection, answered while the cell runs
sub status_ms {
    my $t0 = time;
    my $r = $t->http(GET => '/status', timeout => 5);
    return ($r->{status} // 0) == 200 ? (time - $t0) * 1000 : 99999;
}

for my $case (['cell_out', "plant('cell_out_' + n, 'fifo')\ntime.sleep(3)"],
              ['cell_res', "plant('cell_res_' + n + '.json', 'fifo')\ntime.sleep(3)"])
{
    my ($what, $code) = @$case;
    my $a = $t->execute_async('/x', {session => "fifo-$what", code => "$ME$code"});
    sleep 1;
    my $ms = status_ms();
    ok($ms < 1000, sprintf("$what replaced by a FIFO: the worker answers a status request meanwhile (%.0f ms)", $ms));
    my $r = $a->wait(15);
    ok($r->{result}, "$what FIFO: the cell ends, with a result line");
    # the module may hold cell_out open from before the swap; a result
    # that is a FIFO is opened when its rename is seen, and refused
    is($r->{result}{status}, 'error', "$what FIFO: status error")
        or diag explain $r->{result} if $what eq 'cell_res';
}
like($t->error_log, qr/is not a regular file|unreadable result/, 'error.log says why');

# the next cell's request name taken by a FIFO, a directory, a symlink:
# 502 ship_failed, the kernel gone, state_lost next, the target untouched.
# A request goes as a file when it is too large for the wake FIFO
# (PIPE_BUF): the next cell's is, by a comment.
my $big = "\n#" . ('p' x 5000);
for my $kind (qw(fifo dir symlink)) {
    my $s = "plant-$kind";
    my $target = "$p/target-$kind";
    open my $f, '>', $target or die; print $f "keep\n"; close $f;
    my $plant = $kind eq 'symlink'
        ? "os.symlink('$target', 'cells/cell_req_%06d.json.tmp' % (int(n) + 1))"
        : "plant('cell_req_%06d.json.tmp' % (int(n) + 1), '$kind')";
    my $r = $t->execute('/x', {session => $s, code => "$ME$plant\nx = 1"});
    is($r->{result}{status}, 'success', "$kind at the next request's tmp name: planted");
    my $kid = $r->{events}[0]{kernel_id};

    my $a = $t->execute_async('/x', {session => $s, code => "print(x)$big"});
    sleep 1;
    my $ms = status_ms();
    ok($ms < 1000, sprintf("$kind: the worker is not blocked (%.0f ms)", $ms));
    $r = $a->wait(15);
    is($r->{status}, 502, "$kind: 502");
    is($r->{json}{error}{code}, 'ship_failed', "$kind: ship_failed");
    ok(wait_until(sub { !-e $t->kroot . "/hermes_rkernel_$kid" }, 5), "$kind: the kernel is gone");
    is(do { local $/; open my $g, '<', $target; <$g> }, "keep\n", "$kind: the target is untouched");

    $r = $t->execute('/x', {session => $s, code => 'print(1)'});
    is($r->{result}{status}, 'success', "$kind: the next cell runs");
    ok($r->{events}[0]{state_lost}, "$kind: ... on a new kernel, state_lost");
}

# a 300 MB sparse cell_out: the worker reads no more than its bound
{
    my $rss0 = rss($worker);
    my $r = $t->execute('/x', {session => 'sparse', code => $ME
        . "print('before', flush=True)\n"
        . "os.truncate('cells/cell_out_' + n, 300 * 2**20)\n"
        . "print('after', flush=True)\ntime.sleep(0.5)"}, timeout => 30);
    my $bytes = length($r->{raw} // '');
    diag substr($r->{raw} // '', -600) unless $r->{result};
    ok($bytes < 1024 * 1024, "300 MB sparse cell_out: the client got $bytes bytes, not 300 MB");
    is($r->{result}{status}, 'success', '... and the result');
    ok($r->{result}{stream_truncated}, '... which says the stream was cut');
    my $grew = rss($worker) - $rss0;
    ok($grew < 32 * 1024, "... the worker grew by $grew kB");
}

# a slow client: the worker holds a few chunks, not the cell's output
{
    my $rss0 = rss($worker);
    my $body = JSON::PP->new->encode({session => 'slow', code =>
        "import sys\nfor i in range(400):\n"
        . "    sys.stdout.write(('%05d ' % i) + 'x' * 49994 + '\\n')\n"
        . "sys.stdout.flush()"});
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0))
        or die "connect: $!";
    setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 16384);
    print $c "POST /big HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        . "Content-Length: " . length($body) . "\r\nConnection: close\r\n\r\n$body";
    sleep 4;    # the cell wrote 20 MB by now; we read nothing
    my $peak = rss($worker) - $rss0;
    ok($peak < 8 * 1024, "slow client: the worker grew by $peak kB while 20 MB waited");
    my $raw = '';
    while (1) {
        my $n = sysread($c, my $buf, 1 << 20);
        last unless $n;
        $raw .= $buf;
    }
    my ($stream) = split /"type":"result"/, $raw;
    my @seen = $stream =~ /(\d{5}) x/g;
    is(scalar @seen, 400, 'slow client: every line arrives, once');
    is(join(',', @seen), join(',', map { sprintf '%05d', $_ } 0 .. 399), '... in order');
    like($raw, qr/"type":"result","status":"success"/, '... then the result');
}

# a slow client that then leaves, while its cell's output waits: the cell
# is let go of all the same (no fd of its files stays open in the worker;
# the worker keeps its verified handles on each kernel for the next cell:
# a pidfd, the wake FIFO, the kernel dir, cells/ and rpc/, five fds a
# kernel)
sub cell_fds {
    return scalar grep { (readlink($_) // '') =~ m{/cells/cell_} }
        glob("/proc/$worker/fd/*");
}
{
    my $fds0 = () = glob("/proc/$worker/fd/*");
    for my $i (1 .. 4) {
        my $body = JSON::PP->new->encode({session => "leave-$i", code =>
            "import sys\nsys.stdout.write(('y' * 99 + '\\n') * 100000)\nsys.stdout.flush()"});
        my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0))
            or die "connect: $!";
        setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 4096);
        print $c "POST /big HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            . "Content-Length: " . length($body) . "\r\n\r\n$body";
        sleep 1.5;      # the cell is over, its output waits for us
        close $c;
    }
    my ($fds, $cells);
    ok(wait_until(sub { $fds = () = glob("/proc/$worker/fd/*"); $cells = cell_fds();
                        $cells == 0 && $fds <= $fds0 + 1 + 4 * 5 }, 5),
        "slow clients that leave: the worker holds no fd of their cells ($fds0 before, "
        . ($fds // '?') . " after, " . ($cells // '?') . " of cell files)");
    my $r = $t->execute('/big', {session => 'leave-1', code => 'print("again")'});
    is($r->{result}{output}, "again\n", '... and their kernels take the next cell');
}

# a kernel whose runner is gone and whose directory a co-tenant made
# again, with a reader on the wake FIFO: the cell goes to a new kernel,
# nothing is shipped into the co-tenant's directory
{
    my $r = $t->execute('/x', {session => 'stale', code => 'y = 5'});
    my $kid = $r->{events}[0]{kernel_id};
    my $dir = $t->kroot . "/hermes_rkernel_$kid";
    my $pid = runner_pid($kid);
    ok($pid, 'stale: the runner runs');
    kill 'KILL', $pid;
    ok(wait_until(sub { !pid_alive($pid) }, 5), 'stale: the runner is gone');
    # made anew (the old one kept until then: another inode)
    rename $dir, "$dir.old" or die;
    mkdir $dir, 0700;
    system('rm', '-rf', "$dir.old"); mkdir "$dir/cells", 0700; mkdir "$dir/rpc", 0700;
    system('mkfifo', '-m', '600', "$dir/wake");
    # the co-tenant keeps what it is sent, outside the directory: the
    # FIFO's bytes (a request comes inline there) and the files
    my $cap = "$p/captured";
    mkdir $cap;
    my $holder = fork // die;
    if (!$holder) {
        open my $w, '+<', "$dir/wake" or POSIX::_exit(1);
        while (sysread($w, my $b, 4096)) {
            open my $k, '>>', "$cap/wake-bytes" or POSIX::_exit(1);
            print $k $b;
            close $k;
            system("cp -r '$dir/cells/.' '$cap/' 2>/dev/null");
        }
        POSIX::_exit(0);
    }
    sleep 0.3;
    $r = $t->execute('/x', {session => 'stale', code => 'print("secret")'});
    sleep 0.3;
    kill 'KILL', $holder;
    waitpid $holder, 0;
    opendir(my $dh, $cap) or die "opendir $cap: $!";
    my @got = grep { !/^\.\.?$/ } readdir $dh;
    is("@got", '', 'stale: nothing shipped into the directory made again');
    is($r->{result}{status}, 'success', 'stale: the cell ran');
    isnt($r->{events}[0]{kernel_id}, $kid, '... on a new kernel');
    ok($r->{events}[0]{state_lost}, '... which says the state is lost');
    ok(-d $dir, "stale: the co-tenant's directory is left alone");
}

# a cell that widens the umask: the next cell's files, and the runner's
# own, are owner-only all the same (the runner resets it before each cell)
{
    my $r = $t->execute('/x', {session => 'umask', code => "import os\nos.umask(0)\nopen('wide', 'w').write('x')"});
    my $kid = $r->{events}[0]{kernel_id};
    my ($d) = grep { /$kid$/ } $t->kroot_dirs;
    $r = $t->execute('/x', {session => 'umask', code => "open('next', 'w').write('x')\nprint('ok')"});
    is($r->{result}{output}, "ok\n", 'umask: the next cell ran');
    is(sprintf('%o', (stat "$d/next")[2] & 0777), '600', "umask: the next cell's file is 0600");
    my @open = grep { ((stat $_)[2] & 0077) } glob("$d/cells/*");
    is("@open", '', "umask: the runner's files of that cell are owner-only");
}

# kB of resident memory
sub rss {
    open my $f, '<', "/proc/$_[0]/status" or return 0;
    while (<$f>) { return $1 if /^VmRSS:\s+(\d+)/ }
    return 0;
}

$t->stop;
done_testing;
