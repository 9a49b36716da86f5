#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The kernel host's disk fills up (a cell writes until it cannot): the
# cell ends at once with status "error" and a clear message, not at its
# timeout; a cell that swallows the errors ends too; a cell shipped while
# the disk is still full is answered 503 disk_full; and the kernel, with
# its globals, is there for the next cell once space is free.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

plan skip_all => 'needs root to mount a tmpfs' if $> != 0;

my $t = Hermes::Test->new(workers => 1);
my $root = $t->prefix . '/small';
mkdir $root, 0700 or die;
if (system('mount', '-t', 'tmpfs', '-o', 'size=8m,mode=0711', 'hermes-test', $root) != 0) {
    plan skip_all => 'cannot mount a tmpfs here';
}
END { system('umount', '-l', $root) if $root && -d $root }

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=$root;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 30s;

        location = /x { hermes_execute; }
        location /k { hermes_kernels; hermes_max_file 20m; }
        client_max_body_size 20m;
    }
CONF
$t->run;

my $r = $t->execute('/x', {session => 'full', code => 'x = 41'});
is($r->{result}{status}, 'success', 'a kernel on the small disk');
my $kid = $r->{events}[0]{kernel_id};

my $fill = <<'PY';
import os
fd = os.open('fill', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
try:
    while True:
        os.write(fd, bytes(65536))
except OSError as e:
    err = e
os.close(fd)
PY

for my $case (['prints after the disk filled', "print('after', err)\nprint('not reached')"],
              ['swallows every error', "while True:\n    try:\n        print(1)\n    except Exception:\n        pass"])
{
    my ($what, $tail) = @$case;
    my $t0 = time;
    $r = $t->execute('/x', {session => 'full', code => "$fill$tail"});
    my $took = time - $t0;
    ok($took < 10, sprintf("a cell that %s ends in %.1f s, not at its 30 s timeout", $what, $took));
    is($r->{result}{status}, 'error', "... status error");
    like($r->{result}{error} // '', qr/disk is full/, "... the error says the disk is full");
    unlike($r->{raw} // '', qr/not reached/, '... nothing after the failed write ran');
    my $bad = grep { ($_->{type} // '') eq '_invalid_json' } @{ $r->{events} };
    is($bad, 0, '... every line of the stream is whole JSON');
    is($r->{events}[0]{kernel_id}, $kid, '... on the same kernel');
}

# the disk is still full: a small request goes inline (the wake FIFO)
# and its result into the reserve; a large one cannot even be written
{
    my $d = "$root/hermes_rkernel_$kid";
    open my $f, '>>', "$d/fill2" or die;
    while (syswrite($f, "\0" x 65536)) { }
    close $f;
    $r = $t->execute('/x', {session => 'full', code => 'x'});
    is($r->{status}, 200, 'a small cell on a full disk: 200');
    ok($r->{result}, '... with its result');
    is($r->{events}[0]{kernel_id}, $kid, '... on the same kernel');
    # (it removed the files of the cells before: full again)
    open $f, '>>', "$d/fill2" or die;
    while (syswrite($f, "\0" x 4096)) { }
    close $f;
    $r = $t->execute('/x', {session => 'full', code => "print(x)\n#" . ('p' x 5000)});
    is($r->{status}, 503, 'a large cell shipped onto a full disk: 503');
    is($r->{json}{error}{code}, 'disk_full', '... disk_full');
    ok($r->{headers}{'retry-after'}, '... with Retry-After');
    unlink "$d/fill2";
}

$r = $t->execute('/x', {session => 'full', code => "import os\nos.remove('fill')\nprint(x + 1)"});
is($r->{result}{status}, 'success', 'space freed: the next cell runs');
is($r->{result}{output}, "42\n", '... with the globals of before');
is($r->{events}[0]{kernel_id}, $kid, '... on the same kernel');
ok(!$r->{events}[0]{state_lost}, '... its state not lost');

# a PUT that the full disk cuts short: 502, and nothing of it left behind
{
    my $big = 'x' x (12 * 1024 * 1024);
    $r = $t->raw_request('PUT', '/k/full/files/big.bin', body => $big,
        content_type => 'application/octet-stream');
    is($r->{status}, 502, 'a PUT past the free space: 502');
    my $d = "$root/hermes_rkernel_$kid";
    opendir my $dh, $d or die "$d: $!";
    is(join(' ', grep { /big/ } readdir $dh), '', '... nothing of it left in the kernel dir');
}

$t->stop;
done_testing;
