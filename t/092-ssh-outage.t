#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The ssh connection to the kernel host goes away mid-cell (sshd stopped, its
# connections killed, then started again on the same port): an outage
# shorter than the cell's remaining timeout loses nothing, every line
# arrives once and in order; a longer one ends the cell by its deadline
# with an error that names the host.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

my $t = Hermes::Test->new(error_log_level => 'info', workers => 1);
my $p = $t->prefix;

my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5), record => 1);
my $P = $s->port;
$s->start;

my $ID = $s->identity;
my $KH = $s->known_hosts;
$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 30s;

        location = /v1/execute {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P known_hosts=$KH user=root
                identity=$ID root=%%KROOT%% connect_timeout=2s;
        }
    }
CONF
$t->run;

sub dir_of { $t->kroot . "/hermes_rkernel_$_[0]" }

# the kernel-host agents this test's sshd runs (SSH_CONNECTION names its
# port): one for the worker, whatever the cells
sub agents {
    return grep {
        my $env = slurp("/proc/$_/environ") // '';
        $env =~ /(?:^|\0)SSH_CONNECTION=\S+ \d+ \S+ \Q$P\E(?:\0|$)/
    } procs_matching(qr/hermes_agent\.py/);
}

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

# how many lines the kernel has written to the cell's output so far
sub lines_written {
    my ($kid, $n) = @_;
    my $f = dir_of($kid) . sprintf('/cells/cell_out_%06d', $n);
    open my $fh, '<', $f or return 0;
    local $/;
    my $c = <$fh> // '';
    return () = $c =~ /line \d+/g;
}

my $numbered = "import time\nfor i in range(30):\n    print(f'line {i}', flush=True)\n"
             . "    time.sleep(0.2)\n";
my $want = join '', map { "line $_\n" } 0 .. 29;

###############################################################################
# a 4 s outage in the middle of a 6 s cell (timeout 20 s): nothing lost

