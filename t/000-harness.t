#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Self-test of t/lib/Hermes/Test.pm, without the hermes module.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time sleep);
use Cwd qw(abs_path);
use File::Basename qw(dirname);

use Hermes::Test;

plan skip_all => 'nginx binary not found'
    unless -x Hermes::Test::nginx_binary();

my $root = abs_path(dirname(abs_path(__FILE__)) . '/..');

# --- chunked decoder, unit level ------------------------------------------

{
    my $canned = "4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n"
               . "0\r\nX-Trailer: 1\r\n\r\n";
    my ($body, $done) = parse_chunked($canned);
    is($body, "Wikipedia in \r\n\r\nchunks.", 'parse_chunked: body');
    ok($done, 'parse_chunked: complete');

    my ($part, $pdone) = parse_chunked(substr($canned, 0, 20));
    ok(!$pdone, 'parse_chunked: truncated input is incomplete');

    my $p = Hermes::Test::Chunked->new;
    my $acc = '';
    $acc .= $p->feed($_) for split //, $canned;
    is($acc, $body, 'chunked parser fed byte by byte');
    ok($p->done, 'byte-by-byte parser done');

    ok(!eval { parse_chunked("zz\r\nabc\r\n"); 1 }, 'bad chunk size dies');

    my $ev = parse_ndjson(qq({"type":"stdout","text":"a"}\n{"type":"result","status":"success"}\nnot json\n));
    is(scalar @$ev, 3, 'parse_ndjson: 3 lines');
    is($ev->[1]{status}, 'success', 'parse_ndjson: decoded');
    is($ev->[2]{type}, '_invalid_json', 'parse_ndjson: invalid line flagged');
}

# --- paths and conf -------------------------------------------------------

{
    local $ENV{HERMES_MODULE};
    delete $ENV{HERMES_MODULE};
    my $t = Hermes::Test->new;
    is($t->module_path, "$root/build/ngx_http_hermes_module.so",
        'module path derived from the location of Test.pm');
    my $conf = $t->write_conf("server { listen 127.0.0.1:%%PORT_0%%; root %%PREFIX%%; # %%KROOT%%\n}");
    like($conf, qr/^load_module \Q$root\E\/build\/ngx_http_hermes_module\.so;/m,
        'load_module line');
    my $p0 = $t->port(0);
    like($conf, qr/listen 127\.0\.0\.1:$p0;/, 'PORT_0 substituted');
    like($conf, qr/root \Q${\ $t->prefix }\E;/, 'PREFIX substituted');
    like($conf, qr/# \Q${\ $t->kroot }\E/, 'KROOT substituted');
    is($t->port(0), $p0, 'port(0) stable');
    isnt($t->port(1), $p0, 'port(1) differs');
    ok(-d $t->kroot, 'kroot exists');
    is((stat $t->kroot)[2] & 07777, 0711, 'kroot is 0711 (passable, not listable)');

    local $ENV{HERMES_NO_MODULE} = 1;
    unlike($t->write_conf(''), qr/load_module/, 'HERMES_NO_MODULE omits load_module');
}

# --- a real nginx ---------------------------------------------------------

my $t = Hermes::Test->new;
$t->{no_module} = 1;
my $conf = $t->write_conf(<<'EOC');
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location / { return 200 "hi\n"; }
        location /j { default_type application/json; return 200 '{"a":1}'; }
    }
EOC
unlike($conf, qr/load_module/, 'no_module: no load_module line');
like($conf, qr/^user root;/m, 'user root when root') if $> == 0;

my ($rc, $out) = $t->test_config;
is($rc, 0, 'nginx -t ok') or diag $out;

