#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The registry over time: idle kernels are reaped (never a running one), a
# worker killed mid-cell or while its cell waits in the queue leaves no mark
# that pins its kernel, reload keeps kernels and lets a streaming cell
# finish, a full zone answers 503.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);
use IO::Socket::INET;
use JSON::PP ();

use Hermes::Test;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m idle_timeout=2s sweep=300ms;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_cell_timeout 60s;
        }

        location /v1/kernels {
            hermes_kernels;
        }

        location = /v1/status {
            hermes_status;
        }
    }
CONF
$t->{allow_log_re} = qr/worker process \d+ exited on signal 9/;
$t->run;

sub run_cell { my ($s, $code, %o) = @_; $t->execute('/v1/execute', { session => $s, code => $code }, %o) }
sub status { $t->http('GET', '/v1/status')->{json} }

# --- idle reap: process and directory gone; a long cell is never reaped

my $k = run_cell('idle', "x = 1")->{result}{kernel}{kernel_id};
my $pid = runner_pid($k);
my $dir = $t->kroot . "/hermes_rkernel_$k";
ok(pid_alive($pid) && -d $dir, 'kernel up');

my $r = run_cell('busy', "import time\ny = 7\ntime.sleep(3.5)\nprint(y)");
is($r->{result}{output}, "7\n", 'a cell longer than idle_timeout ran to its end');

ok(wait_until(sub { !pid_alive($pid) }, 3), 'the idle kernel was reaped');
ok(wait_until(sub { !-d $dir }, 3), 'its directory removed');
ok(status()->{evictions_total}{idle} >= 1, 'evictions_total{idle} counted');

$r = run_cell('busy', "print(y)");
is($r->{result}{output}, "7\n", 'the busy kernel kept its state (the idle clock restarts at its end)');
is($r->{result}{kernel}{reused}, JSON::PP::true, 'same kernel');

# --- kill -9 of the worker running a cell: reclaimed after a sweep

run_cell('orphan', "z = 'kept'");

# the worker holding our connection, from its socket inode
sub worker_of_client {
    my $port = $t->port(0);
    my %inode;
    open my $tcp, '<', '/proc/net/tcp' or return;
    while (<$tcp>) {
        my @f = split;
        next unless $f[1] && $f[1] =~ /:([0-9A-F]{4})$/ && hex($1) == $port && $f[3] eq '01';
        $inode{$f[9]} = 1;
    }
    for my $w ($t->worker_pids) {
        for my $fd (glob "/proc/$w/fd/*") {
            my $l = readlink($fd) // next;
            return $w if $l =~ /^socket:\[(\d+)\]$/ && $inode{$1};
        }
    }
    return;
}

my $killed;
$r = $t->execute('/v1/execute', { session => 'orphan',
    code => "import time\nprint('in', flush=True)\ntime.sleep(1)\nz = 'after'" },
    on_event => sub {
        my ($e) = @_;
        return undef unless $e->{type} eq 'stdout';
        $killed = worker_of_client();
        kill 'KILL', $killed if $killed;
        return ABORT_STREAM;
    });
ok($killed, "killed worker $killed mid-cell");
ok(wait_until(sub { scalar($t->worker_pids) == 2 && !grep { $_ == $killed } $t->worker_pids }, 5),
    'the master started a new worker');

my $t0 = time;
$r = run_cell('orphan', "print(z)", timeout => 15);
is($r->{result}{status}, 'success', 'the kernel takes cells again');
is($r->{result}{output}, "after\n", 'after the orphaned cell finished on it');
ok(time - $t0 < 5, sprintf('reclaimed in %.1fs', time - $t0));
like($t->error_log, qr/worker \d+ died holding kernel/, 'the reclaim is logged');

# --- kill -9 of a worker whose cell waits in the queue (not running): its
#     place in the queue is given up by the sweep

# an execute on a connection of our own, to learn which worker holds it
sub raw_connect {
    return IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0))
        // die "connect: $!";
}

sub raw_execute {
    my ($c, $session, $code) = @_;
    my $body = JSON::PP->new->encode({ session => $session, code => $code });
    print $c "POST /v1/execute HTTP/1.1\r\nHost: localhost\r\n"
        . "Content-Type: application/json\r\nAccept: application/json\r\n"
        . "Content-Length: " . length($body) . "\r\nConnection: close\r\n\r\n$body";
    $c->flush;
    return $c;
}

sub worker_of_conn {
    my ($c) = @_;
    my ($port, $cport) = ($t->port(0), $c->sockport);
    my $inode;
    open my $tcp, '<', '/proc/net/tcp' or return;
    while (<$tcp>) {
        my @f = split;
        next unless $f[1] && $f[1] =~ /:([0-9A-F]{4})$/ && hex($1) == $port;
        next unless $f[2] =~ /:([0-9A-F]{4})$/ && hex($1) == $cport;
        $inode = $f[9];
    }
    return unless $inode;
    for my $w ($t->worker_pids) {
        for my $fd (glob "/proc/$w/fd/*") {
            my $l = readlink($fd) // next;
            return $w if $l eq "socket:[$inode]";
        }
    }
    return;
}

