#!/usr/bin/perl
# The RPC checks as a unit (t/unit/rpc_checks.c, cmocka): the real
# src/ngx_hermes_rpc.c's check of a request's JSON, token, seq and replay,
# each rejection with its reason.

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

my $out = `make -s -C '$unit' '$unit/build/rpc_checks' 2>&1`;
is($?, 0, 'make builds t/unit/build/rpc_checks') or diag $out;

$out = `'$unit/build/rpc_checks' 2>&1`;
is($?, 0, 'rpc_checks passes') or diag $out;
like($out, qr/PASSED.*6 test/, 'all six groups ran');

done_testing;