$t->run;
ok($t->master_pid, 'master pid ' . ($t->master_pid // 'none'));
my @w = $t->worker_pids;
is(scalar @w, 2, 'two workers: @w');

my $r = $t->http(GET => '/');
is($r->{status}, 200, 'GET / 200');
is($r->{content}, "hi\n", 'GET / body');
ok(!defined $r->{json}, 'text body: no json');

$r = $t->http(GET => '/j');
is($r->{status}, 200, 'GET /j 200');
like($r->{headers}{'content-type'}, qr{application/json}, 'lowercased header names');
is_deeply($r->{json}, { a => 1 }, 'json decoded');

$r = $t->http(GET => '/nope/../../x');
is($r->{status}, 400, 'bad path 400 from nginx');

# the raw client against nginx (content-length answers)
$r = $t->execute('/j', { session => 's', code => 'print(1)' }, json => 1);
is($r->{status}, 200, 'execute json=>1 status');
is_deeply($r->{json}, { a => 1 }, 'execute json=>1 decoded');
$r = $t->execute('/', { session => 's', code => 'x' });
is($r->{raw}, "hi\n", 'execute: raw body (content-length)');
is(scalar @{ $r->{events} }, 1, 'execute: one line');
is($r->{events}[0]{type}, '_invalid_json', 'non-JSON line flagged');
ok(!$r->{result}, 'no result event');

my @asyncs = map { $t->execute_async('/j', { n => $_ }, json => 1) } 1 .. 3;
my @ares = map { $_->wait } @asyncs;
is_deeply([ map { $_->{json}{a} } @ares ], [1, 1, 1], 'execute_async x3');

ok(scalar(procs_matching(qr/^nginx: master process/)) >= 1, 'procs_matching');
my $cl = all_cmdlines();
like($cl->{$$} // '', qr/\0/, 'all_cmdlines keeps NULs') if ($cl->{$$} // '') =~ /\0./;
ok(exists $cl->{$t->master_pid}, 'all_cmdlines has the master');

# reload
ok($t->reload, 'reload');
my @w2 = $t->worker_pids;
is(scalar @w2, 2, 'two new workers');
my %old = map { $_ => 1 } @w;
ok(!grep({ $old{$_} } @w2), "worker pids changed: @w -> @w2");
is($t->http(GET => '/')->{status}, 200, 'GET after reload');

# kroot_dirs
mkdir $t->kroot . '/hermes_rkernel_abc', 0700;
mkdir $t->kroot . '/other', 0700;
is_deeply([ $t->kroot_dirs ], [ $t->kroot . '/hermes_rkernel_abc' ], 'kroot_dirs');

# stray process in the prefix is found and killed
my $stray = fork // die;
if (!$stray) { chdir $t->kroot; POSIX::setsid(); { no warnings "exec"; exec "sleep", "60" } POSIX::_exit(1) }
ok(wait_until(sub { grep { $_ == $stray } $t->prefix_pids }, 3), 'prefix_pids sees a stray');
is($t->kill_strays, 1, 'kill_strays');
waitpid $stray, 0;

# error log scan
{
    local $t->{allow_log_re} = qr/deliberate/;
    open my $fh, '>>', $t->prefix . '/logs/error.log';
    print $fh "2024/01/01 00:00:00 [alert] 1#1: deliberate alert\n";
    close $fh;
    is_deeply([ $t->_bad_log_lines ], [], 'allow_log_re skips a line');
    delete $t->{allow_log_re};
    is(scalar($t->_bad_log_lines), 1, 'an [alert] line is found');
    # leave it allowed so the stop check passes
}
$t->{allow_log_re} = qr/deliberate/;

my $mp = $t->master_pid;
$t->stop;                       # runs the "no alert/crit/emerg" test
ok(!pid_alive($mp), "master $mp gone after stop");
is($t->http(GET => "/", timeout => 2)->{status}, 599, 'nothing listens after stop');

# nginx -t with a bogus directive
{
    my $t2 = Hermes::Test->new(no_module => 1, workers => 1);
    $t2->write_conf("bogus_directive_xyz on;\nserver { listen 127.0.0.1:%%PORT_0%%; }");
    my ($rc2, $out2) = $t2->test_config;
    isnt($rc2, 0, 'nginx -t with a bogus directive fails');
    like($out2, qr/unknown directive "bogus_directive_xyz"/, 'nginx -t output');
    unlike($t2->error_log, qr/emerg/, 'nginx -t does not write error.log');
    ok(!$t2->try_run, 'try_run fails');
    like($t2->{run_error} // '', qr/bogus_directive_xyz/, 'run_error has the reason');
    ok(!eval { $t2->run; 1 }, 'run dies');
}

# --- the streaming client against a fake chunked NDJSON server -----------

{
    my $ts = Hermes::Test->new(no_module => 1);
    my $port = $ts->port(0);
    my $srv = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
        Listen => 5, ReuseAddr => 1) or die "listen: $!";
    my $pid = fork // die;
    if (!$pid) {
        for my $conn_no (1 .. 2) {
            my $c = $srv->accept or POSIX::_exit(1);
            $c->autoflush(1);
            my $req = '';
            while ($req !~ /\r\n\r\n/) { sysread($c, $req, 4096, length $req) or last }
            my ($len) = $req =~ /Content-Length: (\d+)/i;
            my ($hdr, $b) = split /\r\n\r\n/, $req, 2;
            while (length($b) < ($len // 0)) { sysread($c, $b, 4096, length $b) or last }
            my $seen = ($b =~ /"code"/) ? 'yes' : 'no';
            print $c "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                   . "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            my $chunk = sub { my $d = shift; print $c sprintf("%x\r\n", length $d), $d, "\r\n" };
            $chunk->(qq({"type":"kernel","body_seen":"$seen"}\n));
            sleep 0.3;
            $chunk->(qq({"type":"stdout",));        # a line split over chunks
            $chunk->(qq("text":"x"}\n{"type"));
            sleep 0.3;
            $chunk->(qq(:"result","status":"success"}\n));
            print $c "0\r\n\r\n";
            close $c;
        }
        POSIX::_exit(0);
    }
    close $srv;

    my @seen;
    my $r = $ts->execute('/x', { session => 's', code => 'print(1)' },
        on_event => sub { push @seen, [ $_[0]{type}, $_[1] ] });
    is($r->{status}, 200, 'stream: 200');
    is_deeply([ map { $_->{type} } @{ $r->{events} } ], [qw(kernel stdout result)],
        'stream: events');
    is($r->{events}[0]{body_seen}, 'yes', 'stream: body sent');
    is($r->{result}{status}, 'success', 'stream: result');
    is(scalar @{ $r->{times} }, 3, 'stream: times');
    cmp_ok($r->{times}[1] - $r->{times}[0], '>=', 0.25, 'stream: 2nd line arrived later');
    cmp_ok($r->{times}[2] - $r->{times}[1], '>=', 0.25, 'stream: 3rd line arrived later');
    cmp_ok($r->{times}[0], '<', 0.25, 'stream: 1st line arrived at once');
    is_deeply([ map { $_->[0] } @seen ], [qw(kernel stdout result)], 'on_event called');
    ok(!$r->{error}, 'stream: no error') or diag $r->{error};

    # abort after the first event
    $r = $ts->execute('/x', { code => 1 }, on_event => sub { ABORT_STREAM });
    ok($r->{aborted}, 'on_event ABORT_STREAM hangs up');
    is(scalar @{ $r->{events} }, 1, 'one event before hanging up');

    waitpid $pid, 0;
    $r = $ts->execute('/x', { code => 1 }, timeout => 2);
    is($r->{status}, 599, 'connection refused gives 599');
    ok($r->{error}, 'with an error');
}

ok(wait_until(sub { 1 }, 1), 'wait_until true');
my $t0 = time;
ok(!wait_until(sub { 0 }, 0.2), 'wait_until false');
cmp_ok(time - $t0, '>=', 0.19, 'wait_until waited');

done_testing;