sub read_all { my ($c) = @_; local $/; my $a = <$c>; return $a // '' }

run_cell('queued', "q = 0");
my $running = raw_connect();
my $wr;
ok(wait_until(sub { $wr = worker_of_conn($running) }, 5), 'the running cell has a worker');
raw_execute($running, 'queued', "import time\ntime.sleep(2.5)\nq = 1");
ok(wait_until(sub { grep { $_->{state} eq 'running' }
    @{ $t->http('GET', '/v1/kernels')->{json}{kernels} } }, 5), 'its cell runs');

# the queued cell on the other worker, if the kernel lets us pick one
my ($waiting, $ww, $tries);
for $tries (1 .. 30) {
    $waiting = raw_connect();
    wait_until(sub { $ww = worker_of_conn($waiting) }, 5);
    last if $ww && $ww != $wr;
}
ok($ww, "the queued cell's worker: $ww (the running one's: $wr)");
raw_execute($waiting, 'queued', "q = 'lost'");
sleep 0.5;
kill 'KILL', $ww;
ok(wait_until(sub { scalar($t->worker_pids) == 2 && !grep { $_ == $ww } $t->worker_pids }, 5),
    'the master started a new worker');
like(read_all($running), qr/"status":"success"/, 'the running cell finished')
    if $ww != $wr;

$t0 = time;
$r = run_cell('queued', "print(q)", timeout => 15);
is($r->{result}{status}, 'success', 'a later cell runs on the kernel');
is($r->{result}{output}, "1\n", 'after the running one, without the dead queued one');
ok(time - $t0 < 6, sprintf('not held by the dead queued cell (%.1fs)', time - $t0));
my $kq = $r->{result}{kernel}{kernel_id};
my $pq = runner_pid($kq);
$r = $t->http('DELETE', '/v1/kernels/queued');
is($r->{status}, 204, 'the kernel can be shut down: nothing queued on it');
ok(wait_until(sub { !pid_alive($pq) }, 5), 'its process is gone');

$t->stop;

# --- reload keeps kernels; a cell streaming across it finishes

my $u = Hermes::Test->new;
$u->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
        }
    }
CONF
$u->run;

$r = $u->execute('/v1/execute', { session => 'keep', code => "kept = 'across reload'" });
my $kkeep = $r->{result}{kernel}{kernel_id};
my $stream = $u->execute_async('/v1/execute', { session => 'stream',
    code => "import time\nfor i in range(4):\n    print(i, flush=True)\n    time.sleep(0.5)" });
sleep 0.7;
ok($u->reload, 'reload');
$r = $stream->wait;
is($r->{result}{status}, 'success', 'the cell streaming across the reload finished');
is(join('', map { $_->{text} } grep { $_->{type} eq 'stdout' } @{ $r->{events} }),
    "0\n1\n2\n3\n", 'with all its output');
$r = $u->execute('/v1/execute', { session => 'keep', code => "print(kept)" });
is($r->{result}{output}, "across reload\n", 'state survives the reload');
is($r->{result}{kernel}{kernel_id}, $kkeep, 'same kernel after reload');
$u->stop;

# --- a zone too small for another running kernel: 503, nothing else hurt

my $s = Hermes::Test->new;
$s->write_conf(<<'CONF');
    hermes_zone tiny:32k max_kernels=1000;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_owner $http_x_owner;
        }
    }
CONF
$s->run;

my $owner = 'o' x 120;
my (@held, $full);
for my $i (1 .. 40) {
    push @held, $s->execute_async('/v1/execute', { session => sprintf('%s%03d', 's' x 120, $i),
        code => "import time\ntime.sleep(20)" }, headers => { 'X-Owner' => $owner },
        json => 1, timeout => 40);
    sleep 0.15;
    my @done = grep { $_->ready } @held;
    ($full) = grep { $_->{status} == 503 } map { $_->wait } @done;
    last if $full;
}
ok($full, sprintf('a full zone answers 503 (after %d running kernels)', scalar @held - 1));
is($full->{json}{error}{code}, 'registry_full', 'registry_full') if $full;
like($s->error_log, qr/zone "tiny" is full/, 'an error.log line says so');
is(scalar(() = $s->worker_pids), 2, 'workers up');
# Kernels whose spawn was under way when the zone filled start later (a
# spawn is no process in the prefix yet): killed as they come, until
# every held request has its answer, so none runs on into the stop.
ok(wait_until(sub { $s->kill_strays; sleep 0.1; !grep { !$_->ready } @held }, 30),
   'every held request answered once the kernels are killed');

$s->stop;
done_testing;
