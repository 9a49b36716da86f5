#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Pure logic as units (cmocka), each built from the real src/ file with
# nginx's own core code: t/unit/rpc_checks.c (the RPC checks of a
# request's JSON, token, seq and replay, each rejection with its reason)
# t/unit/frames.c (the agent protocol's frames, the FRAME_MAX bound on
# what a kernel host may send included) and t/unit/local_steps.c (the
# kernel script's dir and ship done in-process, against the script).

use strict;
use warnings;

use Test::More;

use Hermes::Test;

my $root = Hermes::Test::repo_root();
my $unit = "$root/t/unit";

plan skip_all => 'build/nginx/Makefile missing: run "make module" first'
    unless -f "$root/build/nginx/Makefile";
plan skip_all => 'cmocka.h missing: apt-get install libcmocka-dev'
    unless -f '/usr/include/cmocka.h';

for my $u (['rpc_checks', qr/PASSED.*6 test/], ['frames', qr/\[  PASSED  \] \d+ test/],
           ['local_steps', qr/\[  PASSED  \] 4 test/]) {
    my ($name, $passed) = @$u;
    my $out = `make -s -C '$unit' '$unit/build/$name' 2>&1`;
    is($?, 0, "make builds t/unit/build/$name") or diag $out;

    $out = `'$unit/build/$name' 2>&1`;
    is($?, 0, "$name passes") or diag $out;
    like($out, $passed, "$name: its groups ran") or diag $out;
    unlike($out, qr/FAILED/, "$name: none failed");
}

done_testing;
