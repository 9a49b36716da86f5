#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Bad directive arguments fail `nginx -t` with a message naming the reason.

use strict;
use warnings;

use Test::More;

use Hermes::Test;

my @bad = (
    [ 'hermes_zone kernels;', qr/NAME:SIZE expected/, 'zone without size' ],
    [ 'hermes_zone kernels:1k;', qr/too small/, 'zone too small' ],
    [ 'hermes_zone kernels:lots;', qr/invalid hermes_zone size/, 'zone size not a size' ],
    [ 'hermes_zone kernels:1m max_kernels=0;', qr/max_kernels/, 'max_kernels=0' ],
    [ 'hermes_zone kernels:1m idle_timeout=soon;', qr/idle_timeout/, 'idle_timeout bad' ],
    [ 'hermes_zone kernels:1m colour=red;', qr/invalid hermes_zone parameter/, 'unknown zone parameter' ],
    [ "hermes_zone kernels:1m;\nhermes_zone kernels:1m;", qr/duplicate hermes_zone/, 'duplicate zone' ],
    [ "hermes_zone kernels:1m;\nhermes_backend docker;", qr/unknown hermes_backend/, 'unknown backend' ],
    [ "hermes_zone kernels:1m;\nhermes_backend local root=relative/dir;", qr/absolute path/, 'relative root' ],
    [ "hermes_zone kernels:1m;\nhermes_backend local root=/tmp/it's;", qr/quote/, 'root with a quote' ],
    [ "hermes_zone kernels:1m;\nhermes_backend local root=%%PREFIX%%/nginx.conf/kroot;", qr/hermes_backend local root "[^"]*kroot".*Not a directory/, 'a root under a file' ],
    [ "hermes_zone kernels:1m;\nhermes_backend local root=%%PREFIX%%/nginx.conf;", qr/is not a directory/, 'a root that is a file' ],
    [ "hermes_zone kernels:1m;\nhermes_backend local root=%%PREFIX%%/open777;", qr/writable by others without the sticky bit/, 'a root anyone may write' ],
    [ "hermes_zone kernels:1m;\nhermes_backend local depth=3;", qr/invalid hermes_backend parameter/, 'unknown backend parameter' ],
    [ "hermes_zone kernels:1m;\nhermes_backend ssh host=127.0.0.1 user=k identity=%%PREFIX%%/nginx.conf known_hosts=%%PREFIX%%/nginx.conf;", qr/is not a private key/, 'ssh identity that is not a key' ],
    [ "hermes_zone kernels:1m;\nhermes_backend ssh host=127.0.0.1 user=k identity=%%PREFIX%%/id known_hosts=%%PREFIX%%/kh_bad;", qr/known_hosts= has a line that is not "host keytype key"/, 'ssh known_hosts with a bad line' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox docker;", qr/invalid hermes_sandbox "docker": "off" or "bwrap" expected/, 'unknown sandbox' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox off net=on;", qr/takes no options with "off"/, 'sandbox off with options' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap memory=1k;", qr/a size of at least 16m expected/, 'sandbox memory too small' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap pids=2;", qr/a number of at least 8 expected/, 'sandbox pids too few' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap cpu=0;", qr/a percent of one CPU/, 'sandbox cpu 0' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap user=root;", qr/invalid hermes_sandbox parameter "user=root"/, 'sandbox as root' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap ro=relative;", qr/invalid hermes_sandbox parameter "ro=relative"/, 'sandbox ro not absolute' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap" . join('', map { " ro=/opt/$_" } 1 .. 33) . ";", qr/invalid hermes_sandbox "ro=\/opt\/33": at most 32 "ro=" paths/, 'sandbox with 33 ro= paths' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap colour=red;", qr/invalid hermes_sandbox parameter "colour=red"/, 'sandbox unknown option' ],
    [ "hermes_zone kernels:1m;\nhermes_sandbox bwrap;\nhermes_sandbox off;", qr/is duplicate/, 'sandbox twice' ],
    [ "hermes_zone kernels:1m;\nhermes_cell_timeout forever;", qr/hermes_cell_timeout/, 'cell timeout not a time' ],
    [ "hermes_zone kernels:1m;\nhermes_max_output lots;", qr/hermes_max_output/, 'max_output not a size' ],
    [ "hermes_zone kernels:1m;\nhermes_queue -1;", qr/hermes_queue/, 'queue negative' ],
    [ "server { listen 127.0.0.1:%%PORT_0%%; location / { hermes_execute; } }", qr/needs a hermes_zone/, 'execute without a zone' ],
    [ "hermes_zone a:1m;\nserver { listen 127.0.0.1:%%PORT_0%%; location / { hermes_execute zone=b; } }", qr/unknown hermes_zone "b"/, 'execute with an unknown zone' ],
    [ "hermes_zone a:1m;\nhermes_zone b:1m;\nserver { listen 127.0.0.1:%%PORT_0%%; location / { hermes_execute; } }", qr/needs zone=NAME/, 'execute ambiguous zone' ],
    [ "hermes_zone a:1m;\nserver { listen 127.0.0.1:%%PORT_0%%; location / { hermes_execute area=a; } }", qr/zone=NAME expected/, 'execute bad parameter' ],
    [ "hermes_zone a:1m;\nserver { listen 127.0.0.1:%%PORT_0%%; location / { hermes_execute; hermes_thread_pool nowhere; } }", qr/nowhere/, 'unknown thread pool' ],
);

for my $case (@bad) {
    my ($conf, $re, $name) = @$case;
    my $t = Hermes::Test->new;
    mkdir $t->prefix . '/open777';
    chmod 0777, $t->prefix . '/open777';
    if ($conf =~ m{%%PREFIX%%/id\b}) {
        system("ssh-keygen -q -t ed25519 -N '' -f " . $t->prefix . "/id >/dev/null") == 0
            or die "ssh-keygen failed";
        open my $kh, '>', $t->prefix . '/kh_bad' or die;
        print $kh "# a comment is fine\n\n[127.0.0.1]:22 ssh-ed25519\n";
        close $kh;
    }
    $t->write_conf($conf);
    my ($rc, $out) = $t->test_config;
    isnt($rc, 0, "$name: nginx -t fails");
    like($out, $re, "$name: says why") or diag $out;
}

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone a:1m max_kernels=2 idle_timeout=10s sweep=1s;
    hermes_backend local root=%%KROOT%%/;
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location / {
            hermes_execute zone=a;
            hermes_cell_timeout 10s;
            hermes_max_output 10k;
            hermes_max_stream 1m;
            hermes_max_code 64k;
            hermes_queue 2;
            hermes_owner $remote_user;
        }
    }
