#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The ssh backend against a real OpenSSH sshd on 127.0.0.1 (the "remote"
# kernel host is this machine, its root under KROOT): cells, state,
# streaming, the lockdown invariants over ssh, host-key checking, hosts
# that are down, stuck or refuse the directory, kernels that die or time
# out, and two hosts.

use strict;
use warnings;

use Test::More;
use POSIX ();
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

# a test stopped by a signal still runs END: nginx, sshd and kernels go
$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

# one worker: "the worker is not blocked" checks mean something
my $t = Hermes::Test->new(error_log_level => 'debug', workers => 1);
my $p = $t->prefix;

my $s1 = Hermes::Sshd->new(dir => "$p/ssh1", port => $t->port(5), record => 1);
my $s2 = Hermes::Sshd->new(dir => "$p/ssh2", port => $t->port(6));
my $P1 = $s1->port;
my $P2 = $s2->port;
my $DOWN = $t->port(7);     # nothing ever listens there
my $STUCK = $t->port(8);    # accepts TCP, never speaks

# one identity for both hosts, one known_hosts holding both host keys
$s1->share_with("$p/known_hosts_both", $s2);

my $stuck = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $STUCK,
    Proto => 'tcp', Listen => 128, ReuseAddr => 1) or die "listen $STUCK: $!";

$s1->start;

my $ID = $s1->identity;
my $common = "user=root identity=$ID root=%%KROOT%% connect_timeout=3s";
my $KH = $s1->known_hosts;
$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 30s;

        location = /v1/execute {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P1 known_hosts=$KH $common;
        }

        location = /v1/unknown {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P1 known_hosts=${\ $s1->empty_known_hosts } $common;
        }

        location = /v1/changed {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P1 known_hosts=${\ $s1->bad_known_hosts } $common;
        }

        location = /v1/down {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$DOWN known_hosts=$KH $common;
        }

        location = /v1/stuck {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$STUCK known_hosts=$KH $common;
        }

        location = /v1/nodir {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P1 known_hosts=$KH user=root
                identity=$ID root=/proc/hermes-nope connect_timeout=3s;
        }

        location = /v1/two {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:$P1 host=127.0.0.1:$P2
                known_hosts=%%PREFIX%%/known_hosts_both $common;
        }

        location /v1/kernels {
            hermes_kernels;
        }

        location = /v1/status {
            hermes_status;
        }
    }
CONF
$t->run;

###############################################################################
# helpers

sub run_cell {
    my ($loc, $s, $code, %o) = @_;
    my %body = (session => $s, code => $code);
    $body{timeout} = delete $o{cell_timeout} if $o{cell_timeout};
    return $t->execute($loc, \%body, timeout => 40, %o);
}

sub dir_of { $t->kroot . "/hermes_rkernel_$_[0]" }


# the sshd port a process was started through (SSH_CONNECTION in its
# initial environment), or undef for one not started over ssh
sub ssh_port_of {
    my ($pid) = @_;
    return undef unless $pid;
    open my $fh, '<:raw', "/proc/$pid/environ" or return undef;
    local $/;
    my $env = <$fh> // '';
    return $env =~ /(?:^|\0)SSH_CONNECTION=\S+ \d+ \S+ (\d+)(?:\0|$)/ ? $1 : undef;
}

