#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# One ssh connection and one kernel-host agent per worker and host: the
# login shell's rc runs once for a spawn, ten cells and a kill; twenty
# sessions' cells run at once over that one connection, answered exactly,
# without holding a thread of a 4-thread pool (a 21st session spawns and
# answers meanwhile); a connection killed mid-cell (its sshd session
# process) resumes every running cell with exact bytes, and so does one
# that hangs without a word (pings); an agent killed on the host is
# replaced and the next cells work.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

my $t = Hermes::Test->new(error_log_level => 'info', workers => 1);
my $p = $t->prefix;

my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
my $P = $s->port;

# the login shell's rc: a line each time it runs
my $rc_log = "$p/rc.log";
open my $rc, '>', $s->home . '/.bashrc' or die "write .bashrc: $!";
print $rc "echo \"rc \$\$\" >>'$rc_log'\n";
close $rc;

$s->start;

my $ssh = "host=127.0.0.1:$P known_hosts=" . $s->known_hosts
    . " user=root identity=" . $s->identity . " connect_timeout=3s";
$t->write_conf(<<"CONF", main => 'thread_pool hermes4 threads=4;');
    hermes_zone kernels:1m max_kernels=64 max_kernels_per_owner=64;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 30s;

        location = /x {
            hermes_execute;
            hermes_backend ssh $ssh root=%%KROOT%%;
            hermes_thread_pool hermes4;
        }

        location /k {
            hermes_kernels;
        }
    }
CONF
$t->run;

sub slurp {
    open my $fh, '<', $_[0] or return undef;
    local $/;
    return scalar <$fh>;
}

