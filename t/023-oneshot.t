#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# One-shot cells: a request without a session (or "ephemeral": true) runs
# in a fresh kernel, discarded after the cell.  And heartbeats: a silent
# stream gets {"type":"heartbeat"} lines every hermes_heartbeat.

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
            hermes_heartbeat 1s;
        }

        location = /v1/quiet {
            hermes_execute;
            hermes_heartbeat 0;
        }

        location = /v1/by-header {
            hermes_execute;
            hermes_session $http_x_session;
        }

        location /v1/kernels {
            hermes_kernels;
        }
    }
CONF
$t->run;

sub kernel_dirs { grep { m{/hermes_rkernel_} } $t->kroot_dirs }

# no session: a kernel made for the cell, gone after it
my $r = $t->execute('/v1/execute', { code => "import os\nprint(os.getpid() > 0)\nz = 1" });
is($r->{status}, 200, 'no session: 200');
like($r->{events}[0]{session}, qr/^oneshot-[0-9a-f]{32}$/, 'a made-up session');
is($r->{events}[0]{reused}, JSON::PP::false, 'a new kernel');
is($r->{result}{output}, "True\n", 'the cell ran');
is($r->{result}{kernel}{ended}, JSON::PP::true, 'kernel.ended: discarded');
my $kid = $r->{result}{kernel}{kernel_id};
ok(wait_until(sub { !grep { m{/hermes_rkernel_$kid$} } kernel_dirs() }, 5),
    'its directory is removed');
ok(wait_until(sub { !runner_pid($kid) }, 5), 'its runner is gone');

$r = $t->raw_request('GET', '/v1/kernels');
is_deeply(JSON::PP->new->decode($r->{content})->{kernels}, [], 'not listed among the kernels');

# each one-shot cell is alone: no state from the last
$r = $t->execute('/v1/execute', { code => "print('z' in globals())" });
is($r->{result}{output}, "False\n", 'a second one-shot cell sees nothing of the first');
isnt($r->{result}{kernel}{kernel_id}, $kid, 'in another kernel');

# "ephemeral": true says the same; with a session it is a contradiction
$r = $t->execute('/v1/execute', { ephemeral => JSON::PP::true, code => "print(2)" }, json => 1);
is($r->{json}{output}, "2\n", 'ephemeral: true runs');
is($r->{json}{kernel}{ended}, JSON::PP::true, 'ephemeral: discarded');
$r = $t->execute('/v1/execute', { session => 'keep', ephemeral => JSON::PP::true, code => "1" });
is($r->{status}, 400, 'ephemeral with a session: 400');
$r = $t->execute('/v1/execute', { ephemeral => 'yes', code => "1" });
is($r->{status}, 400, 'ephemeral not a boolean: 400');
$r = $t->execute('/v1/by-header', { ephemeral => JSON::PP::true, code => "1" },
    headers => { 'X-Session' => 'h1' });
is($r->{status}, 400, 'ephemeral where hermes_session names one: 400');

# a one-shot cell that fails or times out is discarded as well
$r = $t->execute('/v1/execute', { code => "1/0" });
is($r->{result}{status}, 'error', 'failing one-shot cell');
my $k2 = $r->{result}{kernel}{kernel_id};
ok(wait_until(sub { !grep { m{/hermes_rkernel_$k2$} } kernel_dirs() }, 5),
    'failing one-shot cell: discarded');

# heartbeats: a 3.5 s silent cell gets some, every 1 s of silence
$r = $t->execute('/v1/execute', { session => 'hb',
    code => "import time\nprint('a', flush=True)\ntime.sleep(3.5)\nprint('b')" });
my @types = map { $_->{type} } @{ $r->{events} };
my $beats = grep { $_ eq 'heartbeat' } @types;
ok($beats >= 2 && $beats <= 4, "heartbeats in a silent stretch ($beats)");
is($types[-1], 'result', 'the result is still last');
is($r->{result}{output}, "a\nb\n", 'output untouched');
my @stdout = grep { $_->{type} eq 'stdout' } @{ $r->{events} };
is(join('', map { $_->{text} } @stdout), "a\nb\n", 'stdout events untouched');

# output in between restarts the silence: none while it flows
$r = $t->execute('/v1/execute', { session => 'hb',
    code => "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.3)" });
is(scalar(grep { $_->{type} eq 'heartbeat' } @{ $r->{events} }), 0,
    'no heartbeat while output flows');

# hermes_heartbeat 0: none; a JSON answer never has any
$r = $t->execute('/v1/quiet', { session => 'hb2', code => "import time\ntime.sleep(1.5)" });
is(scalar(grep { $_->{type} eq 'heartbeat' } @{ $r->{events} }), 0, 'hermes_heartbeat 0: none');
$r = $t->execute('/v1/execute', { session => 'hb', code => "import time\ntime.sleep(1.5)\n7" }, json => 1);
is($r->{json}{output}, "7\n", 'a JSON answer is the result alone');

$t->stop;
done_testing;
