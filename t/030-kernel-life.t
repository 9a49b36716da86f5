#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
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
            hermes_cell_timeout 30s grace=1s;
        }

        location = /o/execute {
            hermes_execute;
            hermes_owner $http_x_owner;
        }

        location /o/kernels {
            hermes_kernels;
            hermes_owner $http_x_owner;
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

# a cell that times out is interrupted first: it stops, and the kernel
# lives on with its state
my $t0 = time;
$r = $t->execute('/v1/execute', { session => 'slow', timeout => 1,
    code => "import time\nprint('sleeping', flush=True)\nv = 'changed'\ntime.sleep(60)" });
my $took = time - $t0;
is($r->{result}{status}, 'timeout', 'interrupted at its timeout: status timeout');
like($r->{result}{error}, qr/did not finish within 1 s and was interrupted; the kernel and its state are kept/,
    '... the error says so');
ok($took < 3, sprintf('... answered at the timeout (%.2fs)', $took));
like($r->{result}{output}, qr/^sleeping\n/, '... with what it printed');
ok(!$r->{result}{kernel}{ended}, '... the kernel did not end');
ok(pid_alive($pid), '... the runner lives on');
$r = $t->execute('/v1/execute', { session => 'slow', code => "print(v)" });
is($r->{result}{output}, "changed\n", '... with its state');
is($r->{result}{kernel}{kernel_id}, $kid, '... the same kernel');

# the same in a JSON answer: nothing printed is lost
$r = $t->execute('/v1/execute', { session => 'slow', timeout => 1,
    code => "import time\nprint('in json', flush=True)\ntime.sleep(60)" }, json => 1);
is($r->{json}{status}, 'timeout', 'JSON answer: timeout');
like($r->{json}{output}, qr/^in json\n/, 'JSON answer: with what it printed');

# a cell waiting on a child (system() ignores SIGINT in the caller, as
# Jupyter's kernels know): the interrupt reaches the child too, so the
# cell stops within the grace and keeps its kernel and state
for my $c (["import os\nw = 'sys'\nos.system('sleep 301')\nw = 'after'", 'os.system'],
           ["import subprocess\nw = 'sub'\nsubprocess.run(['sleep', '301'])\nw = 'after'", 'subprocess.run']) {
    my ($code, $how) = @$c;
    $t0 = time;
    $r = $t->execute('/v1/execute', { session => 'slow', timeout => 1, code => $code });
    $took = time - $t0;
    is($r->{result}{status}, 'timeout', "$how: status timeout");
    like($r->{result}{error}, qr/was interrupted; the kernel and its state are kept/,
        "$how: the cell stopped when interrupted") or diag explain $r->{result};
    ok($took < 2.5, sprintf("$how: within the grace (%.2fs)", $took));
    ok(!$r->{result}{kernel}{ended}, "$how: the kernel did not end");
    ok(wait_until(sub { !grep { (readlink("/proc/$_/cwd") // '') =~ m{^\Q@{[$t->kroot]}\E/} }
                              procs_matching(qr/^sleep 301/) }, 3), "$how: its child is gone");
    $r = $t->execute('/v1/execute', { session => 'slow', code => "print(v, w)" });
    is($r->{result}{kernel}{kernel_id}, $kid, "$how: the same kernel");
    like($r->{result}{output}, qr/^changed (?:sys|sub|after)\n$/, "$how: its state kept");
}

# a cell that does not stop when interrupted: its kernel's whole process
# group is killed after the grace
$t0 = time;
$r = $t->execute('/v1/execute', { session => 'slow', timeout => 1,
    code => "import subprocess, time\n"
          . "subprocess.Popen(['sleep', '300'])\n"
          . "print('sleeping', flush=True)\n"
          . "while True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass" });
$took = time - $t0;
is($r->{result}{status}, 'timeout', 'status timeout');
like($r->{result}{error}, qr/did not finish within 1 s and did not stop when interrupted; its kernel was killed/,
    'timeout error sentence');
ok($took > 1.8 && $took < 5, sprintf('answered at the timeout and its grace (%.2fs)', $took));
ok($r->{result}{kernel}{ended}, 'the result says the kernel ended');
ok((grep { ($_->{text} // '') eq "sleeping\n" } @{ $r->{events} }), 'output before the timeout streamed');
ok(wait_until(sub { !pid_alive($pid) }, 5), 'runner killed');
# this test's: started in a kernel dir under this test's root (the cwd
# link of a process whose directory was removed ends in " (deleted)")
my $kroot = $t->kroot;
ok(wait_until(sub { !grep { (readlink("/proc/$_/cwd") // '') =~ m{^\Q$kroot\E/} }
                          procs_matching(qr/^sleep 300/) }, 10),
    'its child killed too (process group)');
ok(wait_until(sub { !grep { /$kid$/ } $t->kroot_dirs }, 5), 'kernel directory removed');

is($r->{result}{execution_count}, $r->{events}[0]{execution_count},
    'a killed cell counted: its execution_count is the kernel line\'s');
like($r->{result}{output}, qr/^sleeping\n/, 'a killed cell: its result keeps what it printed');

# a JSON answer too, stdout and stderr, a head and a tail
$r = $t->execute('/v1/execute', { session => 'slow2', timeout => 1,
    code => "import sys, time\nfor i in range(8000):\n    print('line %04d' % i)\n"
          . "sys.stderr.write('to stderr\\n')\nsys.stdout.flush()\nsys.stderr.flush()\n"
          . "while True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass" },
    json => 1);
is($r->{json}{status}, 'timeout', 'killed, JSON answer: timeout');
like($r->{json}{output}, qr/^line 0000\nline 0001\n/, '... the head of what it printed');
like($r->{json}{output}, qr/\n\.\.\. \[output truncated: \d+ bytes omitted\] \.\.\.\n/, '... the cut marked');
like($r->{json}{output}, qr/line 7999\n\n--- stderr ---\nto stderr\n$/, '... its tail, stderr last');
ok(length($r->{json}{output}) < 50000 + 100, '... within hermes_max_output');

# output larger than the windows read of it: head, a plain marker, tail
$r = $t->execute('/v1/execute', { session => 'slow3', timeout => 3,
    code => "import time\nfor i in range(400000):\n    print('row %06d' % i)\n"
          . "while True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass" },
    json => 1);
like($r->{json}{output}, qr/^row 000000\n/, 'killed after 4 MB of output: the head');
like($r->{json}{output}, qr/\n\.\.\. \[output truncated\] \.\.\.\n.*\nrow \d{6}\n\z/s,
    '... the marker and the tail (cut by bytes, as the runner cuts)');
ok(length($r->{json}{output}) < 50000 + 100, '... within hermes_max_output');

$r = $t->execute('/v1/execute', { session => 'slow', code => "print('v' in globals())" });
is($r->{events}[0]{state_lost}, JSON::PP::true, 'next call: kernel line says state_lost');
is($r->{result}{kernel}{state_lost}, JSON::PP::true, 'next call: result says state_lost');
isnt($r->{result}{kernel}{kernel_id}, $kid, 'next call: a new kernel');
is($r->{result}{output}, "False\n", 'next call: fresh state');
$r = $t->execute('/v1/execute', { session => 'slow', code => "1" });
is($r->{result}{kernel}{state_lost}, JSON::PP::false, 'state_lost only once');

# --- an agent interrupts its running cell: the kernel keeps its state

{
    my %alice = (headers => {'X-Owner' => 'alice'});
    $r = $t->execute('/o/execute', { session => 'intr', code => "n = 1" }, %alice);
    my $ikid = $r->{result}{kernel}{kernel_id};
    my $a = $t->execute_async('/o/execute', { session => 'intr',
        code => "import time\nprint('working', flush=True)\nn = 2\ntime.sleep(30)" }, %alice);
    sleep 0.8;
    my $x = $t->http(POST => '/o/kernels/intr/interrupt', headers => {'X-Owner' => 'mallory'});
    is($x->{status}, 404, "another owner cannot interrupt it: 404");
    $x = $t->http(GET => '/o/kernels/intr/interrupt', headers => {'X-Owner' => 'alice'});
    is($x->{status}, 405, 'GET on interrupt: 405');
    $x = $t->http(POST => '/o/kernels/intr/interrupt', headers => {'X-Owner' => 'alice'});
    is($x->{status}, 202, 'POST SESSION/interrupt: 202');
    is($x->{json}{interrupted}, JSON::PP::true, '... interrupted');
    my $r2 = $a->wait(10);
    is($r2->{result}{status}, 'interrupted', 'the cell answers "interrupted"');
    like($r2->{result}{output}, qr/^working\n/, '... with what it printed');
    ok(!$r2->{result}{kernel}{ended}, '... its kernel lives on');
    $r = $t->execute('/o/execute', { session => 'intr', code => "print(n)" }, %alice);
    is($r->{result}{output}, "2\n", '... with the state the cell left');
    is($r->{result}{kernel}{kernel_id}, $ikid, '... the same kernel');
    $x = $t->http(POST => '/o/kernels/intr/interrupt', headers => {'X-Owner' => 'alice'});
    is($x->{status}, 409, 'no cell running: 409');
    is($x->{json}{error}{code}, 'no_cell', '... no_cell');
    $x = $t->http(POST => '/o/kernels/none/interrupt', headers => {'X-Owner' => 'alice'});
    is($x->{status}, 404, 'no such kernel: 404');
    $x = $t->http(POST => '/o/kernels/intr/stop', headers => {'X-Owner' => 'alice'});
    is($x->{status}, 404, 'anything else below a session: 404');
}

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
