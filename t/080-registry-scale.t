#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The kernel registry at scale (with 100,000 entries, the lookup cost
# stays flat, O(log n), and an entry takes at most 512 bytes of zone):
# builds and runs t/unit/registry_scale, the real src/ngx_hermes_registry.c
# over nginx's own rbtree/slab/shmtx code in a shared zone, and passes on
# its exit status.
#
# Then shows that it can fail: over a copy of the registry whose lookup is
# linear (t/unit/mutant_linear.pl), and with entries too big for 512 bytes.
#
# HERMES_SCALE_* from the environment reach the main run (t/unit/
# registry_scale.c lists them); HERMES_UNIT_NO_MUTANTS=1 skips the rest.

use strict;
use warnings;

use Test::More;
use POSIX qw(:sys_wait_h);
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $root = Hermes::Test::repo_root();
my $unit = "$root/t/unit";

plan skip_all => 'build/nginx/Makefile missing: run "make module" first'
    unless -f "$root/build/nginx/Makefile";
plan skip_all => 'cmocka.h missing: apt-get install libcmocka-dev'
    unless -f '/usr/include/cmocka.h';

# run a command, stdout and stderr together, killed after $timeout s
sub run_cmd {
    my ($timeout, @cmd) = @_;

    pipe(my $r, my $w) or die "pipe: $!";
    my $pid = fork // die "fork: $!";

    if ($pid == 0) {
        close $r;
        open STDOUT, '>&', $w or die;
        open STDERR, '>&', $w or die;
        setpgrp(0, 0);
        exec @cmd or die "exec $cmd[0]: $!";
    }

    close $w;

    my ($out, $status, $timed_out) = ('', undef, 0);
    my $deadline = time + $timeout;

    local $SIG{ALRM} = sub { $timed_out = 1; kill_group($pid); };
    alarm $timeout;
    while (my $line = <$r>) { $out .= $line; }
    alarm 0;
    close $r;

    waitpid($pid, 0);
    $status = $?;

    $out .= "\n[killed after $timeout s]\n" if $timed_out;
    return ($status, $out);
}

sub figures {
    my ($out) = @_;
    return join "", map { s/^# //r } grep { /^#/ } split /^/m, $out;
}

# --- build ------------------------------------------------------------------

my ($st, $out) = run_cmd(300, 'make', '-s', '-C', $unit);
is($st, 0, 'make -C t/unit builds registry_scale') or do {
    diag $out;
    done_testing;
    exit;
};

# --- the real registry --------------------------------------------------------

# Timing on a shared 2-core machine is noisy: O(log n) measures about 3x
# from 1k to 100k entries, linear would be 100x; 12x leaves room for noise.
local $ENV{HERMES_SCALE_MAX_RATIO} = $ENV{HERMES_SCALE_MAX_RATIO} // 12;

my $t0 = time;
($st, $out) = run_cmd(120, "$unit/build/registry_scale");
my $took = time - $t0;

is($st, 0, 'registry_scale passes: lookups flat, <= 512 zone bytes per entry')
    or diag $out;
like($out, qr/^\[  PASSED  \] \d+ test\(s\)\.$/m, 'cmocka: all tests passed');
unlike($out, qr/FAILED/, 'cmocka: none failed');

diag sprintf("registry_scale (%.1f s):\n%s", $took, figures($out));

my %ns = $out =~ /^# entries=(\d+) ns_per_lookup=([\d.]+)/mg;
my %bytes = $out =~ /^# entries=(\d+) bytes_per_entry=([\d.]+)/mg;

if (!$ENV{HERMES_SCALE_SIZES}) {
    ok(exists $ns{100000} && exists $bytes{100000},
        'measured at 100,000 entries');
    cmp_ok($bytes{100000} // 1e9, '<=', 512, 'zone bytes per entry at 100k');
}

# --- it can fail ----------------------------------------------------------------

SKIP: {
    skip 'HERMES_UNIT_NO_MUTANTS set', 4 if $ENV{HERMES_UNIT_NO_MUTANTS};

    # a linear lookup: the flatness test must catch it (20k, not 100k: the
    # linear registry fills in O(n^2))

    my ($mst, $mout) = run_cmd(300, 'make', '-s', '-C', $unit, 'mutant');

    SKIP: {
        if ($mst != 0) {
            diag "the linear mutant did not build (src changed shape?):\n"
                . $mout;
            skip 'linear mutant not built', 2;
        }

        local $ENV{HERMES_SCALE_SIZES} = '1000,20000';
        local $ENV{HERMES_SCALE_LOOKUPS} = '300';
        local $ENV{HERMES_SCALE_ROUNDS} = '3';
        local $ENV{HERMES_SCALE_MAX_RATIO};
        local $ENV{HERMES_SCALE_TESTS} =
            'test_scale_fill,test_scale_lookups,test_lookup_cost_flat';

        ($mst, $mout) = run_cmd(120, "$unit/build/registry_scale_linear");

        isnt($mst, 0, 'a linear lookup fails registry_scale');
        like($mout, qr/^\[  FAILED  \] test_lookup_cost_flat$/m,
            'it fails on "lookup cost flat"') or diag $mout;
        note figures($mout);
    }

    # entries too big for a 512-byte slab slot: long owner and session (the
    # maximum, 128 each) and an ordinary kernel root

    local $ENV{HERMES_SCALE_SIZES} = '1000,2000';
    local $ENV{HERMES_SCALE_OWNER_LEN} = '128';
    local $ENV{HERMES_SCALE_SESSION_LEN} = '128';
    local $ENV{HERMES_SCALE_ROOT} = '/var/lib/nginx/hermes-kernels';
    local $ENV{HERMES_SCALE_MAX_BYTES};
    local $ENV{HERMES_SCALE_TESTS} =
        'test_entry_layout,test_scale_fill,test_zone_bytes_per_entry';

    my ($bst, $bout) = run_cmd(120, "$unit/build/registry_scale");

    isnt($bst, 0, 'max-length keys under a longer root fail the byte budget');
    like($bout, qr/^\[  FAILED  \] test_zone_bytes_per_entry$/m,
        'it fails on "zone bytes per entry"') or diag $bout;
    note figures($bout);
}

done_testing;
