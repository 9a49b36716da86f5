#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Warm pools (hermes_backend ... warm=N): N spawned, sandboxed, idle
# kernels of no one; a new session takes one and runs at once, the pool
# refills.  Pool kernels are no owner's (limit, listing), are replaced when
# a reload changes how they would be spawned, when they die, and long
# before their runners would exit idle; two workers never over-fill.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);
use JSON::PP ();

use Hermes::Test;
use Hermes::Sshd;

# a test stopped by a signal still runs END: nginx, sshd and kernels go
$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

plan skip_all => 'bwrap not installed (Debian package bubblewrap)'
    unless -x '/usr/bin/bwrap';

my $conf = <<'CONF';
    hermes_zone kernels:1m max_kernels_per_owner=1 sweep=300ms;
    hermes_backend local root=%%KROOT%% warm=2;
    hermes_sandbox bwrap %%MEMORY%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_owner $http_x_owner;
        }

        location /v1/kernels {
            hermes_kernels;
            hermes_owner $http_x_owner;
        }

        location = /v1/status {
            hermes_status;
        }
    }
CONF

my $t = Hermes::Test->new(workers => 2);
(my $c = $conf) =~ s/%%MEMORY%%/memory=1g/;
$t->write_conf($c);
$t->run;

sub status { $t->http('GET', '/v1/status')->{json} // {} }
sub run_cell {
    my ($owner, $s, $code, %o) = @_;
    return $t->execute('/v1/execute', { session => $s, code => $code },
        headers => { 'X-Owner' => $owner }, %o);
}
sub ids { map { m{/hermes_rkernel_([0-9a-f]{32})$} ? $1 : () } $t->kroot_dirs }
sub listing {
    my ($owner) = @_;
    return $t->http('GET', '/v1/kernels', headers => { 'X-Owner' => $owner })
        ->{json}{kernels};
}

# --- after start: two kernels of no one, up and sandboxed

ok(wait_until(sub { (status()->{warm_kernels} // 0) == 2 }, 15), 'status: warm_kernels 2 after start');
my @pool = ids();
is(scalar @pool, 2, 'two kernel dirs under the root');
ok(!grep({ !runner_pid($_) } @pool), 'a runner in each')
    or diag explain \@pool;
is(status()->{kernels}, 2, 'counted in kernels');
is(scalar @{ listing('alice') }, 0, 'no owner lists them');

my $prom = $t->http('GET', '/v1/status?format=prometheus')->{content};
like($prom, qr/^hermes_warm_kernels\{zone="kernels"\} 2$/m, 'Prometheus: hermes_warm_kernels 2');

# --- a new session takes one: no spawn now, runs at once, the pool refills

my $spawned = status()->{spawned_total};
my $log0 = length $t->error_log;
my $r = run_cell('alice', 'a', "x = 41\nprint(x + 1)");
is($r->{result}{status}, 'success', 'the first cell of a new session ran');
is($r->{result}{output}, "42\n", 'its output');
my $ka = $r->{result}{kernel}{kernel_id};
ok((grep { $_ eq $ka } @pool), 'on one of the pool\'s kernels');
is($r->{result}{kernel}{reused}, JSON::PP::false, 'reused false (a new kernel for the session)');
is($r->{result}{kernel}{state_lost}, JSON::PP::false, 'state_lost false');
is($r->{result}{execution_count}, 1, 'execution_count 1');
unlike(substr($t->error_log, $log0), qr/started for session "a"/, 'no spawn for the session');

ok(wait_until(sub { (status()->{warm_kernels} // 0) == 2 }, 15), 'the pool refilled to 2');
is(status()->{spawned_total}, $spawned + 1, 'by one spawn');
my @after = ids();
is(scalar @after, 3, 'three kernel dirs: the session\'s and the pool\'s');

$r = run_cell('alice', 'a', "print(x)");
is($r->{result}{output}, "41\n", 'the session keeps its kernel and state');
is($r->{result}{kernel}{kernel_id}, $ka, 'same kernel');
is($r->{result}{kernel}{reused}, JSON::PP::true, 'reused');

my $l = listing('alice');
is(scalar @$l, 1, 'the owner lists its one kernel');
is($l->[0]{kernel_id}, $ka, 'the taken one');

# --- the owner limit (1) counts the owner's kernels, not the pool's

my $busy = $t->execute_async('/v1/execute', { session => 'a', code => "import time\ntime.sleep(2)" },
    headers => { 'X-Owner' => 'alice' }, json => 1);
ok(wait_until(sub { (status()->{running} // 0) == 1 }, 5), 'alice\'s kernel is busy');
$r = run_cell('alice', 'b', "print(1)", json => 1);
is($r->{status}, 429, 'a second kernel for alice: 429 while her one is busy');
is($r->{json}{error}{code}, 'owner_limit', 'owner_limit');
$r = run_cell('bob', 'b', "print('bob')");
is($r->{result}{output}, "bob\n", 'another owner takes a warm kernel');
is($busy->wait->{status}, 200, 'alice\'s cell finished');
is(status()->{evictions_total}{cap} // 0, 0, 'no kernel evicted for room');
ok(wait_until(sub { (status()->{warm_kernels} // 0) == 2 }, 15), 'warm 2 again');

# --- two workers never over-fill: a burst of new sessions

my @burst;
my $max = 0;
my $sessions = 3;    # a, bob's b, and the burst's so far
for my $i (1 .. 8) {
    push @burst, $t->execute_async('/v1/execute', { session => "burst$i", code => "print($i)" },
        headers => { 'X-Owner' => "o$i" }, json => 1);
}
my $deadline = time + 20;
while (time < $deadline) {
    my $n = () = ids();
    $max = $n if $n > $max;
    last if !grep { !$_->ready } @burst;
    sleep 0.01;
}
my @res = map { $_->wait } @burst;
is(scalar(grep { $_->{status} == 200 } @res), 8, 'the burst: every session answered');
ok(wait_until(sub { (status()->{warm_kernels} // 0) == 2 }, 15), 'the pool refilled to 2');
for (1 .. 20) {
    my $n = () = ids();
    $max = $n if $n > $max;
    sleep 0.02;
}
ok($max <= 2 + 2 + 8, "kernel dirs never more than in use + 2 ($max)");
is(scalar(ids()), 2 + 2 + 8, 'sessions\' kernels and two warm ones, no more');
is(status()->{kernels}, 2 + 2 + 8, 'kernels says so too');

# --- a warm kernel killed from outside is noticed and replaced

@pool = grep { my $k = $_; !grep { $_->{kernel_id} eq $k } map { @{ listing($_) } } qw(alice bob) }
    ids();
my %in_use = map { $_->{json}{kernel}{kernel_id} // '' => 1 } @res;
@pool = grep { !$in_use{$_} } @pool;
is(scalar @pool, 2, 'the two warm kernels');
my $victim = $pool[0];
my $vpid = runner_pid($victim);
ok($vpid, "warm kernel $victim runs as $vpid");
kill_group($vpid);    # its runner's process group; the sandbox follows
ok(wait_until(sub { !-d $t->kroot . "/hermes_rkernel_$victim" }, 10), 'its remains removed');
ok(wait_until(sub { (status()->{warm_kernels} // 0) == 2 && !grep { $_ eq $victim } ids() }, 15),
    'a new one took its place');
like($t->error_log, qr/warm kernel "[^"]*$victim" \(pid \d+\) is gone/, 'logged');

# --- a reload that changes nothing keeps them; one that changes the
#     sandbox replaces them, and keeps the sessions' kernels

@pool = grep { !$in_use{$_} && $_ ne $ka } ids();
@pool = grep { my $k = $_; !grep { $_->{kernel_id} eq $k } @{ listing('bob') } } @pool;
is(scalar @pool, 2, 'two warm kernels before the reload');
ok($t->reload, 'reload, same configuration');
sleep 1;
is(join(' ', sort(grep { my $k = $_; grep { $_ eq $k } @pool } ids())), join(' ', sort @pool),
    'the warm kernels are kept');
is(status()->{warm_kernels}, 2, 'warm 2');

($c = $conf) =~ s/%%MEMORY%%/memory=512m/;
$t->write_conf($c);
ok($t->reload, 'reload with another sandbox memory=');
ok(wait_until(sub { !grep { my $k = $_; grep { $_ eq $k } @pool } ids() }, 15),
    'the old warm kernels are reaped');
ok(wait_until(sub { (status()->{warm_kernels} // 0) == 2 }, 15), 'two new ones');
$r = run_cell('alice', 'a', "print(x)");
is($r->{result}{output}, "41\n", 'a session\'s kernel survives the reload');
$r = run_cell('carol', 'c', "print('c')");
ok(!grep({ $_ eq $r->{result}{kernel}{kernel_id} } @pool), 'a new session gets a kernel of the new pool');

$t->stop;

# --- warm kernels found dead when taken: the session gets a working one;
#     the sweep is slow here, so the take comes first

my $u = Hermes::Test->new(workers => 1);
mkdir $u->kroot . '/cold', 0711 or die "mkdir: $!";
$u->write_conf(<<'CONF');
    hermes_zone kernels:1m sweep=1h max_kernels=4 max_kernels_per_owner=4;
    hermes_backend local root=%%KROOT%% warm=2;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
        }

        location = /v1/cold {
            hermes_execute;
            hermes_backend local root=%%KROOT%%/cold;
        }

        location = /v1/status {
            hermes_status;
        }
    }
CONF
$u->run;

ok(wait_until(sub { ($u->http('GET', '/v1/status')->{json}{warm_kernels} // 0) == 2 }, 15), 'warm 2');
my @dead = map { m{/hermes_rkernel_([0-9a-f]{32})$} ? $1 : () } $u->kroot_dirs;
is(scalar @dead, 2, 'two warm kernels');
# a kernel's processes: its runner, and the sandbox around it
sub kernel_procs {
    my ($k) = @_;
    return grep { (readlink("/proc/$_/cwd") // '') =~ /hermes_rkernel_$k$/ }
        procs_matching(qr/hermes_rkernel_$k|kernel_start\.py/);
}
for my $k (@dead) {
    kill_group($_) for kernel_procs($k);
}
ok(wait_until(sub { !grep { kernel_procs($_) } @dead }, 5), 'both killed');

$r = $u->execute('/v1/execute', { session => 'd', code => "print('alive')" });
is($r->{result}{status}, 'success', 'a new session\'s first cell ran');
is($r->{result}{output}, "alive\n", 'on a working kernel');
my $kd = $r->{result}{kernel}{kernel_id};
ok($kd && !grep({ $_ eq $kd } @dead), 'not a dead one');
is($r->{result}{kernel}{state_lost}, JSON::PP::false, 'state_lost false: it had no state');
like($u->error_log, qr/kernel \w+ of session "d" is gone, starting a new one/,
    'the dead one was found before the cell and replaced by a spawn');
ok(wait_until(sub { ($u->http('GET', '/v1/status')->{json}{warm_kernels} // 0) == 2 }, 15),
    'the pool refilled after the take');
ok(wait_until(sub { !grep { my $k = $_; grep { $_ eq $k } @dead } map { m{_([0-9a-f]{32})$} ? $1 : () }
    $u->kroot_dirs }, 10), 'the dead ones removed') or diag $u->error_log;

# --- with a cap (4 here), warm kernels are the first to go

sub ustatus { $u->http('GET', '/v1/status')->{json} // {} }
is(ustatus()->{kernels}, 3, 'a session and two warm kernels');
$r = $u->execute('/v1/cold', { session => 'o1', code => "print(1)" });
is($r->{result}{output}, "1\n", 'a session of a backend without a pool spawns');
is(ustatus()->{kernels}, 4, 'at the cap') or diag explain ustatus(), [$u->kroot_dirs];
$r = $u->execute('/v1/cold', { session => 'o2', code => "print(2)" });
is($r->{result}{output}, "2\n", 'another, over the cap');
is(ustatus()->{warm_kernels}, 1, 'a warm kernel made room');
$r = $u->execute('/v1/cold', { session => 'o3', code => "print(3)" });
is(ustatus()->{warm_kernels}, 0, 'then the other');
is(ustatus()->{evictions_total}{cap}, 0, 'no session evicted, none counted');
$r = $u->execute('/v1/execute', { session => 'd', code => "print('still')" });
is($r->{result}{output}, "still\n", 'the first session kept its kernel');
is($r->{result}{kernel}{kernel_id}, $kd, 'the same one');
$r = $u->execute('/v1/cold', { session => 'o4', code => "print(4)" });
is(ustatus()->{evictions_total}{cap}, 1, 'then sessions: the least recently used');
is(ustatus()->{kernels}, 4, 'four kernels');
is(ustatus()->{warm_kernels}, 0, 'no room for the pool');
$u->stop;

# --- warm kernels retire at half the idle timeout, long before their
#     runners' own exit; never while fresh

my $v = Hermes::Test->new(workers => 1);
$v->write_conf(<<'CONF');
    hermes_zone kernels:1m idle_timeout=4s sweep=200ms;
    hermes_backend local root=%%KROOT%% warm=2;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
        }

        location = /v1/status {
            hermes_status;
        }
    }
CONF
$v->run;

sub vstatus { $v->http('GET', '/v1/status')->{json} // {} }
sub vids { map { m{/hermes_rkernel_([0-9a-f]{32})$} ? $1 : () } $v->kroot_dirs }

ok(wait_until(sub { (vstatus()->{warm_kernels} // 0) == 2 }, 15), 'warm 2');
my @first = vids();
my $t0 = time;
sleep 1;
is(join(' ', vids()), join(' ', @first), 'fresh warm kernels are kept');
ok(wait_until(sub { !grep { my $k = $_; grep { $_ eq $k } @first } vids() }, 6),
    'replaced once half the idle timeout passed');
my $took = time - $t0;
ok($took >= 1.5 && $took < 5, sprintf('after %.1fs (idle_timeout 4s)', $took));
ok(wait_until(sub { (vstatus()->{warm_kernels} // 0) == 2 }, 15), 'warm 2 again');
is(vstatus()->{evictions_total}{idle} // 0, 0, 'not counted as idle evictions');

$v->stop;

# --- ssh: one pool per host, served over ssh; a dead one taken is
#     replaced before the cell

SKIP: {
    my $why = Hermes::Sshd->unavailable;
    skip $why, 14 if $why;

    my $x = Hermes::Test->new(workers => 1);
    my $p = $x->prefix;
    my $s1 = Hermes::Sshd->new(dir => "$p/ssh1", port => $x->port(5));
    my $s2 = Hermes::Sshd->new(dir => "$p/ssh2", port => $x->port(6));
    $s1->share_with("$p/known_hosts_both", $s2);
    $s1->start;
    $s2->start;
    my ($P1, $P2, $ID) = ($s1->port, $s2->port, $s1->identity);

    $x->write_conf(<<"CONF");
    hermes_zone kernels:1m sweep=1h;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P1 host=127.0.0.1:$P2 user=root
                identity=$ID known_hosts=%%PREFIX%%/known_hosts_both
                root=%%KROOT%% warm=1;
        }

        location = /v1/status {
            hermes_status;
        }
    }
CONF
    $x->run;

    sub xstatus { $_[0]->http('GET', '/v1/status')->{json} // {} }
    sub xids { map { m{/hermes_rkernel_([0-9a-f]{32})$} ? $1 : () } $_[0]->kroot_dirs }
    sub ssh_port_of {
        my ($pid) = @_;
        open my $fh, '<:raw', "/proc/$pid/environ" or return '';
        local $/;
        my $env = <$fh> // '';
        return $env =~ /(?:^|\0)SSH_CONNECTION=\S+ \d+ \S+ (\d+)(?:\0|$)/ ? $1 : '';
    }

    ok(wait_until(sub { (xstatus($x)->{warm_kernels} // 0) == 2 }, 30), 'ssh, two hosts, warm=1: two warm kernels');
    my @w = xids($x);
    is(scalar @w, 2, 'two kernel dirs');
    is(join(' ', sort map { ssh_port_of(runner_pid($_) // 0) } @w), join(' ', sort($P1, $P2)),
        'one started over each host\'s sshd');

    my $r = $x->execute('/v1/execute', { session => 's', code => "y = 6\nprint(y * 7)" }, timeout => 40);
    is($r->{result}{output}, "42\n", 'a new ssh session\'s first cell');
    my $ks = $r->{result}{kernel}{kernel_id};
    ok((grep { $_ eq $ks } @w), 'ran on a warm kernel');
    is($r->{result}{kernel}{reused}, JSON::PP::false, 'reused false');
    unlike($x->error_log, qr/started for session "s"/, 'no spawn for it');
    ok(wait_until(sub { (xstatus($x)->{warm_kernels} // 0) == 2 }, 30), 'the pool refilled');
    $r = $x->execute('/v1/execute', { session => 's', code => "print(y)" }, timeout => 40);
    is($r->{result}{output}, "6\n", 'the session keeps it');

    # kill the warm ones: the sweep is slow, the next take finds one dead
    my @dead = grep { $_ ne $ks } xids($x);
    is(scalar @dead, 2, 'two warm kernels again');
    for my $k (@dead) {
        my $pid = runner_pid($k);
        kill_group($pid);
    }
    ok(wait_until(sub { !grep { runner_pid($_) } @dead }, 5), 'killed');
    $r = $x->execute('/v1/execute', { session => 't', code => "print('fine')" }, timeout => 40);
    is($r->{result}{output}, "fine\n", 'a session that takes a dead one is served');
    ok(!grep({ $_ eq $r->{result}{kernel}{kernel_id} } @dead), 'by a new kernel');
    is($r->{result}{kernel}{state_lost}, JSON::PP::false, 'state_lost false');

    $x->stop;
    $s1->stop;
    $s2->stop;
}

# --- configuration

my $w = Hermes::Test->new;
for my $bad (['hermes_backend local warm=x;', qr/invalid hermes_backend warm "warm=x"/],
             ['hermes_backend local warm=65;', qr/a number from 0 to 64/])
{
    $w->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    $bad->[0]
    server { listen 127.0.0.1:%%PORT_0%%; location = /x { hermes_execute; } }
CONF
    my ($rc, $out) = $w->test_config;
    ok($rc, "nginx -t fails: $bad->[0]");
    like($out, $bad->[1], '... saying why');
}

$w->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local warm=1;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /x { hermes_execute; hermes_sandbox off; }
        location = /y { hermes_execute; hermes_sandbox bwrap; }
    }
CONF
my ($rc, $out) = $w->test_config;
ok($rc, 'nginx -t fails: a warm backend whose locations spawn differently');
like($out, qr/spawn kernels differently/, '... saying why');

done_testing;