sub rc_runs { return () = (slurp($rc_log) // '') =~ /^rc /mg }

sub logins { return () = $s->log =~ /Accepted publickey/g }

# the agents this test's sshd runs (SSH_CONNECTION names its port)
sub agents {
    return grep {
        my $env = slurp("/proc/$_/environ") // '';
        $env =~ /(?:^|\0)SSH_CONNECTION=\S+ \d+ \S+ \Q$P\E(?:\0|$)/
    } procs_matching(qr/hermes_agent\.py/);
}

sub stdout_of {
    my ($r) = @_;
    return join '', map { $_->{text} // '' }
        grep { ($_->{type} // '') eq 'stdout' } @{ $r->{events} || [] };
}

sub kid_of { (((($_[0] // {})->{result} // {})->{kernel}) // {})->{kernel_id} // '' }

sub dir_of { $t->kroot . "/hermes_rkernel_$_[0]" }

###############################################################################
# a spawn, ten cells and a kill: one login, the rc once

{
    my $r = $t->execute('/x', { session => 'rc', code => 'n = 0' });
    is(($r->{result} // {})->{status}, 'success', 'a kernel over ssh')
        or diag explain $r;
    my $kid = kid_of($r);
    for my $i (1 .. 10) {
        $r = $t->execute('/x', { session => 'rc', code => "n += 1\nprint(n)" });
        is(stdout_of($r), "$i\n", "cell $i: its output") or diag explain $r;
    }
    $r = $t->http('DELETE', '/k/rc');
    is($r->{status}, 204, 'the kernel is deleted');
    ok(wait_until(sub { !-d dir_of($kid) }, 10), '... killed, its directory removed');
    is(rc_runs(), 1, "the login shell's rc ran once for a spawn, 10 cells and a kill")
        or diag slurp($rc_log);
    is(logins(), 1, 'one ssh login');
    is(scalar(agents()), 1, 'one agent on the host');
}

###############################################################################
# twenty cells at once over the one connection, none holding a thread of
# the 4-thread pool: a 21st session spawns and answers while they sleep

{
    my @sessions = map { "many-$_" } 1 .. 20;
    my %kid;
    for my $sess (@sessions) {
        my $r = $t->execute('/x', { session => $sess, code => "me = '$sess'" });
        $kid{$sess} = kid_of($r);
    }
    ok(!grep({ !$kid{$_} } @sessions), '20 kernels spawned') or diag explain \%kid;

    my %bg;
    for my $sess (@sessions) {
        $bg{$sess} = $t->execute_async('/x', { session => $sess, code =>
            "import time\nfor i in range(4):\n    print(me, i, 'x' * i, flush=True)\n"
            . "    time.sleep(0.5)\nprint(me, 'done')" }, timeout => 30);
    }
    my $running = wait_until(sub {
        !grep { !-e dir_of($kid{$_}) . '/cells/cell_out_000002' } @sessions
    }, 10);
    ok($running, 'the 20 cells run');

    my $t0 = time;
    my $r = $t->execute('/x', { session => 'the-21st', code => 'print(21)' }, timeout => 30);
    my $took = time - $t0;
    is(stdout_of($r), "21\n", 'a 21st session spawns and answers while they run');
    ok($took < 1.5, sprintf('  in %.2fs, before the 20 cells end (2 s): no pool '
        . 'thread is held by a running cell', $took));

    my $exact = 0;
    for my $sess (@sessions) {
        my $rr = $bg{$sess}->wait;
        my $want = join('', map { "$sess $_ " . ('x' x $_) . "\n" } 0 .. 3) . "$sess done\n";
        $exact++ if stdout_of($rr) eq $want && ($rr->{result} // {})->{output} eq $want;
        diag "$sess: " . stdout_of($rr) if stdout_of($rr) ne $want;
    }
    is($exact, 20, 'the 20 cells: each its exact output');
    is(logins(), 1, 'still one ssh login');
    is(rc_runs(), 1, "still one run of the rc");
}

###############################################################################
# the connection is killed mid-cell (the sshd session processes serving it):
# every running cell resumes on a new connection, no byte lost or repeated

{
    my @sessions = map { "cut-$_" } 1 .. 5;
    my %kid;
    for my $sess (@sessions) {
        $kid{$sess} = kid_of($t->execute('/x', { session => $sess, code => "me = '$sess'" }));
    }
    my %bg;
    for my $sess (@sessions) {
        $bg{$sess} = $t->execute_async('/x', { session => $sess, code =>
            "import time\nfor i in range(30):\n    print(me, i, flush=True)\n"
            . "    time.sleep(0.1)" }, timeout => 30);
    }
    ok(wait_until(sub {
        !grep { (-s dir_of($kid{$_}) . '/cells/cell_out_000002' // 0) < 40 } @sessions
    }, 10), 'the 5 cells are printing');

    my $off = length $t->error_log;
    my @sshd = grep { (slurp("/proc/$_/comm") // '') =~ /^sshd/ } $s->descendants;
    ok(scalar @sshd, 'the sshd session processes of the connection: ' . "@sshd");
    kill 'KILL', @sshd;

    my $exact = 0;
    for my $sess (@sessions) {
        my $rr = $bg{$sess}->wait;
        my $want = join '', map { "$sess $_\n" } 0 .. 29;
        $exact++ if stdout_of($rr) eq $want && ($rr->{result} // {})->{output} eq $want;
        diag "$sess: " . stdout_of($rr) if stdout_of($rr) ne $want;
    }
    is($exact, 5, 'each cell answered every line once, in order');
    my $log = substr($t->error_log, $off);
    like($log, qr/the connection to the kernel host \S+ broke: .*; reconnecting/,
        'error.log says the connection broke');
    is(() = $log =~ /resumes at offset [1-9]\d*/g, 5, 'the 5 cells resumed from their offsets');
    is(logins(), 2, 'a second login');
    ok(wait_until(sub { agents() == 1 }, 3), 'one agent on the host');
}

###############################################################################
# the connection hangs without a word (its sshd session processes stopped,
# the listener answering): unanswered pings end it, and the cell resumes
# on a new one long before its timeout

{
    my $kid = kid_of($t->execute('/x', { session => 'hang', code => "me = 'hang'" }));
    my $bg = $t->execute_async('/x', { session => 'hang', code =>
        "import time\nfor i in range(24):\n    print(me, i, flush=True)\n"
        . "    time.sleep(0.5)" }, timeout => 40);
    ok(wait_until(sub { (-s dir_of($kid) . '/cells/cell_out_000002' // 0) > 20 }, 10),
        'the cell is printing');
    my $off = length $t->error_log;
    my $logins = logins();
    my @sshd = grep { (slurp("/proc/$_/comm") // '') =~ /^sshd/ } $s->descendants;
    kill 'STOP', @sshd;
    my $t0 = time;
    my $r = $bg->wait;
    my $took = time - $t0;
    kill 'CONT', @sshd;
    my $want = join '', map { "hang $_\n" } 0 .. 23;
    is(stdout_of($r), $want, 'every line once, in order') or diag stdout_of($r);
    ok($took < 20, sprintf('answered in %.2fs (cell timeout 30 s)', $took));
    like(substr($t->error_log, $off), qr/broke: no answer to a ping; reconnecting/,
        'error.log says the connection did not answer a ping');
    is(logins(), $logins + 1, 'a new login');
}

###############################################################################
# the agent is killed on the host: a new one takes the next cells

{
    my ($old) = agents();
    ok($old, "the agent runs ($old)");
    my $r = $t->execute('/x', { session => 'cut-1', code => 'print(me)' });
    is(stdout_of($r), "cut-1\n", 'a cell before');
    kill 'KILL', $old;
    ok(wait_until(sub { !pid_alive($old) }, 3), 'the agent is gone');
    my $ok = 0;
    for my $sess (map { "cut-$_" } 1 .. 5) {
        $r = $t->execute('/x', { session => $sess, code => 'print(me)' });
        $ok++ if stdout_of($r) eq "$sess\n" && !((($r->{result} // {})->{kernel} // {})->{state_lost});
    }
    is($ok, 5, 'the next cells run on their kernels, state kept');
    my ($new) = agents();
    ok($new && $new != $old, "a new agent ($new)");
    # the agent's end is seen reading (its EOF) or, when the next frame was
    # on its way, writing: either is said
    my $said = qr/the connection to the kernel host \S+ broke: (?:the agent exited|Socket error[^;]*); reconnecting|the kernel host \S+ cannot be reached: ssh channel[^;]*; retrying/;
    ok(wait_until(sub { $t->error_log =~ $said }, 5), 'error.log says the agent exited')
        or diag(join "\n", grep { /hermes: the/ } split /\n/, $t->error_log);
}

$t->stop;
ok(wait_until(sub { !agents() }, 3), 'the agent goes with the worker');
$t->kill_strays;
$s->stop;
done_testing;