# the kernel-host agents (src/remote/hermes_agent.py, run by the loader on
# the command line) this test's sshds run: one a worker, backend and host,
# however many cells run
sub agents {
    return grep { my $p = ssh_port_of($_) // 0; $p == $P1 || $p == $P2 }
        procs_matching(qr/hermes_agent\.py/);
}

# the worker's unix sockets (the cell streams' socketpairs live there; TCP
# sockets to sshd are cached sessions and do not count)
sub worker_unix_sockets {
    my ($w) = $t->worker_pids or return -1;
    my %unix;
    open my $fh, '<', '/proc/net/unix' or return -1;
    while (<$fh>) { my @f = split; $unix{$f[6]} = 1 if @f > 6 && $f[6] =~ /^\d+$/ }
    my $n = 0;
    for my $fd (glob "/proc/$w/fd/*") {
        my $l = readlink($fd) // next;
        $n++ if $l =~ /^socket:\[(\d+)\]$/ && $unix{$1};
    }
    return $n;
}

sub no_socket_leak {
    my ($before, $name) = @_;
    my $now;
    ok(wait_until(sub { ($now = worker_unix_sockets()) <= $before }, 3),
        "$name: no socket left open in the worker")
        or diag "worker unix sockets: $before before, $now after";
}


sub listing {
    my $r = $t->http('GET', '/v1/kernels');
    return { map { $_->{session} => $_ } @{ ($r->{json} // {})->{kernels} // [] } };
}

sub mode { my @s = lstat $_[0]; return @s ? sprintf('%o', $s[2] & 07777) : 'missing' }

sub log_since { my ($off) = @_; return substr($t->error_log, $off) }

sub fails_before_stream {
    my ($r, $status, $code, $name) = @_;
    is($r->{status}, $status, "$name: $status")
        or diag "got $r->{status} " . substr($r->{content} // '', 0, 300);
    is(($r->{json} // {})->{error}{code}, $code, "$name: $code");
}

###############################################################################
# watch every argv while kernels spawn and cells run

my $marker = 'MARKER' . int(rand(1e9)) . 'SSHCODE';
my $generic = qr/HERMES_RPC_TOKEN|[0-9a-f]{64}|\Q$marker\E/;
my %baseline;
{
    my $all = all_cmdlines();
    $baseline{$all->{$_}} = 1 for grep { $all->{$_} =~ $generic } keys %$all;
}
my $watch_file = "$p/argv-watch";
my $watcher = fork // die;
if ($watcher == 0) {
    my %seen;
    my $end = time + 120;
    while (time < $end && !-e "$watch_file.stop") {
        my $all = all_cmdlines();
        for my $pid (keys %$all) {
            my $cmd = $all->{$pid};
            next unless $cmd =~ $generic;
            next if $baseline{$cmd};
            (my $shown = $cmd) =~ s/\0/ /g;
            $seen{"pid $pid: $shown"}++;
        }
    }
    open my $out, '>', $watch_file or die;
    print $out "$_\n" for keys %seen;
    close $out;
    POSIX::_exit(0);
}

###############################################################################
# a cell runs over ssh; state persists; streaming is incremental

my $r = run_cell('/v1/execute', 'ssh-a', "x = 41\nprint('hello from ssh')");
is($r->{status}, 200, 'first cell over ssh: 200') or diag $r->{content};
is(($r->{result} // {})->{status}, 'success', 'first cell: success') or diag explain $r->{events};
is(($r->{result} // {})->{output}, "hello from ssh\n", 'first cell: output');
is(($r->{events}[0] // {})->{type}, 'kernel', 'kernel line first');
is(($r->{result} // {})->{kernel}{reused}, JSON::PP::false, 'a new kernel');
my $kA = ($r->{result} // {})->{kernel}{kernel_id};
my $pidA = runner_pid($kA);
ok($pidA, 'the runner runs (under KROOT, the "remote" root)');
is(ssh_port_of($pidA), $P1, "the runner was started over ssh (SSH_CONNECTION ends in port $P1)");
like($s1->log, qr/Accepted publickey for root from 127\.0\.0\.1/, 'sshd: public-key login');

$r = run_cell('/v1/execute', 'ssh-a', "print(x + 1)");
is(($r->{result} // {})->{output}, "42\n", 'state persists across cells');
is(($r->{result} // {})->{kernel}{reused}, JSON::PP::true, 'same kernel reused');
is(($r->{result} // {})->{kernel}{kernel_id}, $kA, 'same kernel id');
is(($r->{result} // {})->{execution_count}, 2, 'execution_count 2');

$r = run_cell('/v1/execute', 'ssh-a',
    "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')");
{
    my @ev = @{ $r->{events} };
    my ($i_first) = grep { ($ev[$_]{type} // '') eq 'stdout' && ($ev[$_]{text} // '') =~ /first/ } 0 .. $#ev;
    my $t_first = defined $i_first ? $r->{times}[$i_first] : undef;
    my $t_end = $r->{times}[-1];
    ok(defined $t_first && $t_end - $t_first > 0.8,
        sprintf('streaming: the line before a 1 s sleep arrived %.2fs before the result',
            defined $t_first ? $t_end - $t_first : -1))
        or diag explain \@ev;
    is(($r->{result} // {})->{output}, "first\nsecond\n", 'streamed cell: output');
}

# modes on the kernel host, while a cell runs
{
    # (a request too large for the wake FIFO, so it is a file: its mode too)
    my $bg = $t->execute_async('/v1/execute', { session => 'ssh-a',
        code => "import time\nprint('x' * 10, flush=True)\ntime.sleep(1.5)\n#"
            . ('p' x 5000) }, timeout => 30);
    my $dir = dir_of($kA);
    ok(wait_until(sub { -e "$dir/cells/cell_out_000004" }, 10), 'a cell is running');
    is(mode($dir), '700', 'kernel dir 0700');
    is(mode("$dir/cells"), '700', 'cells/ 0700');
    is(mode("$dir/rpc"), '700', 'rpc/ 0700');
    ok(!-e "$dir/kernel.env", 'kernel.env removed after it was sourced');
    my (@files, @dirs);
    my @todo = ($dir);
    while (my $d = shift @todo) {
        opendir my $dh, $d or next;
        for my $e (grep { !/^\.\.?$/ } readdir $dh) {
            if (-d "$d/$e" && !-l "$d/$e") { push @dirs, "$d/$e"; push @todo, "$d/$e" }
            else { push @files, "$d/$e" }
        }
    }
    ok(scalar(grep { m{/kernel_runner\.py$} } @files), 'runner shipped');
    ok(scalar(grep { m{/cells/cell_req_000004\.json$} } @files), 'cell request on the kernel host');
    for my $d (sort @dirs) {
        is(mode($d), '700', substr($d, length($dir) + 1) . '/ is 0700');
    }
    for my $f (sort @files) {
        is(mode($f), '600', substr($f, length($dir) + 1) . ' is 0600');
    }
    is(($bg->wait->{result} // {})->{status}, 'success', 'the background cell finished');
}

my $list = listing();
ok($list->{'ssh-a'}, 'listing has the ssh kernel');
is(($list->{'ssh-a'} // {})->{backend}, 'ssh', 'listing: backend "ssh"');
like(($list->{'ssh-a'} // {})->{host} // '', qr/^127\.0\.0\.1(?::$P1)?$/, 'listing: host 127.0.0.1');
is(($list->{'ssh-a'} // {})->{kernel_id}, $kA, 'listing: kernel id');

###############################################################################
# the token: the kernel's code reads it; no argv, environ, log line, or
# command sent over ssh ever holds it or the code

my %token;    # token => session
for my $s (1 .. 3) {
    my $rr = run_cell('/v1/execute', "ssh-lock$s", "secret_code = '$marker'\nprint('ok')");
    is(($rr->{result} // {})->{status}, 'success', "ssh-lock$s spawned and ran");
    $rr = run_cell('/v1/execute', "ssh-lock$s", "import hermes_tools\nprint(hermes_tools._token)");
    my $tok = ($rr->{result} // {})->{output} // '';
    chomp $tok;
    $token{$tok} = "ssh-lock$s";
}
is(scalar keys %token, 3, 'three kernels, three tokens');
ok(!grep({ !/^[0-9a-f]{64}$/ } keys %token), 'each token is 64 hex (32 bytes)') or diag explain \%token;

$r = run_cell('/v1/execute', 'ssh-lock2',
    "import os, subprocess\nprint(os.environ.get('HERMES_RPC_TOKEN'))\n"
  . "print('HERMES_RPC' in subprocess.run(['env'], capture_output=True, text=True).stdout)");
is(($r->{result} // {})->{output}, "None\nFalse\n", 'token not in the environment a cell and its children see');

{
    my $envs = all_environs();
    my $cmds = all_cmdlines();
    my $errlog = $t->error_log;
    my $sshlog = $s1->log;
    my @sent = $s1->commands;
    ok(scalar @sent, scalar(@sent) . ' commands recorded by sshd (ForceCommand wrapper)');
    for my $tok (sort keys %token) {
        my $s = $token{$tok};
        my @in_env = grep { index($envs->{$_}, $tok) >= 0 } keys %$envs;
        is("@in_env", '', "$s: token in no /proc/*/environ");
        my @in_argv = grep { index($cmds->{$_}, $tok) >= 0 } keys %$cmds;
        is("@in_argv", '', "$s: token in no argv now");
        ok(index($errlog, $tok) < 0, "$s: token in no error.log line (debug level)");
        ok(index($sshlog, $tok) < 0, "$s: token in no sshd.log line");
        ok(!grep({ index($_, $tok) >= 0 } @sent), "$s: token in no command sent over ssh");
    }
    ok(!grep({ index($_, $marker) >= 0 } @sent), 'the code is in no command sent over ssh');
    ok(!grep({ /HERMES_RPC_TOKEN/ } @sent), 'HERMES_RPC_TOKEN is in no command sent over ssh');
    ok(index($errlog, $marker) < 0, 'the code is in no error.log line');

    # the spawn steps of docs/internals.md, in order, for a kernel (each
    # after the line that sends its stderr where its stdout goes)
    my $dir = dir_of($kA);
    my @mine = grep { index($_, $dir) >= 0 || index($_, " $kA ") >= 0 } @sent;
    my ($i_dirs) = grep { $mine[$_] =~ /^sh -c SCRIPT hermes dir \S+ \Q$kA\E [0-9a-f]{16} [0-9a-f]{16}$/ } 0 .. $#mine;
    my ($i_ship) = grep { $mine[$_] =~ /^sh -c SCRIPT hermes ship \S+ \Q$kA\E kernel_runner\.py \d+ .* kernel\.env \d+$/ } 0 .. $#mine;
    my ($i_start) = grep { $mine[$_] =~ /^sh -c SCRIPT hermes start \S+ \Q$kA\E hermes-kernel nobody \d+ \d+ \d+ auto python3 '' --unshare-all .* --bind \Q$dir\E \Q$dir\E --chdir \Q$dir\E .*--setenv HOME \/tmp$/ } 0 .. $#mine;
    ok(defined $i_dirs && defined $i_ship && defined $i_start
        && $i_dirs < $i_ship && $i_ship < $i_start,
        'the spawn steps of docs/internals.md were sent over ssh, in order')
        or diag "commands for $dir:\n" . join("\n", map { "  [$_] $mine[$_]" } 0 .. $#mine);
}

###############################################################################
# a slow cell on one kernel does not hold up another kernel on the same host
# (one worker: nothing waits on the network in the event loop)

{
    my $slow = $t->execute_async('/v1/execute', { session => 'ssh-lock1',
        code => "import time\nprint('slow', flush=True)\ntime.sleep(2.5)" }, timeout => 30);
    ok(wait_until(sub { ($t->http('GET', '/v1/status')->{json} // {})->{running} }, 5),
        'a slow cell is running');
    my $t0 = time;
    my $rr = run_cell('/v1/execute', 'ssh-lock2', "print('quick')");
    my $took = time - $t0;
    is(($rr->{result} // {})->{output}, "quick\n", 'another kernel answers meanwhile');
    ok($took < 1.5, sprintf('not held up by the slow cell (%.2fs)', $took));
    is(($slow->wait->{result} // {})->{status}, 'success', 'the slow cell finished');
}

open my $stop, '>', "$watch_file.stop"; close $stop;
waitpid $watcher, 0;
{
    open my $in, '<', $watch_file or die;
    my @leaks = <$in>;
    is(scalar @leaks, 0, 'no argv ever held a token or the code while spawning and running over ssh')
        or diag "argv: @leaks";
}

###############################################################################
# host keys: unknown and changed keys are refused, nothing is run

for my $case (['unknown', '/v1/unknown', $s1->empty_known_hosts],
              ['changed', '/v1/changed', $s1->bad_known_hosts])
{
    my ($name, $loc, $khfile) = @$case;
    my $kh_before = do { local (@ARGV, $/) = $khfile; <> } // '';
    my $ncmd = () = $s1->commands;
    my $off = length $t->error_log;
    my $t0 = time;
    my $rr = run_cell($loc, "ssh-hk-$name", "print('must not run')");
    my $took = time - $t0;
    fails_before_stream($rr, 502, 'backend_unavailable', "$name host key");
    ok($took < 5, sprintf("$name host key: answered in %.2fs", $took));
    my $log = log_since($off);
    like($log, qr/host.?key|known.?hosts/i, "$name host key: error.log names the host key problem")
        or diag $log;
    is((() = $s1->commands), $ncmd, "$name host key: no command was run on the host");
    my $kh_after = do { local (@ARGV, $/) = $khfile; <> } // '';
    is($kh_after, $kh_before, "$name host key: known_hosts left as it was (nothing learnt)");
    ok(!listing()->{"ssh-hk-$name"}, "$name host key: no kernel registered");
}

###############################################################################
# hosts that are down or stuck: 502 backend_unavailable within connect_timeout

{
    my $t0 = time;
    my $rr = run_cell('/v1/down', 'ssh-down', 'print(1)');
    my $took = time - $t0;
    fails_before_stream($rr, 502, 'backend_unavailable', 'sshd not running');
    ok($took < 3 + 1.5, sprintf('sshd not running: answered in %.2fs (connect_timeout 3s)', $took));
    ok(!listing()->{'ssh-down'}, 'sshd not running: no kernel registered');
}

{
    my $t0 = time;
    my $bg = $t->execute_async('/v1/stuck', { session => 'ssh-stuck', code => 'print(1)' }, timeout => 30);
    sleep 0.3;
    my $t1 = time;
    my $rr = run_cell('/v1/execute', 'ssh-a', "print('meanwhile')");
    my $took1 = time - $t1;
    is(($rr->{result} // {})->{output}, "meanwhile\n", 'a host that never answers: other cells run meanwhile');
    ok($took1 < 1.5, sprintf('  and are not held up (%.2fs)', $took1));
    $rr = $bg->wait;
    my $took = time - $t0;
    fails_before_stream($rr, 502, 'backend_unavailable', 'a host that never answers');
    ok($took < 3 + 2, sprintf('a host that never answers: answered in %.2fs (connect_timeout 3s)', $took));
}

###############################################################################
# a failed directory step: spawn_failed, nothing shipped, nothing started

{
    my %before = map { $_ => 1 } runner_procs();
    my $ncmd = () = $s1->commands;
    my $off = length $t->error_log;
    my $rr = run_cell('/v1/nodir', 'ssh-nodir', 'print(1)');
    fails_before_stream($rr, 502, 'spawn_failed', 'failed directory setup');
    my @new = grep { !$before{$_} && (ssh_port_of($_) // 0) == $P1 } runner_procs();
    is("@new", '', 'failed directory setup: no runner started');
    ok(!-e '/proc/hermes-nope', 'failed directory setup: nothing created');
    my @sent = ($s1->commands)[$ncmd .. (() = $s1->commands) - 1];
    my @nope = grep { m{/proc/hermes-nope} } @sent;
    ok(scalar(grep { /^sh -c SCRIPT hermes dir / } @nope), 'the directory step was sent') or diag explain \@sent;
    is(join("\n", grep { /cat >|kernel_runner\.py|kernel\.env/ && !/^rm -rf/ } @nope), '',
        'nothing shipped or started after the failed directory step');
    like(log_since($off), qr/spawning a kernel for session "ssh-nodir" failed: directory setup/,
        'error.log names the failed step');
    ok(!listing()->{'ssh-nodir'}, 'no kernel registered');
}

###############################################################################
# a kernel killed between cells is replaced: state_lost

{
    my $rr = run_cell('/v1/execute', 'ssh-dies', "z = 1");
    my $socks = worker_unix_sockets();
    my $kid = ($rr->{result} // {})->{kernel}{kernel_id};
    my $pid = runner_pid($kid);
    ok($pid, 'kernel to kill');
    kill 'KILL', $pid if $pid;
    ok(wait_until(sub { !pid_alive($pid) && all_threads_gone($pid) }, 5), 'killed from outside');
    $rr = run_cell('/v1/execute', 'ssh-dies', "print('z' in globals())");
    is(($rr->{result} // {})->{status}, 'success', 'dead kernel replaced') or diag explain $rr->{events};
    is(($rr->{result} // {})->{kernel}{state_lost}, JSON::PP::true, 'replaced: state_lost');
    is(($rr->{result} // {})->{output}, "False\n", 'replaced: fresh state');
    isnt(($rr->{result} // {})->{kernel}{kernel_id}, $kid, 'replaced: a new kernel');
    no_socket_leak($socks, 'replaced a dead kernel');
}

###############################################################################
# a kernel that dies mid-cell ends the stream at once

{
    my $rr = run_cell('/v1/execute', 'ssh-crash', "w = 1");
    my $socks = worker_unix_sockets();
    my $t0 = time;
    $rr = run_cell('/v1/execute', 'ssh-crash',
        "import os, signal, time\nprint('bye', flush=True)\ntime.sleep(0.2)\nos.kill(os.getpid(), signal.SIGKILL)",
        cell_timeout => 20);
    my $took = time - $t0;
    is(($rr->{result} // {})->{status}, 'error', 'died mid-cell: status error') or diag explain $rr->{events};
    ok($took < 3, sprintf('died mid-cell: the stream ended in %.2fs (cell timeout 20 s)', $took));
    my $kid = ($rr->{result} // {})->{kernel}{kernel_id} // '';
    ok((grep { ($_->{text} // '') =~ /bye/ } @{ $rr->{events} }), 'died mid-cell: what it printed was streamed');
    $rr = run_cell('/v1/execute', 'ssh-crash', "print('w' in globals())");
    is(($rr->{result} // {})->{kernel}{state_lost}, JSON::PP::true, 'after a crash: state_lost');
    is(($rr->{result} // {})->{output}, "False\n", 'after a crash: fresh state');
    no_socket_leak($socks, 'died mid-cell');
}

###############################################################################
# a timed-out cell kills the remote process group and removes the dir

{
    my $rr = run_cell('/v1/execute', 'ssh-slow', "v = 'kept'");
    my $socks = worker_unix_sockets();
    my $kid = ($rr->{result} // {})->{kernel}{kernel_id};
    my $pid = runner_pid($kid);
    ok($pid, 'runner of the kernel to time out');
    my $t0 = time;
    $rr = run_cell('/v1/execute', 'ssh-slow',
        "import subprocess, time\nsubprocess.Popen(['sleep', '309'])\nprint('sleeping', flush=True)\n"
        . "while True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass",
        cell_timeout => 1);
    my $took = time - $t0;
    is(($rr->{result} // {})->{status}, 'timeout', 'status timeout');
    like(($rr->{result} // {})->{error} // '', qr/did not stop when interrupted; its kernel was killed/,
        'a cell that does not stop when interrupted: its kernel is killed');
    ok($took < 6, sprintf('answered at the timeout and its grace (%.2fs)', $took));
    ok((grep { ($_->{text} // '') eq "sleeping\n" } @{ $rr->{events} }), 'output before the timeout streamed');
    ok(wait_until(sub { !pid_alive($pid) }, 5), 'runner killed');
    ok(wait_until(sub { !procs_matching(qr/^sleep 309$/) }, 5), 'its child killed too (process group)');
    ok(wait_until(sub { !-d dir_of($kid) }, 5), 'kernel directory removed');
    $rr = run_cell('/v1/execute', 'ssh-slow', "print('v' in globals())");
    is(($rr->{result} // {})->{kernel}{state_lost}, JSON::PP::true, 'next call: state_lost');
    is(($rr->{result} // {})->{output}, "False\n", 'next call: fresh state');
    no_socket_leak($socks, 'timed out');
}

###############################################################################
# the ssh connection breaks mid-cell (sshd restarted, its connections
# killed): the kernel lives on, the cell's output and result still arrive

{
    my $rr = run_cell('/v1/execute', 'ssh-break', "k = 7");
    my $kid = ($rr->{result} // {})->{kernel}{kernel_id};
    my $restarted = 0;
    my $t0 = time;
    $rr = run_cell('/v1/execute', 'ssh-break',
        "import time\nprint('before', flush=True)\ntime.sleep(1.5)\nprint('after', k)",
        cell_timeout => 20,
        on_event => sub {
            my ($e) = @_;
            if (!$restarted && ($e->{type} // '') eq 'stdout') {
                $restarted = 1;
                $s1->stop;    # kills the connections too
                $s1->start;
            }
            return;
        });
    my $took = time - $t0;
    ok($restarted, 'sshd restarted mid-cell');
    is(($rr->{result} // {})->{status}, 'success', 'channel broken mid-cell: the cell still succeeds')
        or diag explain $rr->{events};
    my $text = join '', map { $_->{text} // '' } grep { ($_->{type} // '') eq 'stdout' } @{ $rr->{events} };
    is($text, "before\nafter 7\n", 'channel broken mid-cell: all output streamed once, in order');
    ok($took < 10, sprintf('channel broken mid-cell: answered in %.2fs', $took));
    $rr = run_cell('/v1/execute', 'ssh-break', "print(k)");
    is(($rr->{result} // {})->{output}, "7\n", 'and the kernel kept its state');
    is(($rr->{result} // {})->{kernel}{kernel_id}, $kid, 'same kernel');
    if ((($rr->{result} // {})->{kernel}{kernel_id} // '') ne $kid) {
        is($rr->{result}{kernel}{state_lost}, JSON::PP::true,
            '(a replaced kernel at least says state_lost)');
    }
}

###############################################################################
# two hosts: new kernels spread over both; with one down, the other serves

$s2->start;
{
    my %port;
    for my $s ('two-a', 'two-b') {
        my $rr = run_cell('/v1/two', $s, "print('on two')");
        is(($rr->{result} // {})->{status}, 'success', "$s: success") or diag $rr->{content};
        my $pid = runner_pid(($rr->{result} // {})->{kernel}{kernel_id});
        $port{$s} = ssh_port_of($pid) // 'none';
    }
    is(join(',', sort values %port), join(',', sort ($P1, $P2)),
        'two sessions: one kernel on each host (by the sshd they came through)')
        or diag explain \%port;
    my $l = listing();
    for my $s ('two-a', 'two-b') {
        is(($l->{$s} // {})->{backend}, 'ssh', "listing: $s backend ssh");
        like(($l->{$s} // {})->{host} // '', qr/^127\.0\.0\.1(?::(?:$P1|$P2))?$/, "listing: $s host");
    }
    if (($l->{'two-a'}{host} // '') =~ /:/) {
        isnt($l->{'two-a'}{host}, $l->{'two-b'}{host}, 'listing: two different hosts');
    }

    # a host that hangs mid-cell (its sshd and connections stopped with
    # SIGSTOP; the kernel itself runs on): the cell still ends at its
    # timeout, other kernels are not held up, and once the host answers
    # again the timed-out kernel is killed
    my ($on2) = grep { $port{$_} eq $P2 } sort keys %port;
    my ($on1) = grep { $port{$_} eq $P1 } sort keys %port;
    if ($on1 && $on2) {
        my $kid2 = $l->{$on2}{kernel_id};
        my $pid2 = runner_pid($kid2);
        my $t0 = time;
        my $bg = $t->execute_async('/v1/two', { session => $on2, timeout => 2,
            code => "import time\nprint('go', flush=True)\ntime.sleep(30)" }, timeout => 30);
        ok(wait_until(sub { -e dir_of($kid2) . '/cells/cell_out_000002' }, 5), 'frozen host: the cell started');
        sleep 0.3;
        $s2->freeze;
        my $t1 = time;
        my $rr = run_cell('/v1/two', $on1, "print('not held up')");
        my $took1 = time - $t1;
        is(($rr->{result} // {})->{output}, "not held up\n", 'frozen host: a kernel on the other host runs');
        ok($took1 < 1.5, sprintf('  at once (%.2fs)', $took1));
        $rr = $bg->wait;
        my $took = time - $t0;
        is(($rr->{result} // {})->{status}, 'timeout', 'frozen host: the cell ends at its timeout')
            or diag "status $rr->{status}: " . substr($rr->{content} // $rr->{raw} // '', 0, 400);
        # the timeout, the default 2 s grace, and slack for a loaded machine
        ok($took < 2 + 2 + 2, sprintf('  in %.2fs (timeout 2 s, grace 2 s)', $took));
        $s2->thaw;
        ok(wait_until(sub { !pid_alive($pid2) }, 3 + 10),
            'frozen host: once it answers again the timed-out kernel is killed');
        ok(wait_until(sub { !-d dir_of($kid2) }, 5), '  and its directory removed');
    }

    $s2->stop;    # and its connections: the host is gone
    for my $s ('two-c', 'two-d') {
        my $t0 = time;
        my $rr = run_cell('/v1/two', $s, "print('still')");
        my $took = time - $t0;
        is(($rr->{result} // {})->{status}, 'success', "second host down: new session $s still runs")
            or diag "status $rr->{status}: " . substr($rr->{content} // '', 0, 300);
        my $pid = runner_pid((($rr->{result} // {})->{kernel} // {})->{kernel_id});
        is(ssh_port_of($pid), $P1, "  $s: on the first host");
        ok($took < 3 + 2, sprintf('  answered in %.2fs', $took));
    }
}

###############################################################################
# sshd stopped: new sessions get 502 backend_unavailable within
# connect_timeout, nothing hangs; back up: everything works again

$s1->stop;
{
    my $t0 = time;
    my $rr = run_cell('/v1/execute', 'ssh-after-stop', 'print(1)');
    my $took = time - $t0;
    fails_before_stream($rr, 502, 'backend_unavailable', 'sshd stopped: new session');
    ok($took < 3 + 1.5, sprintf('sshd stopped: answered in %.2fs (connect_timeout 3s)', $took));

    $t0 = time;
    $rr = run_cell('/v1/execute', 'ssh-a', 'print(x)');
    $took = time - $t0;
    # nothing can be shipped to a host that is down: a failed cell ship
    # is 502 ship_failed, and the kernel is evicted
    fails_before_stream($rr, 502, 'ship_failed', 'sshd stopped: a cell on an existing kernel');
    ok($took < 3 + 3, sprintf('  and does not hang (%.2fs)', $took));
}
$s1->start;
{
    my $rr = run_cell('/v1/execute', 'ssh-after-restart', "print('back')");
    is(($rr->{result} // {})->{output}, "back\n", 'sshd back: a new session runs (reconnected)')
        or diag "status $rr->{status}: " . substr($rr->{content} // '', 0, 300);
    $rr = run_cell('/v1/execute', 'ssh-a', "print('again')");
    is(($rr->{result} // {})->{status}, 'success', 'sshd back: the old session runs again')
        or diag "status $rr->{status}: " . substr($rr->{content} // '', 0, 300);
    # the failed ship evicted the old kernel: a new one, state_lost
    isnt((($rr->{result} // {})->{kernel} // {})->{kernel_id} // $kA, $kA,
        'sshd back: the old session runs on a new kernel');
    is((($rr->{result} // {})->{kernel} // {})->{state_lost}, JSON::PP::true,
        'sshd back: the old session on a new kernel says state_lost');
    # the old kernel was given up while its host was down: once the
    # host is back it must not be left running (evicted kernels are
    # killed and their directories removed)
    ok(wait_until(sub { !pid_alive($pidA) }, 10),
        "sshd back: the given-up kernel's runner ($pidA) is not left running");
    ok(wait_until(sub { !-d dir_of($kA) }, 10),
        "sshd back: the given-up kernel's directory is removed");
}

# every thread of the worker must be free to go: an I/O thread stuck on a
# host keeps the worker from exiting (the master then kills it); the
# agents hear EOF and go
ok(scalar(agents()), 'agents run while the worker does');
{
    my @w = $t->worker_pids;
    my $t0 = time;
    $t->stop;
    my $took = time - $t0;
    ok($took < 10, sprintf('nginx stopped on QUIT in %.2fs (workers %s)', $took, "@w"));
}
ok(wait_until(sub { !agents() }, 3), 'no agent left once the worker exited')
    or diag 'left: ' . join(' ', map { my $p = $_; my $c = `cat /proc/$p/cmdline`; $c =~ s/\0/ /g; "$p: $c" } agents());
$t->kill_strays;
$s1->stop;
done_testing;
