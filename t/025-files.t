#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Files into and out of a kernel's working directory: PUT and GET
# <kernels>/SESSION/files/PATH, owner-scoped, confined to the kernel dir
# (no "..", no absolute path, no symlink out, no FIFO), bounded by
# hermes_max_file, written 0600; on the local and the ssh backend.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use Socket ();
use Time::HiRes qw(time sleep);
use POSIX ();

use Hermes::Test;
use Hermes::Sshd;

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

my $s;
my $ssh = '';
unless (Hermes::Sshd->unavailable) {
    $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
    $s->start;
    $ssh = "host=127.0.0.1:" . $s->port . " known_hosts=" . $s->known_hosts
        . " user=root identity=" . $s->identity . " connect_timeout=3s";
}

my $ssh_loc = $s ? <<"LOC" : '';
        location = /ssh/execute {
            hermes_execute;
            hermes_owner \$http_x_owner;
            hermes_backend ssh $ssh root=%%KROOT%%/ssh;
        }

        location /ssh/kernels {
            hermes_kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 1m;
        }

        location /ssh/big {
            hermes_kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 5m;
        }
LOC

mkdir "$p/kroot/ssh", 0711;

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        client_max_body_size 8m;

        location = /v1/execute {
            hermes_execute;
            hermes_owner \$http_x_owner;
        }

        location /v1/kernels {
            hermes_kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 1m;
        }

        location /v1/big {
            hermes_kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 5m;
        }

        location /v1/huge {
            hermes_kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 100m;
            client_max_body_size 100m;
        }
$ssh_loc
    }
CONF
$t->run;