{
    my $r = $t->execute('/v1/execute', { session => 'out-a', code => 'k = 7' });
    my $kid = (($r->{result} // {})->{kernel} // {})->{kernel_id} // '';
    ok($kid, 'a kernel over ssh');
    my $pid = runner_pid($kid);
    my $ncmd = () = $s->commands;

    my $t0 = time;
    my $bg = $t->execute_async('/v1/execute',
        { session => 'out-a', code => $numbered, timeout => 20 }, timeout => 40);
    ok(wait_until(sub { lines_written($kid, 2) >= 5 }, 10), 'the cell is printing');
    $s->stop;    # kills the connections too
    my $down = time;
    ok(wait_until(sub { !agents() }, 3), 'the outage ended the agent on the host');
    sleep 4;
    $s->start;
    my $up = time;
    my $w = lines_written($kid, 2);
    ok($w > 5 && $w < 30, "the kernel went on printing during the outage ($w lines)");
    $r = $bg->wait;
    my $took = time - $t0;

    is(($r->{result} // {})->{status}, 'success', 'outage of 4 s: the cell succeeds')
        or diag explain $r->{result} // $r;
    is(stdout_of($r), $want, 'outage of 4 s: every numbered line arrived once, in order')
        or diag stdout_of($r);
    is(($r->{result} // {})->{output}, $want, 'outage of 4 s: the result holds all the output');
    ok($took < 12, sprintf('answered in %.2fs (outage %.1f s)', $took, $up - $down));

    my @sent = ($s->commands)[$ncmd .. (() = $s->commands) - 1];
    is(scalar(grep { /hermes_agent\.py/ } @sent), 1, 'a new agent after the outage')
        or diag explain \@sent;
    like($t->error_log, qr/cell 2 in "[^"]*\/hermes_rkernel_\Q$kid\E" resumes at offset [1-9]\d*\n/,
        'the cell was resumed from the offset reached');

    $r = $t->execute('/v1/execute', { session => 'out-a', code => 'print(k)' });
    is(($r->{result} // {})->{output}, "7\n", 'and the kernel kept its state');
    is((($r->{result} // {})->{kernel} // {})->{kernel_id}, $kid, 'same kernel');
    is(runner_pid($kid), $pid, 'same runner');
    is(scalar(agents()), 1, 'one agent on the host');
}

###############################################################################
# a quiet cell: the agent cut off on the host does not wait for output to
# fail on, it goes with its connection; the resumed one finishes the cell

{
    my $r = $t->execute('/v1/execute', { session => 'out-q', code => 'k = 9' });
    my $kid = (($r->{result} // {})->{kernel} // {})->{kernel_id} // '';
    my $bg = $t->execute_async('/v1/execute', { session => 'out-q', timeout => 20,
        code => "import time\nprint('a', flush=True)\ntime.sleep(4)\nprint('b')" },
        timeout => 40);
    ok(wait_until(sub { lines_written($kid, 2) || -s dir_of($kid) . '/cells/cell_out_000002' }, 10)
        && wait_until(sub { agents() }, 5), 'a quiet cell is relayed');
    # sshd and its connection processes die, what they ran is orphaned
    my @sshd = grep { (slurp("/proc/$_/comm") // '') =~ /^sshd/ } $s->descendants;
    kill 'KILL', @sshd;
    $s->stop(keep_sessions => 1);
    ok(wait_until(sub { !agents() }, 1), 'the outage ends the agent on the host at once')
        or diag 'left: ' . join(' ', agents());
    sleep 1;
    $s->start;
    $r = $bg->wait;
    is(($r->{result} // {})->{status}, 'success', 'quiet cell: success after the outage')
        or diag explain $r->{result} // $r;
    is(stdout_of($r), "a\nb\n", 'quiet cell: its output once, in order');
    is(scalar(agents()), 1, 'one agent on the host');
}

###############################################################################
# the outage outlasts the cell's timeout (4 s): the cell ends by its deadline
# with an error naming the host; the kernel is killed once the host is back

{
    my $r = $t->execute('/v1/execute', { session => 'out-b', code => 'k = 8' });
    my $kid = (($r->{result} // {})->{kernel} // {})->{kernel_id} // '';
    ok($kid, 'a second kernel over ssh');
    my $pid = runner_pid($kid);

    my $t0 = time;
    my $bg = $t->execute_async('/v1/execute',
        { session => 'out-b', code => $numbered, timeout => 4 }, timeout => 40);
    ok(wait_until(sub { lines_written($kid, 2) >= 3 }, 10), 'the cell is printing');
    $s->stop;

    # something else on the port while sshd is away: it counts the
    # connections the ssh backend makes to reach the host again
    my $fake = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $P,
        Proto => 'tcp', Listen => 128, ReuseAddr => 1) or die "listen $P: $!";
    $fake->blocking(0);
    my @conns;

    $r = $bg->wait;
    my $took = time - $t0;
    while (my $c = $fake->accept) { push @conns, $c }
    my $before = @conns;

    is(($r->{result} // {})->{status}, 'error', 'outage past the deadline: status error')
        or diag explain $r->{result} // $r;
    like(($r->{result} // {})->{error} // '',
        qr/kernel host 127\.0\.0\.1:$P could not be reached for \d+(?:\.\d)? s during the cell/,
        'the error names the host and says it could not be reached');
    like(($r->{result} // {})->{error} // '', qr/state is lost/,
        'the error says the session state is lost');
    ok($took > 4 - 1 && $took < 4 + 1.5,
        sprintf('the cell ended by its deadline: %.2fs (timeout 4 s)', $took));
    ok($before >= 1, "the ssh backend kept trying ($before connections)");
    my $got = stdout_of($r);
    ok($got =~ /^line 0\n/ && index($want, $got) == 0,
        'what came before the outage was streamed, once, in order') or diag $got;

    close $_ for @conns;
    close $fake;

    ok(pid_alive($pid), 'the kernel lives on while its host is unreachable');
    $s->start;
    ok(wait_until(sub { !pid_alive($pid) }, 15), 'once the host is back the kernel is killed');
    ok(wait_until(sub { !-d dir_of($kid) }, 5), '  and its directory removed');

    $r = $t->execute('/v1/execute', { session => 'out-b', code => "print('k' in globals())" });
    is(($r->{result} // {})->{output}, "False\n", 'the next cell runs on a fresh kernel');
    is((($r->{result} // {})->{kernel} // {})->{state_lost}, JSON::PP::true, '  which says state_lost');
}

$t->stop;
$s->stop;
done_testing;
