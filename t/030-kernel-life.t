#!/usr/bin/perl
# Kernel lifecycle: timeouts kill the process group, dead kernels are
# replaced with state_lost, a client that goes away does not stop its cell.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_cell_timeout 30s;
        }
    }
CONF
$t->run;


# --- a timed-out cell kills its kernel's whole process group

my $r = $t->execute('/v1/execute', { session => 'slow', code => "v = 'kept'" });
my $kid = $r->{result}{kernel}{kernel_id};
my $pid = runner_pid($kid);
ok($pid, "runner pid $pid");
is(getpgrp() == $pid ? 0 : (split ' ', `ps -o pgid= -p $pid`)[0], $pid,
    'the runner leads its own process group');

my $t0 = time;
$r = $t->execute('/v1/execute', { session => 'slow', timeout => 1,
    code => "import subprocess, time\n"
          . "subprocess.Popen(['sleep', '300'])\n"
          . "print('sleeping', flush=True)\ntime.sleep(60)" });
my $took = time - $t0;
is($r->{result}{status}, 'timeout', 'status timeout');
like($r->{result}{error}, qr/did not finish within 1 s/, 'timeout error sentence');
ok($took < 5, sprintf('answered at the timeout (%.2fs)', $took));
ok((grep { ($_->{text} // '') eq "sleeping\n" } @{ $r->{events} }), 'output before the timeout streamed');
ok(wait_until(sub { !pid_alive($pid) }, 5), 'runner killed');
ok(wait_until(sub { !procs_matching(qr/^sleep 300/) }, 5), 'its child killed too (process group)');
ok(wait_until(sub { !grep { /$kid$/ } $t->kroot_dirs }, 5), 'kernel directory removed');

$r = $t->execute('/v1/execute', { session => 'slow', code => "print('v' in globals())" });
is($r->{events}[0]{state_lost}, JSON::PP::true, 'next call: kernel line says state_lost');
is($r->{result}{kernel}{state_lost}, JSON::PP::true, 'next call: result says state_lost');
isnt($r->{result}{kernel}{kernel_id}, $kid, 'next call: a new kernel');
is($r->{result}{output}, "False\n", 'next call: fresh state');
$r = $t->execute('/v1/execute', { session => 'slow', code => "1" });
is($r->{result}{kernel}{state_lost}, JSON::PP::false, 'state_lost only once');

# --- a kernel that died between cells is noticed on the next call

$r = $t->execute('/v1/execute', { session => 'dies', code => "z = 1" });
$kid = $r->{result}{kernel}{kernel_id};
$pid = runner_pid($kid);
kill 'KILL', $pid;
ok(wait_until(sub { !pid_alive($pid) && all_threads_gone($pid) }, 5),
    'kernel killed from outside');
$r = $t->execute('/v1/execute', { session => 'dies', code => "print('z' in globals())" });
is($r->{result}{status}, 'success', 'dead kernel replaced') or diag explain $r->{events};
is($r->{result}{kernel}{state_lost}, JSON::PP::true, 'replaced: state_lost');
is($r->{result}{output}, "False\n", 'replaced: fresh state');

# --- a kernel that dies mid-cell ends the stream at once, not at the timeout

$r = $t->execute('/v1/execute', { session => 'crash', code => "w = 1" });
$t0 = time;
$r = $t->execute('/v1/execute', { session => 'crash', timeout => 20,
    code => "import os, signal, time\nprint('bye', flush=True)\ntime.sleep(0.2)\nos.kill(os.getpid(), signal.SIGKILL)" });
$took = time - $t0;
is($r->{result}{status}, 'error', 'died mid-cell: error');
like($r->{result}{error}, qr/died/, 'died mid-cell: says so');
ok($took < 3, sprintf('died mid-cell: answered in %.2fs', $took));
$r = $t->execute('/v1/execute', { session => 'crash', code => "print('w' in globals())" });
is($r->{result}{kernel}{state_lost}, JSON::PP::true, 'after a crash: state_lost');

# --- a client that disconnects does not stop its cell

$r = $t->execute('/v1/execute', { session => 'gone', code => "q = 'still here'" });
# the kernel sees its own directory only: the mark goes there
my $mark = $t->kroot . "/hermes_rkernel_$r->{events}[0]{kernel_id}/cell-finished";
$r = $t->execute('/v1/execute', { session => 'gone',
    code => "import time\nprint('started', flush=True)\ntime.sleep(1.5)\nq = 'after'\nopen('cell-finished', 'w').write('done')" },
    on_event => sub { my ($e) = @_; return ($e->{type} eq 'stdout') ? ABORT_STREAM : undef });
ok($r->{aborted}, 'client hung up mid-cell');
ok(wait_until(sub { -e $mark }, 10), 'the cell ran to its end');
$r = $t->execute('/v1/execute', { session => 'gone', code => "print(q)" });
is($r->{result}{output}, "after\n", 'kernel usable, with the state the cell left');
is($r->{result}{kernel}{reused}, JSON::PP::true, 'same kernel');

$t->stop;
done_testing;
