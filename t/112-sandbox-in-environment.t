#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# What the sandbox guarantees holds inside an environment: earlier rounds'
# test files run again with every sandboxed location's kernels in a Debian
# trixie rootfs (Python 3.13; HERMES_TEST_ROOTFS, see Hermes::Test's
# write_conf): the sandbox's probes, hostile cells, tool calls, files.

use strict;
use warnings;

use Test::More;

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my ($rootfs, $why) = Hermes::Test::rootfs_trixie();
plan skip_all => $why unless $rootfs;

local $ENV{HERMES_TEST_ROOTFS} = $rootfs;

# first: the files below do run in the image
{
    my $t = Hermes::Test->new;
    $t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /x { hermes_execute; }
    }
CONF
    $t->run;
    my $r = $t->execute('/x', { session => 's', code => "import sys\nprint(sys.version_info[:2])" },
                        json => 1);
    is($r->{json}{output}, "(3, 13)\n", "a location of the test files runs the image's python");
    $t->stop;
}

my $root = Hermes::Test::repo_root();

for my $file (qw(050-sandbox.t 042-hostile-cells.t 100-rpc.t 025-files.t)) {
    my $out = `'$^X' -I '$root/t/lib' '$root/t/$file' 2>&1`;
    my $rc = $? >> 8;
    is($rc, 0, "t/$file passes with its kernels in the trixie image")
        or diag join "\n", grep { /^not ok|^#\s+(Failed|at )|^\s*#/ } split /\n/, $out;
}

done_testing;
