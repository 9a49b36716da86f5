#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The kernel host's Python (src/remote), tested as Python: the runner, the
# tools client, the kernel-host agent and the file helper driven through
# their files and frames.  What runs in a kernel's python (the runner and
# the tools client) must work on any CPython >= 3.8 (an environment's image
# brings its own): checked statically, and test_remote run again with the
# python of a Debian trixie rootfs (3.13), bwrap binding it read-only as /.

use strict;
use warnings;

use Test::More;
use Hermes::Test;

my $root = Hermes::Test::repo_root();
my $dir = "$root/src/remote";
for my $m (qw(test_remote test_agent test_files)) {
    my $out = `cd '$dir' && PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m unittest $m 2>&1`;
    is($?, 0, "python3 -m unittest $m") or diag $out;
    like($out, qr/^OK/m, "$m: all Python tests passed");
}

my $out = `cd '$root' && /usr/bin/python3 t/lib/check-py38.py src/remote/kernel_runner.py src/remote/kernel_start.py src/remote/hermes_tools.py 2>&1`;
is($?, 0, 'runner, its start and tools client: nothing newer than Python 3.8 (t/lib/check-py38.py)')
    or diag $out;

SKIP: {
    my ($rootfs, $why) = Hermes::Test::rootfs_trixie();
    skip $why, 3 unless $rootfs;
    # the repo read-only at /srv (a directory the image has), cwd there
    my @bwrap = ('bwrap', '--ro-bind', $rootfs, '/', '--proc', '/proc',
                 '--dev', '/dev', '--tmpfs', '/tmp', '--ro-bind', $root, '/srv',
                 '--chdir', '/srv/src/remote', '--setenv', 'PATH', '/usr/bin:/bin',
                 '--setenv', 'PYTHONDONTWRITEBYTECODE', '1', '--');
    chomp(my $v = `@bwrap python3 -I -c 'import sys; print(sys.version)' 2>&1`);
    like($v, qr/^3\.13\./, "the trixie rootfs's python3 runs read-only as / under bwrap: $v");
    $out = `@bwrap python3 -m unittest test_remote 2>&1`;
    is($?, 0, "test_remote under the trixie rootfs's python (3.13)") or diag $out;
    like($out, qr/^OK/m, '... all passed');
}

done_testing;
