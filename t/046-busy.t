#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The thread pool's queue is full: a request that needs a thread gets 503
# busy with Retry-After, and nothing is lost: kernels are left alone, a
# kill that could not be queued happens at the next sweep.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

# a "kernel host" that accepts and never speaks: its spawn holds the one
# thread until connect_timeout
my $stuck = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $t->port(3),
    Proto => 'tcp', Listen => 16, ReuseAddr => 1) or die "listen: $!";
system("ssh-keygen -q -t ed25519 -N '' -f $p/id >/dev/null") == 0 or die;
open my $kh, '>', "$p/known_hosts" or die; close $kh;

$t->write_conf(<<"CONF", main => 'thread_pool tiny threads=1 max_queue=1;');
    hermes_zone kernels:1m sweep=1s;
    hermes_backend local root=%%KROOT%%;
    hermes_thread_pool tiny;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /x { hermes_execute; }
        location /k { hermes_kernels; }

        location = /stuck {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:%%PORT_3%% user=root identity=$p/id
                           known_hosts=$p/known_hosts connect_timeout=3s;
        }
    }
CONF
$t->run;

my $r = $t->execute('/x', {session => 'keep', code => 'k = 7'});
is($r->{result}{status}, 'success', 'a kernel that stays');
$r = $t->execute('/x', {session => 'doomed', code => 'd = 1'});
my $doomed = $r->{events}[0]{kernel_id};
my $doomed_pid = runner_pid($doomed);
ok($doomed_pid, 'a kernel to delete');

my $hold = $t->execute_async('/stuck', {session => 'hold', code => '1'});
sleep 0.5;
my $queued = $t->execute_async('/x', {session => 'queued', code => 'print("q")'});
sleep 0.3;

# the one thread is taken, the one queue slot too
$r = $t->execute('/x', {session => 'refused', code => 'print(1)'});
is($r->{status}, 503, 'no room in the thread pool: 503');
is($r->{json}{error}{code}, 'busy', '... busy');
is($r->{headers}{'retry-after'}, '1', '... Retry-After: 1');

$r = $t->execute('/x', {session => 'keep', code => 'print(k)'});
is($r->{result}{output}, "7\n", 'a kernel that needs no thread runs its cell meanwhile');

$r = $t->http(DELETE => '/k/doomed');
is($r->{status}, 204, 'DELETE while the pool is full: 204');
ok(pid_alive($doomed_pid), '... the kill waits for room');
like($t->error_log, qr/killing kernel \d+ in "[^"]*\Q$doomed\E" waits for the next sweep/,
    '... and error.log says so');

$r = $queued->wait(20);
is($r->{result}{status}, 'success', 'the queued spawn ran once the thread was free');
$hold->wait(20);

ok(wait_until(sub { !pid_alive($doomed_pid) }, 10), 'the deleted kernel is killed at a sweep');
ok(wait_until(sub { !-e $t->kroot . "/hermes_rkernel_$doomed" }, 5), '... its directory removed');

$r = $t->execute('/x', {session => 'refused', code => 'print(2)'});
is($r->{result}{status}, 'success', 'the refused session runs when asked again');
$r = $t->execute('/x', {session => 'keep', code => 'print(k)'});
ok($r->{events}[0]{reused} && $r->{result}{output} eq "7\n", 'the kept kernel kept its state');

$t->stop;
done_testing;
