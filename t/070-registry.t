#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The registry: the cap never evicts a running kernel, one spawn per key,
# the queue limit, owner isolation on list/delete/execute, the counters;
# max_kernels_per_owner: an owner makes room among its own kernels only.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m max_kernels=2 max_kernels_per_owner=8
                idle_timeout=10m sweep=500ms;
    hermes_zone fair:1m max_kernels=8 max_kernels_per_owner=2
                idle_timeout=10m sweep=500ms;
    hermes_backend local root=%%KROOT%%;
    log_format hermes '$hermes_session $hermes_kernel_id $hermes_cell_status $hermes_cell_ms';

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute zone=kernels;
            hermes_owner $http_x_owner;
            hermes_queue 1;
            access_log %%PREFIX%%/logs/hermes.log hermes;
        }

        location /v1/kernels {
            hermes_kernels zone=kernels;
            hermes_owner $http_x_owner;
        }

        location = /v1/status {
            hermes_status zone=kernels;
        }

        location = /fair/execute {
            hermes_execute zone=fair;
            hermes_owner $http_x_owner;
        }

        location /fair/kernels {
            hermes_kernels zone=fair;
            hermes_owner $http_x_owner;
        }

        location = /fair/status {
            hermes_status zone=fair;
        }
    }
CONF
$t->run;

my %alice = (headers => { 'X-Owner' => 'alice' });
my %bob = (headers => { 'X-Owner' => 'bob' });

sub run_cell { my ($s, $code, %o) = @_; $t->execute('/v1/execute', { session => $s, code => $code }, %alice, %o) }
sub status { $t->http('GET', '/v1/status')->{json} }
sub dir_of { my ($k) = @_; $t->kroot . "/hermes_rkernel_$k" }

# --- cap 2, three sessions, one mid-cell: the running one survives even as
#     the least recently used kernel, the LRU idle one goes

my $kA = run_cell('A', "a = 1")->{result}{kernel}{kernel_id};
my $kB = run_cell('B', "b = 1")->{result}{kernel}{kernel_id};
my $pidA = runner_pid($kA);
my $pidB = runner_pid($kB);
my $long = $t->execute_async('/v1/execute', { session => 'A',
    code => "import time\ntime.sleep(2)\nprint(a)" }, %alice);
