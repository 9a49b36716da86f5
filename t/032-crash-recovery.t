#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A start after a crash: the kernels an earlier run of this gateway left
# in its root are killed and removed, with a log line; another gateway's
# kernel dirs, and anything else there, are not touched; a reload (the
# zone kept) removes nothing.  What recovery trusts is the gateway's own
# journal: a kernel dir planted by a co-tenant (named "*", or by an id,
# with a "gateway" file naming this gateway) kills nothing, and a kernel that
# rewrites files in its own dir does not escape recovery.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);
use Compress::Zlib qw(crc32);

use Hermes::Test;

# a gateway of one zone, started: its kernels in a root of its own
sub gateway {
    my ($zone, %o) = @_;
    my $g = Hermes::Test->new(workers => $o{workers} // 1);
    $g->write_conf(<<"CONF");
    hermes_zone $zone:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
        }
    }
CONF
    $g->run unless $o{stopped};
    return $g;
}

my $t = gateway('kernels', workers => 2);

# a bystander: another gateway's kernel on this host, which no plant in
# this gateway's root may reach
my $by = gateway('bystander');
my $bk = $by->execute('/v1/execute', { session => 'by', code => "print('up')" })
    ->{result}{kernel}{kernel_id};
ok(runner_pid($bk), "the bystander gateway's kernel runs");

my @kids;
for my $s (qw(a b)) {
    my $r = $t->execute('/v1/execute', { session => $s,
        code => "import subprocess\np = subprocess.Popen(['sleep', '300'])\nprint('up')" });
    push @kids, $r->{result}{kernel}{kernel_id};
}
is(scalar(grep { defined && runner_pid($_) } @kids), 2, 'two kernels run');

my $kroot = $t->kroot;
my $journal = "$kroot/hermes_journal_$<";

# the gateway id is public, a co-tenant computes it: crc32 of the
# nginx.conf path and of the zone's name
my $gw = unpack('H*', pack('V2', crc32($t->prefix . '/nginx.conf'), crc32('kernels')));
my $entry = do { local $/; my $f; open($f, '<', "$journal/$kids[0]") ? <$f> : '' };
like($entry, qr/^\Q$gw\E [0-9a-f]{16} \d+\n$/,
    "each kernel's journal entry names its gateway, zone and dir inode");
is((stat $journal)[2] & 07777, 0700, 'the journal is 0700');
is((stat "$journal/$kids[0]")[2] & 07777, 0600, 'its entries 0600');
ok(!-e "$kroot/hermes_rkernel_$kids[0]/gateway", 'nothing in a kernel dir says whose it is');

# a co-tenant plants dirs whose names reach a glob or name an id, each
# with a "gateway" file that names this gateway
# ("hermes_rkernel_.." is left to t/033: were the guard gone, it would
# name the root cgroups, and this host's every process)
my $planted = 'hermes_rkernel_' . ('0' x 31) . '3';
for my $d ('hermes_rkernel_*', $planted) {
    mkdir "$kroot/$d" or die "mkdir $d: $!";
    open my $g, '>', "$kroot/$d/gateway" or die;
    print $g "$gw 0123456789abcdef\n";
    close $g;
}

# a kernel rewrites what its own dir holds, to opt out of recovery
$t->execute('/v1/execute', { session => 'a',
    code => "open('gateway', 'w').write('0000000000000000 0000000000000000\\n')" });

# what is not ours: another gateway's kernel dir, one without a marker,
# an unrelated directory
my $other = "hermes_rkernel_" . ('0' x 31) . '1';
my $bare = "hermes_rkernel_" . ('0' x 31) . '2';
for my $d ($other, $bare, 'unrelated') {
    mkdir "$kroot/$d", 0700 or die "mkdir $d: $!";
}
open my $f, '>', "$kroot/$other/gateway" or die;
print $f "ffffffffffffffff 0123456789abcdef\n";
close $f;

# the crash: master and workers killed at once, the kernels run on
my $mp = $t->master_pid;
my @w = $t->worker_pids;
kill 'KILL', $mp, @w;
ok(wait_until(sub { !kill 0, $mp }, 5), 'nginx crashed');
$t->{running} = 0;
is(scalar(grep { runner_pid($_) } @kids), 2, 'its kernels outlived it');

# the start after it
$t->run;
ok(wait_until(sub { !grep { -e "$kroot/hermes_rkernel_$_" } @kids }, 10),
    'the kernels left by the crashed run are removed');
ok(wait_until(sub { !grep { runner_pid($_) } @kids }, 5), 'and their runners killed');
ok(wait_until(sub { !grep { (readlink("/proc/$_/cwd") // '') =~ /hermes_rkernel_(?:\Q$kids[0]\E|\Q$kids[1]\E)$/ } $t->prefix_pids }, 5),
    'and their children');
ok(-d "$kroot/$other", "another gateway's kernel dir is kept");
ok(-d "$kroot/$planted", 'a planted dir naming this gateway is not acted on');
ok(-d "$kroot/hermes_rkernel_*", 'nor one named by a glob');
ok(runner_pid($bk), "another gateway's kernel outlived the plants");
ok(!-e "$journal/$kids[0]" && !-e "$journal/$kids[1]", 'the leftovers are gone from the journal');
ok(-d "$kroot/$bare", 'a kernel dir without a marker is kept');
ok(-d "$kroot/unrelated", 'an unrelated dir is kept');
my $said = qr/hermes: removed 2 kernel\(s\) left by an earlier run of this gateway in "\Q$kroot\E" on localhost: /;
ok(wait_until(sub { $t->error_log =~ $said }, 5), 'error.log says what was removed')
    or diag($t->error_log);

# the new run's kernels are not leftovers, a reload keeps them
my $r = $t->execute('/v1/execute', { session => 'c', code => "print('new')" });
my $kid = $r->{result}{kernel}{kernel_id};
ok($t->reload, 'reloaded');
sleep 1;
ok(runner_pid($kid), "a reload does not remove the zone's own kernels");
$r = $t->execute('/v1/execute', { session => 'c', code => "print('again')" });
is($r->{events}[0]{reused}, JSON::PP::true, 'the kernel is reused after the reload');

$t->stop;
$by->stop;

# a journal another user made first (a co-tenant on a shared root):
# nothing in it is trusted, no kernel starts, and error.log says why
my $u = gateway('planted', stopped => 1);
my $pj = $u->kroot . "/hermes_journal_$<";
mkdir $pj, 0700 or die "mkdir $pj: $!";
chown 65534, 65534, $pj or die "chown $pj: $!";
$u->run;
$r = $u->execute('/v1/execute', { session => 'x', code => "print(1)" });
is($r->{status}, 502, "another user's journal: no kernel starts");
like($u->error_log, qr/journal \Q$pj\E is not a directory of uid \d+ with mode 0700/,
    'and error.log says why') or diag($u->error_log);
$u->stop;

done_testing;
