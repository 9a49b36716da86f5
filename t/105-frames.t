#!/usr/bin/perl
# The agent protocol's frames as a unit (t/unit/frames.c, cmocka): the
# real src/ngx_hermes_frames.c's builders and parser, the FRAME_MAX bound
# on what a kernel host may send included.

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

my $out = `make -s -C '$unit' '$unit/build/frames' 2>&1`;
is($?, 0, 'make builds t/unit/build/frames') or diag $out;

$out = `'$unit/build/frames' 2>&1`;
is($?, 0, 'frames passes') or diag $out;
like($out, qr/\[  PASSED  \] \d+ test/, 'its groups ran') or diag $out;
unlike($out, qr/FAILED/, 'none failed');

done_testing;
