#!/usr/bin/perl
# The kernel host's Python (src/remote), tested as Python: the runner and
# the tools client driven through their files.

use strict;
use warnings;

use Test::More;
use Hermes::Test;

my $dir = Hermes::Test::repo_root() . '/src/remote';
my $out = `cd '$dir' && PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m unittest test_remote 2>&1`;
is($?, 0, 'python3 -m unittest test_remote') or diag $out;
like($out, qr/^OK/m, 'all Python tests passed');

done_testing;
