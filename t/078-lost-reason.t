#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# State loss is always announced: after a session's kernel was reaped
# (idle), evicted (cap), deleted, died or killed at a timeout, the next
# call says state_lost: true and lost_reason, in the kernel line, the
# result and $hermes_lost_reason.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new(workers => 1);
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m max_kernels=3 idle_timeout=3s sweep=200ms;
    hermes_zone quick:1m idle_timeout=2s sweep=200ms;
    hermes_backend local root=%%KROOT%%;

    log_format lost '$hermes_session $hermes_lost_reason';

    server {
        listen 127.0.0.1:%%PORT_0%%;
        access_log %%PREFIX%%/logs/lost.log lost;

        location = /v1/execute {
            hermes_execute zone=kernels;
            hermes_cell_timeout 2s grace=1s;
        }

        location = /v1/idle {
            hermes_execute zone=quick;
        }

        location /v1/kernels {
            hermes_kernels zone=kernels;
        }
    }
CONF
$t->run;

sub cell {
    my ($loc, $s, $code) = @_;
    return $t->execute($loc, { session => $s, code => $code // 'x = 1' });
}

sub lost_is {
    my ($r, $reason, $name) = @_;
    is($r->{events}[0]{state_lost}, JSON::PP::true, "$name: the kernel line says state_lost");
    is($r->{events}[0]{lost_reason}, $reason, "$name: and lost_reason $reason");
    is(($r->{result} // {})->{kernel}{state_lost}, JSON::PP::true, "$name: the result too");
    is(($r->{result} // {})->{kernel}{lost_reason}, $reason, "$name: with the reason");
    is($r->{events}[0]{reused}, JSON::PP::false, "$name: a new kernel");
}

# idle
cell('/v1/idle', 'i1');
sleep 3;
my $r = cell('/v1/idle', 'i1');
lost_is($r, 'idle', 'reaped when idle');
$r = cell('/v1/idle', 'i1');
is($r->{events}[0]{state_lost}, JSON::PP::false, 'said once: the next call is plain');
ok(!exists $r->{events}[0]{lost_reason}, 'no lost_reason then');

# cap: three kernels at most, the least recently used goes
cell('/v1/execute', "c$_") for 1 .. 3;
cell('/v1/execute', 'c4');
$r = cell('/v1/execute', 'c1');
lost_is($r, 'cap', 'evicted at the cap');

# deleted by its owner
cell('/v1/execute', 'd1');
$r = $t->raw_request('DELETE', '/v1/kernels/d1');
is($r->{status}, 204, 'deleted');
$r = cell('/v1/execute', 'd1');
lost_is($r, 'deleted', 'deleted');

# died during a cell
cell('/v1/execute', 'x1');
$r = cell('/v1/execute', 'x1', "import os\nos._exit(3)");
is($r->{result}{status}, 'error', 'a cell that ends its kernel');
$r = cell('/v1/execute', 'x1');
lost_is($r, 'died', 'died');

# killed at its timeout (it would not stop when interrupted)
$r = cell('/v1/execute', 't1',
    "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass");
is($r->{result}{status}, 'timeout', 'a cell killed at its timeout');
$r = cell('/v1/execute', 't1');
lost_is($r, 'timeout', 'timeout');

# a session never seen, or whose kernel ended by itself: nothing lost
$r = cell('/v1/execute', 'new1');
is($r->{events}[0]{state_lost}, JSON::PP::false, 'a new session: nothing lost');
cell('/v1/execute', 'se1', 'raise SystemExit');
$r = cell('/v1/execute', 'se1');
is($r->{events}[0]{state_lost}, JSON::PP::false, 'SystemExit asked for it: nothing lost');

# error.log says why each kernel went, and whose
my $log = $t->error_log;
like($log, qr/hermes: evicting kernel "[^"]+" \(pid \d+\): idle, owner: "anonymous", session: "i1"/,
    'error.log: evicted when idle, whose, which session');
like($log, qr/hermes: evicting kernel "[^"]+" \(pid \d+\): cap, owner: "anonymous", session: "c1"/,
    'error.log: evicted at the cap');
like($log, qr/hermes: evicting kernel "[^"]+" \(pid \d+\): deleted, owner: "anonymous", session: "d1"/,
    'error.log: deleted');

# the access log's variable
$t->stop;
my %seen;
open my $fh, '<', $t->prefix . '/logs/lost.log' or die;
while (<$fh>) {
    my ($s, $why) = split;
    $seen{$s} = $why if ($why // '-') ne '-';
}
is($seen{i1}, 'idle', '$hermes_lost_reason: idle');
is($seen{c1}, 'cap', '$hermes_lost_reason: cap');
is($seen{d1}, 'deleted', '$hermes_lost_reason: deleted');
is($seen{x1}, 'died', '$hermes_lost_reason: died');
is($seen{t1}, 'timeout', '$hermes_lost_reason: timeout');

done_testing;