sub put {
    my ($base, $sess, $path, $body, $owner) = @_;
    return $t->raw_request('PUT', "$base/$sess/files/$path", body => $body,
        content_type => 'application/octet-stream',
        headers => { 'X-Owner' => $owner // 'alice' });
}

sub get {
    my ($base, $sess, $path, $owner) = @_;
    return $t->raw_request('GET', "$base/$sess/files/$path",
        headers => { 'X-Owner' => $owner // 'alice' });
}

sub run_cell {
    my ($exec, $sess, $code, $owner) = @_;
    return $t->execute($exec, { session => $sess, code => $code },
        headers => { 'X-Owner' => $owner // 'alice' });
}

sub err { my $r = shift; my $j = eval { JSON::PP->new->decode($r->{content}) }; ($j // {})->{error}{code} // '' }

my @backends = (['local', '/v1/execute', '/v1/kernels', $t->kroot]);
push @backends, ['ssh', '/ssh/execute', '/ssh/kernels', $t->kroot . '/ssh'] if $s;

for my $b (@backends) {
    my ($name, $exec, $kern, $root) = @$b;
    my $sess = "f-$name";

    my $r = put($kern, $sess, 'data.txt', "x");
    is($r->{status}, 404, "$name: no kernel yet: 404");

    $r = run_cell($exec, $sess, "import os\nprint(os.getcwd().endswith('hermes_rkernel_' + os.environ.get('HERMES_KERNEL_ID', '')) or True)");
    my $kid = $r->{result}{kernel}{kernel_id};
    my $dir = "$root/hermes_rkernel_$kid";
    ok($kid, "$name: a kernel");

    # a round trip, binary and with subdirectories made on the way
    my $bytes = join '', map { chr } 0 .. 255;
    $bytes x= 64;
    $r = put($kern, $sess, 'in/sub/data.bin', $bytes);
    is($r->{status}, 204, "$name: PUT: 204");
    $r = run_cell($exec, $sess, "d = open('in/sub/data.bin', 'rb').read()\nprint(len(d), d[:3] == bytes([0, 1, 2]))");
    is($r->{result}{output}, length($bytes) . " True\n", "$name: the cell reads what was put");
    my @st = stat "$dir/in/sub/data.bin";
    is($st[2] & 07777, 0600, "$name: the file is 0600");
    is((stat "$dir/in")[2] & 07777, 0700, "$name: a directory made on the way is 0700");
    is($st[4], (stat $dir)[4], "$name: the file belongs to the kernel's user");

    $r = run_cell($exec, $sess, "open('out.csv', 'w').write('a,b\\n1,2\\n')");
    $r = get($kern, $sess, 'out.csv');
    is($r->{status}, 200, "$name: GET: 200");
    is($r->{content}, "a,b\n1,2\n", "$name: GET: what the cell wrote");
    like($r->{headers}{'content-type'}, qr{^application/octet-stream}, "$name: GET: octet-stream");
    $r = get($kern, $sess, 'in/sub/data.bin');
    is($r->{content}, $bytes, "$name: GET: binary round trip");

    # overwrite
    $r = put($kern, $sess, 'out.csv', "new\n");
    is(get($kern, $sess, 'out.csv')->{content}, "new\n", "$name: PUT replaces");

    # what is not there, not the caller's, too big
    $r = get($kern, $sess, 'nothing.txt');
    is($r->{status}, 404, "$name: no such file: 404");
    $r = get($kern, $sess, 'out.csv', 'mallory');
    is($r->{status}, 404, "$name: another owner's kernel: 404");
    $r = put($kern, $sess, 'big.bin', 'x' x (1024 * 1024 + 1));
    is($r->{status}, 413, "$name: PUT over hermes_max_file: 413");
    ok(!-e "$dir/big.bin" && !-e "$dir/big.bin.tmp", "$name: nothing left of it");
    run_cell($exec, $sess, "open('big.out', 'wb').write(b'y' * (1024 * 1024 + 1))");
    $r = get($kern, $sess, 'big.out');
    is($r->{status}, 413, "$name: GET over hermes_max_file: 413");

    # nginx normalizes "//" and "./" away: such paths stay inside
    for my $c (['/abs/y', 'abs/y'], ['a//b', 'a/b'], ['./x', 'x']) {
        my ($u, $inside) = @$c;
        $r = put($kern, $sess, $u, 'n');
        is($r->{status}, 204, "$name: PUT $u: normalized by nginx");
        ok(-f "$dir/$inside", "$name: PUT $u: landed inside the kernel dir as $inside");
    }
    ok(!-e '/abs', "$name: nothing at /abs");

    # confinement: refused before anything runs
    for my $bad ('../x', 'a/../../x', "a'b", "a\\b", 'cells/x',
                 'kernel_runner.py', 'kernel_runner.pyc', 'kernel_start.py', 'rpc',
                 '.hermes_result.tmp', '..')
    {
        (my $u = $bad) =~ s/([^A-Za-z0-9._\/-])/sprintf('%%%02X', ord $1)/ge;
        $r = put($kern, $sess, $u, 'x');
        ok($r->{status} == 400 || $r->{status} == 404, "$name: PUT $bad: refused ($r->{status})");
        $r = get($kern, $sess, $u);
        ok($r->{status} == 400 || $r->{status} == 404, "$name: GET $bad: refused ($r->{status})");
    }
    ok(!-e "$p/x" && !-e "$root/x", "$name: nothing written outside the kernel dir");

    # what a cell planted: a symlink out (to this test's canary, owned by
    # root: were the guard gone, the canary takes the write, never a file
    # of the host), a FIFO, a directory
    my $canary = "$p/canary-etc";
    unless (-d $canary) {
        mkdir $canary, 0755 or die "mkdir $canary: $!";
        open my $cf, '>', "$canary/hostname" or die;
        print $cf "canary\n";
        close $cf;
        chmod 0644, "$canary/hostname";
    }
    $r = run_cell($exec, $sess, "import os\nos.symlink('$canary', 'letc')\nos.symlink('$canary/hostname', 'host')\n"
        . "os.mkfifo('fifo')\nos.mkdir('adir')\nprint('planted')");
    is($r->{result}{output}, "planted\n", "$name: a cell planted a symlink, a FIFO, a directory");
    for my $c (['letc/hostname', 'a symlinked directory'], ['host', 'a symlink'],
               ['fifo', 'a FIFO'], ['adir', 'a directory'])
    {
        my ($path, $what) = @$c;
        my $t0 = time;
        $r = get($kern, $sess, $path);
        is($r->{status}, 400, "$name: GET through $what: 400");
        is(err($r), 'invalid_path', "$name: GET through $what: invalid_path");
        ok(time - $t0 < 5, "$name: GET of $what does not hang");
        $r = put($kern, $sess, $path, 'z');
        is($r->{status}, 400, "$name: PUT through $what: 400");
    }
    is(do { local $/; open my $f, '<', "$canary/hostname"; <$f> }, "canary\n",
        "$name: the canary behind the links untouched");
    is(join(' ', do { opendir(my $d, $canary); sort grep { !/^\.\.?$/ } readdir $d }), 'hostname',
        "$name: no file made through the link");

    # the kernel lives on, with its state
    $r = run_cell($exec, $sess, "print(len(d))");
    is($r->{result}{output}, length($bytes) . "\n", "$name: the kernel kept its state");
}

# files of any size up to hermes_max_file, on both backends (over ssh in
# pieces: an agent's frame holds 1 MiB): whole, or an error, never a 200
# with a part; a chunked PUT past the bound is 413 and leaves nothing
for my $b (@backends) {
    my ($name, $exec, undef, $root) = @$b;
    (my $big = $exec) =~ s{/execute$}{/big};
    my $sess = "big-$name";
    my $r = run_cell($exec, $sess, "open('made.bin', 'wb').write(bytes(range(256)) * (9 * 2048) + b'z')");
    my $kid = $r->{result}{kernel}{kernel_id};
    my $dir = "$root/hermes_rkernel_$kid";
    $r = get($big, $sess, 'made.bin');
    is($r->{status}, 200, "$name: GET of 4.5 MiB + 1 (pieces of it): 200");
    is(length($r->{content} // ''), 9 * 512 * 1024 + 1, "$name: all of it");
    ok(($r->{content} // '') eq (pack('C*', 0 .. 255) x (9 * 2048)) . 'z', "$name: byte for byte");

    my $bytes = join '', map { chr(int rand 256) } 1 .. 2 * 1024 * 1024 + 7;
    $r = put($big, $sess, 'in/two.bin', $bytes);
    is($r->{status}, 204, "$name: PUT of 2 MiB + 7: 204") or diag $r->{content};
    $r = run_cell($exec, $sess, "import hashlib\nprint(hashlib.sha256(open('in/two.bin', 'rb').read()).hexdigest())");
    require Digest::SHA;
    is($r->{result}{output}, Digest::SHA::sha256_hex($bytes) . "\n", "$name: the kernel sees it whole");
    is(get($big, $sess, 'in/two.bin')->{content}, $bytes, "$name: and GET gives it back");

    # chunked, past hermes_max_file (5m): 413, nothing left behind
    my $over = 'y' x (5 * 1024 * 1024 + 1);
    my $body = join('', map { sprintf("%x\r\n%s\r\n", length $_, $_) } unpack('(a1048576)*', $over)) . "0\r\n\r\n";
    $r = $t->raw_request('PUT', "$big/$sess/files/over.bin", body => $body,
        content_type => 'application/octet-stream',
        headers => { 'X-Owner' => 'alice', 'Transfer-Encoding' => 'chunked' });
    is($r->{status}, 413, "$name: a chunked PUT past hermes_max_file: 413");
    opendir my $dh, $dir or die "$dir: $!";
    is(join(' ', grep { /over/ } readdir $dh), '', "$name: nothing of it left in the kernel dir");
}

# slow readers of a large (sparse) file: the worker holds a piece of it a
# transfer, not the file; an owner has 4 transfers at once in a worker,
# the next is 429 until one is done
{
    my $sess = 'slow-readers';
    for my $o (qw(alice carol)) {
        my $r = run_cell('/v1/execute', $sess, "import os\nf = open('sparse.bin', 'wb')\nf.truncate(95 * 2**20)\nf.close()", $o);
        is($r->{result}{status}, 'success', "$o: a 95 MB sparse file");
    }
    my ($w) = $t->worker_pids;
    my $rss = sub {
        my $st = do { local $/; open my $f, '<', "/proc/$w/status" or return 0; <$f> } // '';
        return $st =~ /^VmRSS:\s+(\d+) kB/m ? $1 : 0;
    };
    my $open = sub {
        my ($o) = @_;
        my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0)) or die "connect: $!";
        setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 16384);
        print $c "GET /v1/huge/$sess/files/sparse.bin HTTP/1.1\r\nHost: x\r\nX-Owner: $o\r\n\r\n";
        my $head = '';
        while ($head !~ /\r\n\r\n/) { sysread($c, my $b, 1) or last; $head .= $b }
        return ($c, $head =~ m{^HTTP/1\.1 (\d+)} ? $1 : 0);
    };
    my $rss0 = $rss->();
    my (@c, %st);
    for my $o ((qw(alice)) x 4, (qw(carol)) x 4) {
        my ($c, $st) = $open->($o);
        push @c, $c;
        $st{$st}++;
    }
    is($st{200}, 8, '4 transfers of each of two owners under way at once');
    my ($c5, $st5) = $open->('alice');
    is($st5, 429, "an owner's fifth at once: 429");
    close $c5;
    my $peak = 0;
    for (1 .. 20) {         # 2 s of reading a little from each
        for my $c (@c) { sysread($c, my $buf, 4096) }
        my $g = $rss->() - $rss0;
        $peak = $g if $g > $peak;
        select undef, undef, undef, 0.1;
    }
    close $_ for @c;
    SKIP: {
        skip 'AddressSanitizer: freed memory stays resident in its quarantine', 1
            if ($ENV{HERMES_NGINX_PRELOAD} // '') =~ /asan/;
        ok($peak < 64 * 1024, sprintf('8 slow readers of 95 MB: the worker grew by %.1f MB at most', $peak / 1024));
    }
    my $ok = wait_until(sub { my ($c, $st) = $open->('alice'); close $c; $st == 200 }, 5);
    ok($ok, 'once they are done, the owner transfers again');
}

# large PUTs at once: the worker holds a piece of each, not the file (the
# body stays in nginx's temp file and goes a piece at a time)
{
    my $sess = 'big-puts';
    my $r = run_cell('/v1/execute', $sess, 'pass', 'alice');
    is($r->{result}{status}, 'success', 'a kernel for the PUTs');
    my ($w) = $t->worker_pids;
    my $rss = sub {
        my $st = do { local $/; open my $f, '<', "/proc/$w/status" or return 0; <$f> } // '';
        return $st =~ /^VmRSS:\s+(\d+) kB/m ? $1 : 0;
    };
    my $mb = 40;
    my $rss0 = $rss->();
    my @kids;
    for my $i (1 .. 4) {
        my $pid = fork // die "fork: $!";
        if ($pid == 0) {
            my $body = chr(96 + $i) x ($mb * 2**20);
            my $r = put('/v1/huge', $sess, "put$i.bin", $body, 'alice');
            POSIX::_exit($r->{status} == 201 || $r->{status} == 200 || $r->{status} == 204 ? 0 : 1);
        }
        push @kids, $pid;
    }
    my ($peak, $failed, %left) = (0, 0, map { $_ => 1 } @kids);
    while (%left) {
        my $g = $rss->() - $rss0;
        $peak = $g if $g > $peak;
        for my $k (keys %left) {
            next unless waitpid($k, POSIX::WNOHANG()) == $k;
            $failed++ if $?;
            delete $left{$k};
        }
        select undef, undef, undef, 0.05;
    }
    is($failed, 0, '4 PUTs at once: each answered as a PUT is');
    $r = run_cell('/v1/execute', $sess,
        "import os\nprint(sorted((n, os.path.getsize(n), open(n, 'rb').read(1).decode()) for n in os.listdir('.') if n.startswith('put')))", 'alice');
    is($r->{result}{output}, "[('put1.bin', 41943040, 'a'), ('put2.bin', 41943040, 'b'), ('put3.bin', 41943040, 'c'), ('put4.bin', 41943040, 'd')]\n",
        "4 PUTs of $mb MB at once, each whole");
    SKIP: {
        skip 'AddressSanitizer: freed memory stays resident in its quarantine', 1
            if ($ENV{HERMES_NGINX_PRELOAD} // '') =~ /asan/;
        ok($peak < 64 * 1024, sprintf("4 PUTs of $mb MB at once: the worker grew by %.1f MB at most", $peak / 1024));
    }
}

$t->stop;
$s->stop if $s;
done_testing;
