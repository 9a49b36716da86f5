#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# No orphans: `nginx -s quit` and `nginx -s stop` shut every kernel down
# (process groups killed, directories removed), a running cell's too; a
# reload keeps them.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

sub gateway {
    my $t = Hermes::Test->new(workers => 2);
    $t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
        }
    }
CONF
    $t->run;
    return $t;
}

sub kernels {
    my ($t, $n) = @_;
    my @kids;
    for my $i (1 .. $n) {
        my $r = $t->execute('/v1/execute', { session => "s$i",
            code => "import subprocess\np = subprocess.Popen(['sleep', '300'])\nprint('up')" });
        push @kids, $r->{result}{kernel}{kernel_id} if ($r->{result}{output} // '') eq "up\n";
    }
    return @kids;
}

# procs whose cwd is under the test's prefix: runners and their children
sub leftovers { my ($t) = @_; return $t->prefix_pids }

for my $signal ('QUIT', 'TERM') {
    my $t = gateway();
    my @kids = kernels($t, 3);
    is(scalar @kids, 3, "$signal: three kernels with a child each");
    my @up = leftovers($t);
    ok(@up >= 6, "$signal: their runners and children run (" . scalar(@up) . ")");

    # a reload keeps them
    ok($t->reload, "$signal: reloaded");
    is(scalar(grep { runner_pid($_) } @kids), 3, "$signal: a reload keeps the kernels");

    # a cell that runs while nginx is told to go: quit lets it finish (a
    # graceful shutdown), stop does not wait
    my $secs = $signal eq 'QUIT' ? 3 : 120;
    my $long = $t->execute_async('/v1/execute', { session => 'long',
        code => "import time\nprint('x', flush=True)\ntime.sleep($secs)\nprint('done')" });
    ok(wait_until(sub { scalar(grep { m{hermes_rkernel_} } $t->kroot_dirs) >= 4 }, 10),
        "$signal: the long cell's kernel is there");
    sleep 0.5;

    my $mp = $t->master_pid;
    kill $signal, $mp;
    ok(wait_until(sub { !kill 0, $mp }, $signal eq 'QUIT' ? 20 : 15),
        "$signal: nginx exited");

    ok(wait_until(sub { !leftovers($t) }, 5), "$signal: no kernel process is left")
        or diag(join ' ', map { (readlink("/proc/$_/cwd") // '?') } leftovers($t));
    is(scalar($t->kroot_dirs), 0, "$signal: no kernel directory is left");
    like($t->error_log, qr/hermes: nginx stops: [4-9] kernel\(s\) shut down, 0 could not/,
        "$signal: error.log says how many kernels were shut down");

    my $lr = $long->wait(10);
    if ($signal eq 'QUIT') {
        is($lr->{result}{output}, "x\ndone\n", 'QUIT: the running cell finished first');
    }
    $t->{running} = 0;
    $t->check_error_log;
}

done_testing;
