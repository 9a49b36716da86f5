#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Lint and analysis, as `make lint` runs them (t/lint.sh): shellcheck on
# the shell scripts, cppcheck on src/, pyflakes on the Python.  A finding
# of any of them fails, with what it found.

use strict;
use warnings;

use Test::More;
use Hermes::Test;

my $root = Hermes::Test::repo_root();
for my $linter (qw(shellcheck cppcheck pyflakes)) {
    my $out = `cd '$root' && t/lint.sh $linter 2>&1`;
    is($?, 0, "$linter: no finding") or diag $out;
}

done_testing;
