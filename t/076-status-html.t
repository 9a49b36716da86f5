#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The status page, ?format=html, in a real browser: Debian's chromium,
# headless, loads it from a live gateway with known traffic (two owners,
# one of them named like an HTML injection, a running cell with one more
# waiting behind it, a failed spawn, a 415) and dumps the DOM it rendered
# from the JSON form; the figures in that DOM (kernels, running, queue
# depth, per host, per owner, the running cell and its age, answers, the
# histograms' buckets, the build in the header) match the JSON fetched
# around it, the hostile owner
# is text (no <img> made), the page refreshes every
# ?refresh= seconds, and its headers: text/html, no-store, a CSP that lets
# only the page's own script run (by its hash). A bad refresh is a 400.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);
use POSIX qw(:sys_wait_h);
use Digest::SHA qw(sha256_base64);

use Hermes::Test;

my ($chromium) = grep { -x } map { "$_/chromium" } split /:/, $ENV{PATH};
ok($chromium, 'chromium is installed (make test installs it)')
    or BAIL_OUT('no chromium in PATH: apt-get install chromium');

my $t = Hermes::Test->new;
my $p = $t->prefix;

mkdir "$p/no-such-dir", 0711 or die;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /x {
            hermes_execute;
            hermes_owner $http_x_owner;
            hermes_queue 2;
            hermes_cell_timeout 120s;
        }

        location = /broken {
            hermes_execute;
            hermes_backend local root=%%PREFIX%%/no-such-dir;
            hermes_sandbox off;
        }

        location /k/ {
            hermes_kernels;
            hermes_owner $http_x_owner;
        }

        location = /status {
            hermes_status;
        }
    }
CONF
$t->run;
# the root nginx -t checked goes away: its spawns fail
rmdir "$p/no-such-dir" or die "rmdir: $!";

my $port = $t->port(0);
my $XSS = '<img src=x onerror=alert(1)>';
# sessions are [A-Za-z0-9._:-]: only the owner can carry markup
my $LONG = 'long:1';

sub cell {
    my ($owner, $s, $code) = @_;
    $t->execute('/x', { session => $s, code => $code },
        headers => { 'X-Owner' => $owner });
}

###############################################################################
# the answer itself

my $r = $t->http(GET => '/status?format=html');
is($r->{status}, 200, '?format=html: 200');
like($r->{headers}{'content-type'}, qr{^text/html; charset=utf-8$}, '... text/html; charset=utf-8');
is($r->{headers}{'cache-control'}, 'no-store', '... Cache-Control: no-store');
is($r->{headers}{'x-content-type-options'}, 'nosniff', '... nosniff');
my $page = $r->{content};
like($page, qr/^<!DOCTYPE html>/, '... an HTML page');
unlike($page, qr{<(?:script|link|img|iframe)[^>]*\b(?:src|href)=}i,
    '... no external script, style or image');

