#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A sandboxed kernel outlives the shell that started it, however late that
# shell exits.  bwrap --die-with-parent kills the kernel when bwrap's
# parent dies; the spawn's shell (which removes kernel.env and prints the
# pid after starting the kernel in the background) used to be that
# parent, so a kernel whose bwrap came up before the shell was gone died
# with it: about one kernel in four under load (found by make bench).
# Here the shell is made slow on purpose (an `rm` of kernel.env that
# takes a second, on the ssh login's PATH), which made every such kernel
# die.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;
plan skip_all => 'bwrap is not installed' unless -x '/usr/bin/bwrap';

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));

my $bin = "$p/fakebin";
mkdir $bin, 0755 or die;
open my $f, '>', "$bin/rm" or die;
print $f <<"SH";
#!/bin/bash
# slow only for kernel.env: the start step's, after the kernel started
case "\$*" in *kernel.env*) [ -e '$p/slow' ] && sleep 1 ;; esac
exec /usr/bin/rm "\$@"
SH
close $f;
chmod 0755, "$bin/rm";

{
    my $cf = $s->config_file;
    open my $in, '<', $cf or die;
    local $/;
    my $c = <$in>;
    close $in;
    $c =~ s{^SetEnv (.*)$}{SetEnv $1 PATH=$bin:/usr/bin:/bin}m
        or die "no SetEnv line in $cf";
    open my $out, '>', $cf or die;
    print $out $c;
    close $out;
}

$s->start;

mkdir "$p/kroot/ssh", 0711;

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /x {
            hermes_execute;
            hermes_sandbox bwrap;
            hermes_backend ssh host=127.0.0.1:${\ $s->port } root=%%KROOT%%/ssh
                user=root identity=${\ $s->identity }
                known_hosts=${\ $s->known_hosts } connect_timeout=3s;
        }
    }
CONF
$t->run;

open my $sw, '>', "$p/slow" or die;
close $sw;

for my $i (1 .. 3) {
    my $t0 = time;
    my $r = $t->execute('/x', { session => "d$i", code => "x = $i\nprint('up')" });
    is($r->{result}{output}, "up\n", "kernel $i: started and ran its first cell")
        or diag explain $r;
    ok(time - $t0 >= 1, "kernel $i: the spawn's shell was slow");
    sleep 0.5;
    $r = $t->execute('/x', { session => "d$i", code => "print(x)" });
    is($r->{result}{output}, "$i\n", "kernel $i: alive after its spawn's shell is gone");
    is($r->{events}[0]{reused}, JSON::PP::true, "kernel $i: the same kernel");
}

$t->stop;
$s->stop;
done_testing;
