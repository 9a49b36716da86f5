#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# error.log lines about a cell name its owner, session and kernel, the
# owner escaped (it is the operator's variable, any byte but a control).

use strict;
use warnings;

use Test::More;

use Hermes::Test;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_owner $http_x_owner;
            hermes_cell_timeout 1s grace=1s;
        }

        location = /v1/anon {
            hermes_execute;
            hermes_cell_timeout 1s grace=1s;
        }
    }
CONF
$t->run;

my $r = $t->execute('/v1/execute', { session => 'lc1',
    code => "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass" },
    headers => { 'X-Owner' => 'alice "the" admin' });
is($r->{result}{status}, 'timeout', 'a cell that ignores the interrupt');
my $kid = $r->{result}{kernel}{kernel_id};

my @lines = grep { /timed out after/ } split /\n/, $t->error_log;
ok(@lines >= 2, 'interrupt and kill are logged');
for my $l (@lines) {
    like($l, qr/, owner: "alice \\x22the\\x22 admin", session: "lc1", kernel: \Q$kid\E$/,
        'the line names owner (escaped), session and kernel');
}

$r = $t->execute('/v1/anon', { session => 'lc2',
    code => "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass" });
$kid = $r->{result}{kernel}{kernel_id};
my ($l) = grep { /timed out after .*kernel: \Q$kid\E/ } split /\n/, $t->error_log;
like($l // '', qr/, owner: "anonymous", session: "lc2", kernel: \Q$kid\E$/,
    'hermes_owner unset: owner "anonymous"');

$t->stop;
done_testing;