my $csp = $r->{headers}{'content-security-policy'} // '';
my %csp = map { /^\s*(\S+)\s*(.*?)\s*$/ ? ($1 => $2) : () } split /;/, $csp;
is($csp{'default-src'}, "'none'", "CSP default-src 'none'");
is($csp{'connect-src'}, "'self'", "CSP connect-src 'self'");
unlike($csp, qr/unsafe-inline|unsafe-eval|\*/, 'CSP: no unsafe-inline, no wildcard');
my ($script) = $page =~ m{<script>(.*?)</script>}s;
my ($style) = $page =~ m{<style>(.*?)</style>}s;
sub csp_hash { my $h = sha256_base64($_[0]); $h .= '=' while length($h) % 4; "'sha256-$h'" }
is($csp{'script-src'}, csp_hash($script // ''), "CSP script-src: the inline script's sha256");
is($csp{'style-src'}, csp_hash($style // ''), "CSP style-src: the inline style's sha256");
is(() = $page =~ /<script\b/g, 1, 'one script');

$r = $t->http(HEAD => '/status?format=html');
is($r->{status}, 200, 'HEAD ?format=html: 200');
is($r->{content}, '', '... no body');

for my $bad ('0', '61', 'abc', '', '1.5', '-1', '99999999999999999999') {
    $r = $t->http(GET => "/status?format=html&refresh=$bad");
    is($r->{status}, 400, "?format=html&refresh=$bad: 400");
    is($r->{json}{error}{code}, 'invalid_refresh', '... invalid_refresh');
    like($r->{headers}{'content-type'}, qr{^application/json}, '... a JSON error');
}
for my $good (1, 60) {
    $r = $t->http(GET => "/status?format=html&refresh=$good");
    is($r->{status}, 200, "?format=html&refresh=$good: 200");
}
$r = $t->http(GET => '/status?format=htm');
is($r->{status}, 400, '?format=htm: 400');
is($r->{json}{error}{code}, 'invalid_format', '... invalid_format');
like($r->{json}{error}{message} // '', qr/html/, '... the message names html');

###############################################################################
# known traffic

is(cell('alice', 'a1', 'print(1)')->{result}{status}, 'success', 'alice a1');
is(cell('alice', 'a2', 'print(2)')->{result}{status}, 'success', 'alice a2');
is(cell('alice', 'a2', "import time\ntime.sleep(0.3)")->{result}{status}, 'success',
    'alice a2, 0.3 s');
is(cell($XSS, 'x1', 'print(3)')->{result}{status}, 'success', 'the hostile owner x1');

$r = $t->raw_request(POST => '/x', body => '{"code":"1"}', content_type => 'text/plain',
    headers => { 'X-Owner' => 'alice' });
is($r->{status}, 415, 'a 415');
$r = $t->execute('/broken', { session => 'b', code => '1' });
is($r->{status}, 502, 'a failed spawn: 502');

# a cell that runs while the browser looks, one more waiting behind it
my $long = $t->execute_async('/x', { session => $LONG, code => "import time\ntime.sleep(90)" },
    headers => { 'X-Owner' => $XSS });
ok(wait_until(sub { ($t->http(GET => '/status')->{json}{running} // 0) == 1 }, 15),
    'the long cell runs');
my $queued = $t->execute_async('/x', { session => $LONG, code => 'print(4)' },
    headers => { 'X-Owner' => $XSS });
ok(wait_until(sub { ($t->http(GET => '/status')->{json}{queue_depth} // 0) == 1 }, 10),
    'one cell waits behind it');

###############################################################################
# the browser

# Runs chromium on the page; returns the DOM it dumped.  Root cannot run
# chromium's sandbox (it refuses to start), so as root --no-sandbox; the
# page is our own and the profile a throwaway one in the test's prefix.
my $run = 0;
sub browse {
    my ($url, $budget_ms) = @_;
    $run++;
    my @cmd = ($chromium, '--headless=new', '--disable-gpu', '--no-first-run',
        '--no-default-browser-check', '--disable-extensions', '--disable-sync',
        '--disable-background-networking', '--disable-component-update',
        "--user-data-dir=$p/chromium-$run", "--virtual-time-budget=$budget_ms",
        ($> == 0 ? '--no-sandbox' : ()), '--dump-dom', $url);
    my $out = "$p/logs/chromium-$run.dom";
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        setpgrp(0, 0);
        $ENV{HOME} = $p;
        open STDOUT, '>', $out or POSIX::_exit(126);
        open STDERR, '>', "$p/logs/chromium-$run.err" or POSIX::_exit(126);
        exec @cmd or POSIX::_exit(127);
    }
    my $deadline = time + 60;
    my $rc;
    while (time < $deadline) {
        if (waitpid($pid, WNOHANG) == $pid) { $rc = $?; last }
        sleep 0.1;
    }
    unless (defined $rc) {
        kill_group($pid);
        waitpid($pid, 0);
        diag "chromium ran over 60 s";
    }
    # what it left behind in its group
    kill_group($pid);
    open my $fh, '<', $out or return '';
    local $/;
    my $dom = <$fh>;
    diag "chromium exited with $rc" if defined $rc && $rc != 0;
    return $dom // '';
}

sub text {
    my ($s) = @_;
    return undef unless defined $s;
    $s =~ s/&lt;/</g; $s =~ s/&gt;/>/g; $s =~ s/&quot;/"/g; $s =~ s/&nbsp;/\xa0/g;
    $s =~ s/&#39;/'/g; $s =~ s/&amp;/&/g;
    return $s;
}

# a table's rows: [{field => text}]
sub rows {
    my ($dom, $id) = @_;
    my ($body) = $dom =~ m{<table id="\Q$id\E">.*?<tbody>(.*?)</tbody>}s or return undef;
    my @rows;
    while ($body =~ m{<tr data-i="\d+">(.*?)</tr>}sg) {
        my $tr = $1;
        my %f;
        while ($tr =~ m{<td data-f="(\w+)"[^>]*>(.*?)</td>}sg) { $f{$1} = text($2) }
        push @rows, \%f;
    }
    return \@rows;
}

sub by { my ($rows, $key) = @_; +{ map { ($_->{$key} => $_) } @{ $rows || [] } } }

sub card { my ($dom, $id) = @_; $dom =~ m{<b id="\Q$id\E">(.*?)</b>} ? text($1) : undef }

my $j1 = $t->http(GET => '/status')->{json};
my $t1 = time;
my $dom = browse("http://127.0.0.1:$port/status?format=html", 3000);
my $t2 = time;
my $j2 = $t->http(GET => '/status')->{json};

like($dom, qr/<body[^>]*data-state="ok"/, 'the page rendered the figures (its script ran under the CSP)')
    or diag "DOM:\n$dom\nstderr:\n" . do { local $/; open my $e, '<', "$p/logs/chromium-$run.err"; <$e> // '' };

# the figures that did not move while the browser looked
for my $k (qw(kernels running queue_depth owners)) {
    is($j1->{$k}, $j2->{$k}, "JSON $k steady while the browser looked");
}
is($j1->{kernels}, 4, 'JSON kernels: a1, a2, x1 and the long cell\'s');
is($j1->{owners}, 2, 'JSON owners: alice and the hostile one');

(my $short = $j1->{commit} // '') =~ s/^([0-9a-f]{12})[0-9a-f]{28}/$1/;
like($dom, qr{<span id="build" title="commit \Q$j1->{commit}\E">ngx_http_hermes_module \Q$j1->{version}\E \(\Q$short\E\)</span>},
     "the header: the module, its version and commit ($j1->{version}, $short)");

is(card($dom, 'sum-kernels'), $j1->{kernels}, "page kernels = JSON ($j1->{kernels})");
is(card($dom, 'sum-running'), $j1->{running}, "page running = JSON ($j1->{running})");
is(card($dom, 'sum-queue'), $j1->{queue_depth}, "page queue depth = JSON ($j1->{queue_depth})");
is(card($dom, 'sum-owners'), $j1->{owners}, "page owners = JSON ($j1->{owners})");
is(card($dom, 'sum-max'), $j1->{max_kernels}, 'page max kernels = JSON');
is(card($dom, 'sum-spawned'), $j1->{spawned_total}, 'page kernels started = JSON');

my $hosts = by(rows($dom, 'hosts'), 'host');
is($hosts->{localhost}{kernels}, $j1->{host_kernels}{localhost},
    "page host localhost: kernels = JSON ($j1->{host_kernels}{localhost})");
is($hosts->{localhost}{spawn_failures}, $j1->{spawn_failures_total}{localhost},
    "page host localhost: spawn failures = JSON ($j1->{spawn_failures_total}{localhost})");
is($j1->{spawn_failures_total}{localhost}, 1, '... one failure');

my $owners = by(rows($dom, 'owners'), 'owner');
is_deeply([sort keys %$owners], [sort keys %{ $j1->{owner_kernels} }], 'page owners = JSON owner_kernels');
for my $o ('alice', $XSS) {
    is($owners->{$o}{kernels}, $j1->{owner_kernels}{$o}, "page owner $o: kernels = JSON");
    is($owners->{$o}{running}, $j1->{owner_running}{$o}, "page owner $o: running = JSON");
}
is($j1->{owner_kernels}{alice}, 2, 'JSON owner_kernels.alice 2');
is($j1->{owner_kernels}{$XSS}, 2, 'JSON owner_kernels of the hostile owner 2');
is($j1->{owner_running}{$XSS}, 1, '... one running');

my $cells = rows($dom, 'cells');
is(scalar @{ $cells || [] }, 1, 'page: one running cell');
is(scalar @{ $j1->{running_cells} || [] }, 1, 'JSON: one running cell');
my ($pc, $jc) = ($cells->[0] // {}, $j1->{running_cells}[0] // {});
is($pc->{owner}, $XSS, 'the running cell\'s owner, as text');
is($pc->{session}, $LONG, '... its session');
is($pc->{kernel_id}, $jc->{kernel_id}, '... its kernel id = JSON');
is($pc->{host}, 'localhost', '... its host');
is($pc->{queued}, 1, '... one cell queued behind it');
is($jc->{queued}, 1, 'JSON: one queued behind it');
my ($age, $unit) = ($pc->{running_for} // '') =~ /^([\d.]+) (m?s)$/;
$age /= 1000 if defined $unit && $unit eq 'ms';
ok(defined $age && $age >= $jc->{running_for_ms} / 1000 - 0.1
   && $age <= $j2->{running_cells}[0]{running_for_ms} / 1000 + 0.1,
   "its age ($pc->{running_for}) between the JSON's before and after "
   . "($jc->{running_for_ms} ms, $j2->{running_cells}[0]{running_for_ms} ms)");

# no element came of the names
my ($body) = $dom =~ m{(<body.*</body>)}s;
$body //= '';
unlike($body, qr/<img\b/i, 'no <img> element in the DOM: the hostile names are text');
like($body, qr/&lt;img src=x onerror=alert\(1\)&gt;/, 'the hostile owner is there, escaped');

my %ans;
for my $row (@{ rows($dom, 'answers') || [] }) { $ans{"$row->{code} $row->{error}"} = $row->{count} }
is($ans{'415 unsupported_media_type'}, $j1->{responses_total}{415}{unsupported_media_type},
    'page answers 415 unsupported_media_type = JSON');
is($ans{'502 spawn_failed'}, 1, 'page answers 502 spawn_failed: 1');
ok(($ans{'200 '} // 0) >= $j1->{responses_total}{200}{''}
   && ($ans{'200 '} // 0) <= $j2->{responses_total}{200}{''},
   'page answers 200: between the JSON scrapes around it');

for my $h (qw(cell_duration_seconds queue_wait_seconds spawn_duration_seconds)) {
    my ($fig) = $dom =~ m{(<figure id="hist-$h".*?</figure>)}s;
    ok($fig, "page histogram $h") or next;
    my ($count) = $fig =~ /data-count="(\d+)"/;
    is($count, $j1->{$h}{count}, "... count = JSON ($j1->{$h}{count})");
    my %n = $fig =~ /<rect[^>]*data-le="([^"]+)" data-n="(\d+)"/g;
    my @les = sort { ($a eq '+Inf' ? 9e9 : $a) <=> ($b eq '+Inf' ? 9e9 : $b) } keys %{ $j1->{$h}{buckets} };
    is(scalar keys %n, scalar @les, "... a bar a bucket (" . scalar(@les) . ")");
    my ($prev, @bad) = (0);
    for my $le (@les) {
        my $want = $j1->{$h}{buckets}{$le} - $prev;
        $prev = $j1->{$h}{buckets}{$le};
        push @bad, "le=$le page " . ($n{$le} // 'none') . " JSON $want"
            unless defined $n{$le} && $n{$le} == $want;
    }
    ok(!@bad, "... each bar's count = the JSON bucket's") or diag join "\n", @bad;
}
is($j1->{cell_duration_seconds}{count}, 4, 'JSON cell_duration_seconds.count: the four cells');
my ($f) = $dom =~ m{(<figure id="hist-cell_duration_seconds".*?</figure>)}s;
ok(($f // '') =~ /data-le="0.5" data-n="(\d+)"/ && $1 >= 1, 'the 0.3 s cell is in the (0.25, 0.5] bar');

###############################################################################
# refresh: the page fetches the JSON form every ?refresh= seconds

sub renders { ($_[0] =~ /<body[^>]*data-renders="(\d+)"/)[0] // 0 }

$dom = browse("http://127.0.0.1:$port/status?format=html&refresh=1", 4500);
my $n1 = renders($dom);
ok($n1 >= 3 && $n1 <= 6, "refresh=1 over 4.5 s: rendered 3 to 6 times ($n1)");
$dom = browse("http://127.0.0.1:$port/status?format=html&refresh=60", 4500);
is(renders($dom), 1, 'refresh=60 over 4.5 s: rendered once');
$dom = browse("http://127.0.0.1:$port/status?format=html", 4500);
my $n2 = renders($dom);
ok($n2 >= 2 && $n2 <= 3, "the default, 2 s, over 4.5 s: rendered 2 or 3 times ($n2)");

###############################################################################
# Prometheus: the owners' count, no owner names

my $prom = $t->http(GET => '/status?format=prometheus')->{content};
like($prom, qr/^hermes_owners\{zone="kernels"\} 2$/m, 'Prometheus hermes_owners 2');
unlike($prom, qr/alice|onerror/, 'Prometheus names no owner');

$r = $t->http(DELETE => "/k/$LONG?force=1", headers => { 'X-Owner' => $XSS });
is($r->{status}, 204, 'the long cell\'s kernel shut down');
$long->wait;
$queued->wait;
$t->stop;
done_testing;
