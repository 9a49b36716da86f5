#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A kernel host that dies while a spawn's first command is on its way to
# it (sent, not yet answered, the worker's link not yet aware the host is
# gone): the new session goes to the other host instead of failing with
# 502, and the dead host is skipped for the sessions after it.
#
# The race is made certain: the host's sshd, its sessions and the agent
# are stopped (SIGSTOP) so the command sits unread on the connection,
# then the sessions are killed (SIGKILL) and the connection breaks under
# the command.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

my $t = Hermes::Test->new(workers => 1, error_log_level => 'debug');
my $p = $t->prefix;

my $s1 = Hermes::Sshd->new(dir => "$p/ssh1", port => $t->port(5));
my $s2 = Hermes::Sshd->new(dir => "$p/ssh2", port => $t->port(6));
my %sshd = ($s1->port => $s1, $s2->port => $s2);

# one identity for both hosts, one known_hosts holding both host keys
$s1->share_with("$p/known_hosts_both", $s2);

$s1->start;
$s2->start;

my ($P1, $P2, $ID) = ($s1->port, $s2->port, $s1->identity);
$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 30s;

        location = /two {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P1 host=127.0.0.1:$P2
                known_hosts=%%PREFIX%%/known_hosts_both user=root
                identity=$ID root=%%KROOT%% connect_timeout=3s;
        }

        location /kernels {
            hermes_kernels;
        }
    }
CONF
$t->run;

sub run_cell {
    my ($s, $code) = @_;
    return $t->execute('/two', { session => $s, code => $code }, timeout => 40);
}

# the sshd port a process was started through (SSH_CONNECTION in its
# initial environment)
sub ssh_port_of {
    my ($pid) = @_;
    return '' unless $pid;
    open my $fh, '<:raw', "/proc/$pid/environ" or return '';
    local $/;
    my $env = <$fh> // '';
    return $env =~ /(?:^|\0)SSH_CONNECTION=\S+ \d+ \S+ (\d+)(?:\0|$)/ ? $1 : '';
}

# the sshd port of each session's kernel host (both hosts are 127.0.0.1:
# its runner's environment tells them apart)
sub hosts {
    my $r = $t->http('GET', '/kernels');
    return { map { ($_->{session} => ssh_port_of(runner_pid($_->{kernel_id}))) }
             @{ ($r->{json} // {})->{kernels} // [] } };
}

###############################################################################
# three sessions: one host holds two kernels, the other one; a new session
# goes to the host with fewer

for my $s (qw(a b c)) {
    my $r = run_cell($s, "print('$s')");
    is((($r->{result} // {})->{output}), "$s\n", "session $s runs") or diag explain $r;
}
my $h = hosts();
my %count;
$count{$_}++ for values %$h;
is(scalar(keys %count), 2, 'the sessions are spread over both hosts') or diag explain $h;
my ($victim) = sort { $count{$a} <=> $count{$b} } keys %count;
my ($other) = grep { $_ ne $victim } keys %count;
my $sv = $sshd{$victim};
ok($sv, "the next new session goes to $victim (fewer kernels)") or BAIL_OUT('no victim host');

###############################################################################
# the victim host hangs, a new session's first command is sent to it,
# then the host dies

my $off = length $t->error_log;
$sv->freeze;
my $bg = $t->execute_async('/two', { session => 'd', code => "print('d')" }, timeout => 40);
ok(wait_until(sub { substr($t->error_log, $off) =~ /ssh exec on 127\.0\.0\.1: sh -c SCRIPT hermes dir / }, 10),
    'the spawn sent its directory step to the frozen host');
sleep 0.5;                                  # written to the connection
kill 'KILL', $sv->descendants($sv->pid);    # its sessions: the link breaks
my $t0 = time;
my $r = $bg->wait;
is((($r->{result} // {})->{status}), 'success', 'the new session still runs')
    or diag "status $r->{status}: " . substr($r->{content} // $r->{raw} // $r->{error} // '', 0, 400);
is(hosts()->{d}, $other, '  on the other host');
ok(time - $t0 < 10, sprintf('  at once (%.2fs)', time - $t0));
like(substr($t->error_log, $off), qr/\[warn\] .*; trying another host/,
    'error.log: a warn line says it tried another host');

# the dead host is skipped: the next new session goes to the other too,
# although the dead one holds fewer kernels
$r = run_cell('e', "print('e')");
is((($r->{result} // {})->{output}), "e\n", 'the next new session runs');
is(hosts()->{e}, $other, '  on the other host as well');

kill 'CONT', $sv->pid;
$sv->stop;
$_->stop for $s1, $s2;

done_testing();
