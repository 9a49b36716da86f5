#!/usr/bin/perl
# A start after a crash: the kernels an earlier run of this gateway left
# in its root are killed and removed, with a log line; another gateway's
# kernel dirs, and anything else there, are not touched; a reload (the
# zone kept) removes nothing.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new(workers => 2);
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
        }
    }
CONF
$t->run;

my @kids;
for my $s (qw(a b)) {
    my $r = $t->execute('/v1/execute', { session => $s,
        code => "import subprocess\np = subprocess.Popen(['sleep', '300'])\nprint('up')" });
    push @kids, $r->{result}{kernel}{kernel_id};
}
is(scalar(grep { defined && runner_pid($_) } @kids), 2, 'two kernels run');

my $kroot = $t->kroot;
my ($marker) = map { local $/; open my $f, '<', "$kroot/hermes_rkernel_$_/gateway" or die; <$f> } $kids[0];
like($marker, qr/^[0-9a-f]{16} [0-9a-f]{16}\n$/, 'each kernel dir names its gateway and zone');

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

done_testing;