ok(wait_until(sub { (status()->{running} // 0) == 1 }, 5), 'A is mid-cell');

# B is used after A's cell started: A, running, is the least recently used
my $r = run_cell('B', "b = 2");
is($r->{result}{kernel}{kernel_id}, $kB, 'B used again while A runs');
is($t->http('GET', '/v1/kernels', %alice)->{json}{kernels}[-1]{session}, 'A',
    'A (running) is the least recently used kernel');

$r = run_cell('C', "c = 1");
is($r->{result}{status}, 'success', 'third session runs');
my $kC = $r->{result}{kernel}{kernel_id};
ok(wait_until(sub { !pid_alive($pidB) }, 5), 'the LRU idle kernel (B) was killed');
ok(wait_until(sub { !-d dir_of($kB) }, 5), 'and its directory removed');
ok(-d dir_of($kA) && pid_alive($pidA), 'the running kernel (A) is still there');
$r = $long->wait;
is($r->{result}{output}, "1\n", 'the running cell finished on its kernel');
is($r->{result}{kernel}{kernel_id}, $kA, 'on the same kernel');
is(status()->{evictions_total}{cap}, 1, 'evictions_total{cap} 1');
is(status()->{kernels}, 2, 'back at the cap');

$r = run_cell('B', "print('b' in globals())");
is($r->{result}{output}, "False\n", 'the evicted session starts afresh');

# --- all running: the registry goes over the cap while they run, and comes
#     back under it once they end

# (long enough for three spawns on a busy machine)
my @bg = map { $t->execute_async('/v1/execute', { session => "run$_",
    code => "import time\ntime.sleep(4)\nprint('done')" }, %alice) } 1 .. 3;
ok(wait_until(sub { (status()->{running} // 0) == 3 }, 10), 'three running at once');
is(status()->{kernels}, 3, 'over the cap while they run (3 > 2)');
is($_->wait->{result}{output}, "done\n", 'a running cell over the cap finished') for @bg;
ok(wait_until(sub { status()->{kernels} == 2 }, 5), 'back under the cap after the sweep');

# --- two concurrent first requests for one key spawn exactly one kernel

my $spawned = status()->{spawned_total};
my @first = map { $t->execute_async('/v1/execute', { session => 'twin',
    code => "import os\nprint(os.getpid())" }, %alice) } 1 .. 2;
my @res = map { $_->wait } @first;
is($res[0]{result}{status}, 'success', 'first of two: success');
is($res[1]{result}{status}, 'success', 'second of two: success');
is($res[0]{result}{kernel}{kernel_id}, $res[1]{result}{kernel}{kernel_id}, 'one kernel for both');
is(status()->{spawned_total}, $spawned + 1, 'spawned_total moved by one');
is(join(',', sort map { $_->{result}{kernel}{reused} ? 1 : 0 } @res), '0,1',
    'one spawned it, the other reused it');

# --- cells of one kernel run one at a time; past hermes_queue: 429

my $q1 = $t->execute_async('/v1/execute', { session => 'busy',
    code => "import time\nt0 = time.time()\ntime.sleep(1.5)" }, %alice);
ok(wait_until(sub { (status()->{running} // 0) >= 1 }, 5), 'busy kernel running');
sleep 0.3;
my $q2 = $t->execute_async('/v1/execute', { session => 'busy',
    code => "import time\nprint(round(time.time() - t0, 1) >= 1.4)" }, %alice);
sleep 0.5;
$r = run_cell('busy', "1");
is($r->{status}, 429, 'queue full: 429');
is($r->{json}{error}{code}, 'queue_full', 'queue_full');
is($r->{headers}{'retry-after'}, '1', 'Retry-After');
is($q1->wait->{result}{status}, 'success', 'the running cell finished');
is($q2->wait->{result}{output}, "True\n", 'the queued cell ran after it, in order');

# --- owners: one never sees, runs on or shuts down another's kernel

$r = run_cell('shared-name', "secret = 'alice'");
my $kAlice = $r->{result}{kernel}{kernel_id};

my $list = $t->http('GET', '/v1/kernels', headers => { 'X-Owner' => 'alice' })->{json};
my ($entry) = grep { $_->{session} eq 'shared-name' } @{ $list->{kernels} };
ok($entry, 'alice lists her kernel');
is($entry->{kernel_id}, $kAlice, 'listing: kernel id');
is($entry->{state}, 'idle', 'listing: state');
is($entry->{backend}, 'local', 'listing: backend');
ok($entry->{host}, 'listing: host');
is($entry->{execution_count}, 1, 'listing: execution_count');

$list = $t->http('GET', '/v1/kernels', headers => { 'X-Owner' => 'bob' })->{json};
is_deeply($list->{kernels}, [], 'bob sees none of them');

$r = $t->http('DELETE', '/v1/kernels/shared-name', headers => { 'X-Owner' => 'bob' });
is($r->{status}, 404, "bob can't delete alice's kernel: 404");

$r = $t->execute('/v1/execute', { session => 'shared-name', code => "print(globals().get('secret'))" }, %bob);
is($r->{result}{output}, "None\n", "bob's cell runs on his own kernel");
isnt($r->{result}{kernel}{kernel_id}, $kAlice, 'a different kernel');
$r = run_cell('shared-name', "print(secret)");
is($r->{result}{output}, "alice\n", "alice's kernel kept her state");

$r = $t->http('GET', '/v1/kernels');
is($r->{status}, 401, 'no owner: 401');

# --- owners are compared whole: "ali" is not a prefix of "alice"

my %ali = (headers => { 'X-Owner' => 'ali' });
$list = $t->http('GET', '/v1/kernels', %ali)->{json};
is_deeply($list->{kernels}, [], 'ali lists none of alice\'s kernels');
$r = $t->http('GET', '/v1/kernels/shared-name', %ali);
unlike($r->{content}, qr/$kAlice/, 'ali cannot GET alice\'s kernel');
$r = $t->http('DELETE', '/v1/kernels/shared-name', %ali);
is($r->{status}, 404, 'ali cannot delete alice\'s kernel: 404');
$r = $t->execute('/v1/execute', { session => 'shared-name',
    code => "print(globals().get('secret'))" }, %ali);
is($r->{result}{output}, "None\n", 'ali\'s cell runs on a kernel of his own');
isnt($r->{result}{kernel}{kernel_id}, $kAlice, 'not alice\'s');
is($r->{result}{kernel}{reused}, JSON::PP::false, 'a new one');
$r = $t->http('DELETE', '/v1/kernels/shared-name', %ali);
is($r->{status}, 204, 'ali deletes his own');
$r = run_cell('shared-name', "print(secret)");
is($r->{result}{output}, "alice\n", 'alice\'s kernel is untouched');
is($r->{result}{kernel}{kernel_id}, $kAlice, 'same kernel');

# --- delete: 409 while a cell runs, ?force=1 kills it anyway, 204

my $pidAlice = runner_pid($kAlice);
my $running = $t->execute_async('/v1/execute', { session => 'shared-name',
    code => "import time\ntime.sleep(5)" }, %alice);
ok(wait_until(sub {
    my $l = $t->http('GET', '/v1/kernels', %alice)->{json};
    grep { $_->{session} eq 'shared-name' && $_->{state} eq 'running' } @{ $l->{kernels} };
}, 5), 'listing shows it running');
$r = $t->http('DELETE', '/v1/kernels/shared-name', %alice);
is($r->{status}, 409, 'delete while running: 409');
is($r->{json}{error}{code}, 'cell_running', 'cell_running');
my $t0 = time;
my $queued = $t->execute_async('/v1/execute', { session => 'shared-name',
    code => "print(globals().get('secret'))" }, %alice);
sleep 0.5;    # it takes its ticket behind the running one
$r = $t->http('DELETE', '/v1/kernels/shared-name?force=1', %alice);
is($r->{status}, 204, 'forced delete: 204');
$r = $running->wait;
is($r->{result}{status}, 'error', 'the killed cell ends with an error');
ok(time - $t0 < 3, 'at once, not at its end');
ok(wait_until(sub { !pid_alive($pidAlice) }, 5), 'kernel process killed');
ok(wait_until(sub { !-d dir_of($kAlice) }, 5), 'kernel directory removed');
$r = $queued->wait;
is($r->{events}[0]{state_lost}, JSON::PP::true, 'the queued cell: state_lost, on a new kernel');
is($r->{events}[0]{lost_reason}, 'deleted', 'the queued cell: lost_reason deleted');
is($r->{result}{output}, "None\n", 'the queued cell: none of the old state');
$r = $t->http('DELETE', '/v1/kernels/shared-name?force=1', %alice);
is($r->{status}, 204, 'forced delete of the new kernel: 204');
$r = $t->http('DELETE', '/v1/kernels/shared-name', %alice);
is($r->{status}, 404, 'gone: 404');
$r = run_cell('shared-name', 'print(1)');
is($r->{result}{kernel}{state_lost}, JSON::PP::true, 'the next cell after a forced delete: state_lost');
is($r->{result}{kernel}{lost_reason}, 'deleted', 'lost_reason deleted, as after an idle delete');

# --- counters and formats

my $st = status();
ok($st->{cells_total}{success} >= 10, 'cells_total{success} counted');
ok($st->{cells_total}{error} >= 1, 'cells_total{error} counted');
is($st->{max_kernels}, 2, 'max_kernels');
ok($st->{zone_used_bytes} > 0 && $st->{zone_used_bytes} <= $st->{zone_size_bytes},
    'zone bytes');
ok(exists $st->{rpc_rejected_total}{token}, 'rpc_rejected_total by reason');
$r = $t->http('GET', '/v1/status?format=prometheus');
like($r->{headers}{'content-type'}, qr{^text/plain}, 'prometheus content type');
like($r->{content}, qr/^hermes_kernels\{zone="kernels"\} \d+$/m, 'prometheus gauge');
like($r->{content}, qr/^hermes_cells_total\{zone="kernels",status="success"\} \d+$/m,
    'prometheus labelled counter');
like($r->{content}, qr/^# TYPE hermes_spawned_total counter$/m, 'prometheus TYPE lines');

# --- max_kernels_per_owner=2: alice at her quota makes room among her own
#     kernels, never bob's; with all of hers busy she gets 429

sub fair_cell {
    my ($who, $s, $code) = @_;
    $t->execute('/fair/execute', { session => $s, code => $code },
        headers => { 'X-Owner' => $who });
}
sub fair_status { $t->http('GET', '/fair/status')->{json} }
sub fair_sessions {
    my ($who) = @_;
    my $l = $t->http('GET', '/fair/kernels', headers => { 'X-Owner' => $who })->{json};
    return join ',', sort map { $_->{session} } @{ $l->{kernels} };
}

my $kb1 = fair_cell('bob', 'b1', "b = 1")->{result}{kernel}{kernel_id};
my $ka1 = fair_cell('alice', 'a1', "a = 1")->{result}{kernel}{kernel_id};
my $ka2 = fair_cell('alice', 'a2', "a = 2")->{result}{kernel}{kernel_id};
my ($pb1, $pa1, $pa2) = map { runner_pid($_) } $kb1, $ka1, $ka2;
is(fair_sessions('alice'), 'a1,a2', 'alice has her quota (2)');

# bob's kernel is the least recently used of all: the global LRU would take it
$r = fair_cell('alice', 'a3', "a = 3");
is($r->{result}{status}, 'success', 'alice over her quota: a new kernel');
my $ka3 = $r->{result}{kernel}{kernel_id};
ok(wait_until(sub { !pid_alive($pa1) }, 5), "alice's LRU idle kernel (a1) was killed");
ok(wait_until(sub { !-d dir_of($ka1) }, 5), 'and its directory removed');
is(fair_sessions('alice'), 'a2,a3', 'alice still has 2: a2, a3');
ok(pid_alive($pb1) && -d dir_of($kb1), "bob's kernel is untouched");
is(fair_sessions('bob'), 'b1', 'bob still has b1');
is(fair_status()->{evictions_total}{cap}, 1, 'counted as a cap eviction');
is(fair_status()->{kernels}, 3, 'three kernels in the zone');

# both of alice's kernels busy: a third one is refused, bob is not
my @busy = map { $t->execute_async('/fair/execute', { session => $_,
    code => "import time\ntime.sleep(2)\nprint('done')" },
    headers => { 'X-Owner' => 'alice' }) } 'a2', 'a3';
ok(wait_until(sub { (fair_status()->{running} // 0) == 2 }, 5), 'a2 and a3 running');
$r = fair_cell('alice', 'a4', "1");
is($r->{status}, 429, 'alice, all of her kernels busy: 429');
is($r->{json}{error}{code}, 'owner_limit', 'owner_limit');
is($r->{headers}{'retry-after'}, '1', 'Retry-After');
ok(pid_alive($pa2), 'her running kernels untouched');
$r = fair_cell('bob', 'b2', "print('bob')");
is($r->{result}{output}, "bob\n", 'bob gets a new kernel meanwhile');
$r = fair_cell('bob', 'b1', "print(b)");
is($r->{result}{output}, "1\n", 'and keeps his old one');
is($_->wait->{result}{output}, "done\n", "alice's busy cell finished") for @busy;

my $pa3 = runner_pid($ka3);
fair_cell('alice', 'a2', "1");
$r = fair_cell('alice', 'a4', "print('a4')");
is($r->{result}{output}, "a4\n", 'once one is idle again, alice gets her new kernel');
ok(wait_until(sub { !pid_alive($pa3) }, 5), 'in place of her LRU one (a3)');
ok(pid_alive($pa2), 'her other one (a2) kept');
is(fair_sessions('alice'), 'a2,a4', 'alice: a2, a4');
is(fair_sessions('bob'), 'b1,b2', 'bob: b1, b2');

# --- access log variables

open my $log, '<', $t->prefix . '/logs/hermes.log' or die;
my @lines = <$log>;
ok((grep { /^A $kA success \d+$/ } @lines), 'access log: session, kernel id, status, ms');
ok((grep { /^busy - - -$/ } @lines), 'access log: the 429 has a session, no kernel, no cell');

$t->stop;

# --- bad max_kernels_per_owner values fail nginx -t, saying why

for my $bad ('0', '-1', 'x', '') {
    my $c = Hermes::Test->new;
    $c->write_conf("hermes_zone z:1m max_kernels_per_owner=$bad;\n");
    my ($rc, $out) = $c->test_config;
    isnt($rc, 0, "max_kernels_per_owner=$bad: nginx -t fails");
    like($out, qr/invalid hermes_zone max_kernels_per_owner "max_kernels_per_owner=\Q$bad\E": a number of at least 1 expected/,
        "max_kernels_per_owner=$bad: says why") or diag $out;
}

# --- processes racing on the same keys of one shared zone: one spawn per
#     key, one entry per key (t/unit/registry_race.c)

SKIP: {
    my $root = Hermes::Test::repo_root();
    skip 'build/nginx/Makefile missing: run "make module" first', 2
        unless -f "$root/build/nginx/Makefile";
    skip 'cmocka.h missing: apt-get install libcmocka-dev', 2
        unless -f '/usr/include/cmocka.h';

    my $out = `make -s -C $root/t/unit race 2>&1`;
    is($?, 0, 'make -C t/unit race') or diag $out;
    $out = `$root/t/unit/build/registry_race 2>&1`;
    is($?, 0, 'registry_race: one spawn and one entry per key') or diag $out;
    note $out;
}

done_testing;