CONF
my ($rc, $out) = $t->test_config;
is($rc, 0, 'a full valid configuration passes nginx -t') or diag $out;

# A kernels root that is not there is made at start, as nginx makes its
# temp paths: nginx -t passes and makes nothing; the start makes the
# missing parents (0755) and the root for the workers' user: a root
# worker's is root's at 0711 (its kernels run as another user, who passes
# through), another worker's is that user's at 0700 (its kernels run as
# it).  A root that cannot be made fails the start, saying why.

my $conf_root = <<'CONF';
    hermes_zone a:1m;
    hermes_backend local root=%%PREFIX%%/made/here/kroot;
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location / { hermes_execute; }
    }
CONF

SKIP: {
    skip 'the owners and modes of a made root need root', 12 if $> != 0;

    for my $case ([root => 0, 0711], [nobody => scalar getpwnam('nobody'), 0700]) {
        my ($user, $uid, $mode) = @$case;
        my $t = Hermes::Test->new(user => $user eq 'nobody' ? 'nobody nogroup' : $user);
        my $kroot = $t->prefix . '/made/here/kroot';
        $t->write_conf($conf_root);

        my ($rc, $out) = $t->test_config;
        is($rc, 0, "user $user: a root that is not there passes nginx -t") or diag $out;
        ok(!-e $t->prefix . '/made', "user $user: nginx -t makes nothing");

        $t->run;
        my @st = stat $kroot;
        ok(@st && -d _, "user $user: the start made the root") or diag $t->error_log;
        is(sprintf('%04o', $st[2] & 07777), sprintf('%04o', $mode),
            "user $user: its mode");
        is($st[4], $uid, "user $user: its owner");
        is(sprintf('%04o', (stat $t->prefix . '/made/here')[2] & 07777), '0755',
            "user $user: the parents made 0755");
        like($t->error_log, qr/hermes_backend local root "\Q$kroot\E" made: uid $uid, mode 0?\d+/,
            "user $user: error.log says so");

        my $r = $t->execute('/', {session => 's', code => 'import os; x = os.getuid(); x'}, json => 1);
        is($r->{json}{status}, 'success', "user $user: a cell runs in it")
            or diag explain $r;
        if ($user eq 'nobody') {
            is($r->{json}{output}, "$uid\n", 'user nobody: the kernel runs as the worker');
        } else {
            isnt($r->{json}{output}, "0\n", 'user root: the kernel does not run as root');
        }
        $t->stop;

        # a root made by hand for another user: the start says so
        if ($user eq 'nobody') {
            chown 0, 0, $kroot;
            $t->run;
            like($t->error_log, qr/hermes_backend local root "\Q$kroot\E" \(uid 0, mode 0700\) is not writable by the workers' user "nobody"/,
                'user nobody: a root it cannot write is said at start');
            $t->stop;
        }
    }
}

{
    # mkdir in /proc fails, whoever asks
    my $t = Hermes::Test->new;
    my $root = "/proc/hermes-t060-$$/kroot";
    (my $conf = $conf_root) =~ s{%%PREFIX%%/made/here/kroot}{$root};
    $t->write_conf($conf);
    my ($rc, $out) = $t->test_config;
    is($rc, 0, 'a root under a missing directory passes nginx -t') or diag $out;
    ok(!$t->try_run, 'a root that cannot be made fails the start');
    like($t->error_log, qr/hermes_backend local root "\Q$root\E" could not be made: mkdir\(\) "\/proc\/hermes-t060-$$" failed/,
        'error.log says why');
}

done_testing;
