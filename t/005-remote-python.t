#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The kernel host's Python (src/remote), tested as Python: the runner, the
# tools client, the kernel-host agent and the file helper driven through
# their files and frames.

use strict;
use warnings;

use Test::More;
use Hermes::Test;

my $dir = Hermes::Test::repo_root() . '/src/remote';
for my $m (qw(test_remote test_agent test_files)) {
    my $out = `cd '$dir' && PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m unittest $m 2>&1`;
    is($?, 0, "python3 -m unittest $m") or diag $out;
    like($out, qr/^OK/m, "$m: all Python tests passed");
}

done_testing;
