#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Exact parsing, from the attacker's side: media types, UTF-8 and escapes,
# duplicate and look-alike keys, the kernels URI, the unset owner, nginx's
# own errors as JSON, and no client text forging a line in error.log.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        client_body_timeout 1s;

        location = /v1/execute {
            hermes_execute;
        }

        location /v1/kernels {
            hermes_kernels;
        }

        location = /v1/status {
            hermes_status;
        }

        location = /o/execute {
            hermes_execute;
            hermes_owner $http_x_owner;
        }

        location /o/kernels {
            hermes_kernels;
            hermes_owner $http_x_owner;
        }

        location /plain {
            return 200 "plain\n";
        }

        location ~ ^/r[0-9]/execute$ {
            hermes_execute;
        }
    }

    server {
        listen 127.0.0.1:%%PORT_1%%;

        location /v1/kernels {
            return 200 "not hermes\n";
        }
    }
CONF
$t->run;

my $J = JSON::PP->new->canonical;

sub error_is {
    my ($r, $status, $code, $name) = @_;
    is($r->{status}, $status, "$name: $status");
    like($r->{headers}{'content-type'} // '', qr{^application/json}, "$name: JSON");
    my $j = eval { $J->decode($r->{raw} // $r->{content}) } // {};
    is($j->{error}{code}, $code, "$name: code $code") if defined $code;
    ok(length($j->{error}{message} // ''), "$name: a message");
}

# a raw body (bytes as given), with a Content-Type of our choosing
sub post {
    my ($body, %o) = @_;
    return $t->raw_request('POST', $o{path} // '/v1/execute', body => $body,
        content_type => $o{type} // 'application/json',
        headers => $o{headers} // {});
}

############################################################################
# Content-Type is a media type, not a substring

for my $ct ('text/plain; x=application/json', 'application/jsonx',
    'multipart/form-data; boundary=application/json', 'text/plain',
    'application/x-www-form-urlencoded; a=application/json',
    'xapplication/json', 'application/json-seq', 'application/',
    'application/json; charset=latin1')
{
    error_is(post('{}', type => $ct), 415, 'unsupported_media_type', "Content-Type: $ct");
}

# two Content-Type headers, in either order, even the same one twice
for my $two ([ 'application/json', 'text/plain' ], [ 'text/plain', 'application/json' ],
             [ 'application/json', 'application/json' ]) {
    error_is($t->raw_request('POST', '/v1/execute', body => '{}',
        headers => { 'Content-Type' => $two }),
        415, 'unsupported_media_type', "two Content-Type headers: @$two");
}

# accepted types get as far as the body check ("session" missing)
for my $ct ('application/json', 'Application/JSON', 'application/json;charset=utf-8',
    'application/json ; charset="UTF-8"', "application/json;\tfoo=bar ; baz=1")
{
    error_is(post('{}', type => $ct), 400, 'invalid_request', "Content-Type: $ct");
}

############################################################################
# Accept: media ranges with q, no substring match

sub answer_kind {
    my ($accept) = @_;
    my $r = $t->execute('/v1/execute', { session => 'acc', code => 'print(1)' },
        headers => { Accept => $accept });
    my $ct = $r->{headers}{'content-type'} // '';
    return $ct =~ /ndjson/ ? 'stream' : $ct =~ m{^application/json} ? 'json' : "other($r->{status})";
}

is(answer_kind('application/json'), 'json', 'Accept: application/json: the result object');
is(answer_kind('text/html; x=application/json'), 'stream', 'Accept: a parameter naming json: stream');
is(answer_kind('application/jsonx'), 'stream', 'Accept: application/jsonx: stream');
is(answer_kind('application/json;q=0'), 'stream', 'Accept: json;q=0: stream');
is(answer_kind('application/json, application/x-ndjson'), 'stream', 'Accept: both: stream');
is(answer_kind('application/x-ndjson;q=0.5, application/json'), 'json', 'Accept: json preferred by q');
is(answer_kind('application/x-ndjson;q=0, */*'), 'json', 'Accept: ndjson refused, */*: json');
is(answer_kind('*/*'), 'stream', 'Accept: */*: stream');
is(answer_kind('Application/JSON ; q=0.9'), 'json', 'Accept: case and spaces');

############################################################################
# invalid UTF-8 and lone surrogate escapes are invalid JSON

my %bad_utf8 = (
    'overlong /'                => "\xc0\xaf",
    'overlong 3-byte'           => "\xe0\x80\xaf",
    'overlong 4-byte'           => "\xf0\x80\x80\x80",
    'surrogate in UTF-8'        => "\xed\xa0\x80",
    'low surrogate in UTF-8'    => "\xed\xbf\xbf",
    'over U+10FFFF'             => "\xf4\x90\x80\x80",
    'F5 lead'                   => "\xf5\x80\x80\x80",
    'truncated sequence'        => "\xe2\x82",
    'lone continuation'         => "\x80",
    'FE'                        => "\xfe",
);

for my $name (sort keys %bad_utf8) {
    my $s = $bad_utf8{$name};
    error_is(post(qq({"session":"u","code":"#$s"})), 400, 'invalid_json', "$name in code");
    error_is(post(qq({"session":"u","code":"1","ignored$s":1})), 400, 'invalid_json', "$name in an unknown key");
    error_is(post(qq({"session":"u","code":"1","x":{"y":[{"z":"$s"}]}})), 400, 'invalid_json', "$name deep down");
}

my %bad_escape = (
    'high alone'            => '\\ud800',
    'high at the end'       => 'x\\udbff',
    'low alone'             => '\\udc00',
    'high then not low'     => '\\ud800\\u0041',
    'high then a char'      => '\\ud800x',
    'two highs'             => '\\ud800\\ud800',
    'low then high'         => '\\udc00\\ud800',
    'upper-case high'       => '\\uD83D',
);

for my $name (sort keys %bad_escape) {
    my $s = $bad_escape{$name};
    error_is(post(qq({"session":"u","code":"#$s"})), 400, 'invalid_json', "escape $name in code");
    error_is(post(qq({"session":"u","code":"1","k$s":1})), 400, 'invalid_json', "escape $name in a key");
}

# ... also inside the tool call's arguments, which are JSON in a string
error_is(post($J->encode({ type => 'function', function => { name => 'execute_code',
    arguments => '{"session":"u","code":"#\\ud800"}' } })), 400, 'invalid_json',
    'lone surrogate escape inside function.arguments');

# the good kinds still work
my $r = $t->execute('/v1/execute', qq({"session":"u","code":"print('\\ud83d\\ude00', '\xf0\x9f\x98\x80', '\xc3\xa9\\u00e9')"}),
    headers => { Accept => 'application/json' });
is($r->{status}, 200, 'a surrogate pair and UTF-8: 200');
is($r->{json}{output}, "\x{1f600} \x{1f600} \x{e9}\x{e9}\n", 'decoded right') if $r->{json};

############################################################################
# duplicate keys, look-alike keys

error_is(post('{"session":"a","code":"1","session":"b"}'), 400, 'invalid_json', 'duplicate session');
error_is(post('{"code":"print(1)","session":"a","code":"import os"}'), 400, 'invalid_json', 'duplicate code');
error_is(post('{"session":"a","code":"1","x":{"k":1,"k":2}}'), 400, 'invalid_json', 'duplicate in a nested object');
error_is(post('{"session":"a","code":"1","x":[{"k":1},{"k":1,"j":{"k":1,"k":1}}]}'), 400, 'invalid_json', 'duplicate deep in an array');
error_is(post('{"session":"a","code":"1","se\\u0073sion":"b"}'), 400, 'invalid_json', 'duplicate spelt with an escape');
error_is(post($J->encode({ type => 'function', function => { name => 'execute_code',
    arguments => '{"session":"a","code":"1","code":"2"}' } })), 400, 'invalid_json',
    'duplicate inside function.arguments');
error_is(post('{"type":"function","function":{"name":"execute_code","arguments":"{\"session\":\"a\",\"code\":\"1\"}"},'
    . '"function":{"name":"execute_code","arguments":"{}"}}'), 400, 'invalid_json', 'duplicate function');
error_is(post('{"function":{"name":"execute_code","arguments":"{}","arguments":"{}"}}'), 400, 'invalid_json',
    'duplicate function.arguments');

# different keys are different, whatever strcmp would say
{
    # not "session": the cell runs one-shot, in no session called "a"
    my $r = $t->execute('/v1/execute', '{"session\\u0000x":"a","code":"1"}');
    like($r->{events}[0]{session} // '', qr/^oneshot-/, 'session\\u0000x is not session');
}
error_is(post('{"session":"a","code\\u0000":"1"}'), 400, 'invalid_request', 'code\\u0000 is not code');
error_is(post('{"function":{"name":"execute_code"},"function.arguments":"{\"session\":\"a\",\"code\":\"1\"}"}'),
    400, 'invalid_request', 'a top-level "function.arguments" key is not function.arguments');
error_is(post('{"function.name":"execute_code","function":{"name":"other","arguments":"{\"session\":\"a\",\"code\":\"1\"}"}}'),
    400, 'invalid_request', 'a top-level "function.name" key is not function.name');
error_is(post('{"function":{"name":"execute_code\\u0000x","arguments":"{\"session\":\"a\",\"code\":\"1\"}"}}'),
    400, 'invalid_request', 'function.name with a NUL is not execute_code');

$r = $t->execute('/v1/execute', '{"session":"nulkey","session\\u0000":"bad session!","code":"print(2)"}',
    headers => { Accept => 'application/json' });
is($r->{status}, 200, 'a key session\\u0000 beside session: the real one counts');

############################################################################
# the kernels URI: only "/" right after the prefix starts a session

$r = $t->execute('/v1/execute', { session => 'zz', code => 'z = 1' });
is($r->{result}{status}, 'success', 'kernel zz made');
my $kzz = $r->{result}{kernel}{kernel_id};

sub kernels_of { my ($path, %o) = @_; [ map { $_->{session} } @{ ($t->http('GET', $path, %o)->{json} // {})->{kernels} // [] } ] }

error_is($t->raw_request('DELETE', '/v1/kernelszz'), 404, 'not_found', 'DELETE /v1/kernelszz');
ok((grep { $_ eq 'zz' } @{ kernels_of('/v1/kernels') }), 'zz still there');
error_is($t->raw_request('GET', '/v1/kernelszz'), 404, 'not_found', 'GET /v1/kernelszz');
error_is($t->raw_request('GET', '/v1/kernels/zz/more'), 404, 'not_found', 'GET /v1/kernels/zz/more');
error_is($t->raw_request('DELETE', '/v1/kernels/zz/more'), 404, 'not_found', 'DELETE /v1/kernels/zz/more');

for my $bad ('bad%20name', 'a%0Ab', 'x' x 129, 'caf%C3%A9') {
    error_is($t->raw_request('DELETE', "/v1/kernels/$bad"), 400, 'invalid_session', "DELETE bad session $bad");
    error_is($t->raw_request('GET', "/v1/kernels/$bad"), 400, 'invalid_session', "GET bad session $bad");
}
# nginx refuses a URI with a NUL before it has a URI to match a location on
is($t->raw_request('DELETE', '/v1/kernels/a%00b')->{status}, 400, 'DELETE with a NUL in the session: 400');
error_is($t->raw_request('DELETE', '/v1/kernels'), 400, 'invalid_session', 'DELETE without a session');
error_is($t->raw_request('DELETE', '/v1/kernels/'), 400, 'invalid_session', 'DELETE with an empty session');

$r = $t->http('GET', '/v1/kernels/zz');
is($r->{status}, 200, 'GET /v1/kernels/zz: 200');
is($r->{json}{session}, 'zz', 'that one kernel');
is($r->{json}{kernel_id}, $kzz, 'its id');
error_is($t->raw_request('GET', '/v1/kernels/nosuch'), 404, 'not_found', 'GET a session with no kernel');
is_deeply([ sort @{ kernels_of('/v1/kernels/') } ], [ sort @{ kernels_of('/v1/kernels') } ],
    'GET <loc>/ is the listing');

############################################################################
# the unset owner is nobody a variable can name

$r = $t->execute('/v1/execute', { session => 'shared', code => 'secret = 42' });
is($r->{result}{status}, 'success', 'unauthenticated kernel made');
my $kshared = $r->{result}{kernel}{kernel_id};
my $pid_shared = runner_pid($kshared);

my %anon = (headers => { 'X-Owner' => 'anonymous' });
ok(!(grep { $_ eq 'shared' } @{ kernels_of('/o/kernels', %anon) }), 'X-Owner: anonymous does not list it');
error_is($t->raw_request('GET', '/o/kernels/shared', %anon), 404, 'not_found', 'nor GET it');
error_is($t->raw_request('DELETE', '/o/kernels/shared?force=1', %anon), 404, 'not_found', 'nor DELETE it');
ok(pid_alive($pid_shared), 'its runner is alive');
$r = $t->execute('/o/execute', { session => 'shared', code => "print(globals().get('secret'))" }, %anon);
is($r->{result}{output}, "None\n", 'nor run on it');
isnt($r->{result}{kernel}{kernel_id}, $kshared, 'a kernel of its own');
ok((grep { $_ eq 'shared' } @{ kernels_of('/v1/kernels') }), 'the unauthenticated listing still has it');
$r = $t->execute('/v1/execute', { session => 'shared', code => 'print(secret)' });
is($r->{result}{output}, "42\n", 'and its state is intact');

# owners whose crc32 collide (the registry's hash): never one's kernel
# for the other, to list, run on, interrupt or shut down
{
    my ($o1, $o2) = ('enITETvAOe', 'jkWbGbF2U1');     # crc32 0x469ec568 both
    my %h1 = (headers => { 'X-Owner' => $o1 });
    my %h2 = (headers => { 'X-Owner' => $o2 });
    my $r1 = $t->execute('/o/execute', { session => 'crc', code => "mine = 'o1'" }, %h1);
    my $k1 = $r1->{result}{kernel}{kernel_id};
    my $p1 = runner_pid($k1);
    ok($p1, 'the first owner has a kernel');
    ok(!(grep { $_ eq 'crc' } @{ kernels_of('/o/kernels', %h2) }), 'a colliding owner does not list it');
    error_is($t->raw_request('GET', '/o/kernels/crc', %h2), 404, 'not_found', 'nor GET it');
    error_is($t->raw_request('POST', '/o/kernels/crc/interrupt', %h2), 404, 'not_found', 'nor interrupt it');
    error_is($t->raw_request('DELETE', '/o/kernels/crc?force=1', %h2), 404, 'not_found', 'nor DELETE it');
    my $r2 = $t->execute('/o/execute', { session => 'crc', code => "print(globals().get('mine'))" }, %h2);
    is($r2->{result}{output}, "None\n", 'nor run on it');
    isnt($r2->{result}{kernel}{kernel_id}, $k1, 'a kernel of its own');
    like($t->raw_request('DELETE', '/o/kernels/crc?force=1', %h2)->{status}, qr/^20[04]$/, 'it deletes its own');
    ok(pid_alive($p1), "the first owner's runner lives on");
    $r1 = $t->execute('/o/execute', { session => 'crc', code => 'print(mine)' }, %h1);
    is($r1->{result}{output}, "o1\n", 'with its state');
}

# owners with control bytes are refused
error_is($t->execute('/o/execute', { session => 'a', code => '1' }, headers => { 'X-Owner' => "a\x01b" }),
    400, 'invalid_owner', 'owner with a control byte');
error_is($t->raw_request('GET', '/o/kernels', headers => { 'X-Owner' => "anon\tymous" }),
    400, 'invalid_owner', 'owner with a tab');

# owners that are not UTF-8 are refused (they go into JSON: the status,
# tool call headers); a UTF-8 owner works and the status stays UTF-8
for my $c (["\xff\xfe", 'bytes that are no UTF-8'], ["\xc0\xaf", 'an overlong form'],
           ["a\xed\xa0\x80", 'a surrogate'], ["ab\xe2\x82", 'a cut sequence']) {
    error_is($t->execute('/o/execute', { session => 'a', code => '1' }, headers => { 'X-Owner' => $c->[0] }),
        400, 'invalid_owner', "owner with $c->[1]");
}
$r = $t->execute('/o/execute', { session => 'u8', code => 'print(1)' }, headers => { 'X-Owner' => "zo\xc3\xab" });
is($r->{result}{status}, 'success', 'a UTF-8 owner runs cells');
{
    my $st = $t->raw_request('GET', '/v1/status');
    my $json = eval { JSON::PP->new->utf8->decode($st->{raw}) };
    ok($json, 'the status is valid UTF-8 JSON') or diag $@;
}

############################################################################
# nginx's own errors on our locations are JSON

# 400 before nginx picked a location: a bad Content-Length
error_is($t->raw_request('POST', '/v1/execute', body => '{}', content_type => 'application/json',
    headers => { 'Content-Length' => 'abc' }), 400, 'bad_request', 'bad Content-Length');
error_is($t->raw_request('GET', '/v1/kernels', headers => { 'Host' => [ 'a', 'b' ] }),
    400, 'bad_request', 'two Host headers');

# 400 while reading the body: a bad chunk
error_is($t->raw_request('POST', '/v1/execute', body => "zz\r\n{}\r\n0\r\n\r\n",
    content_type => 'application/json', headers => { 'Transfer-Encoding' => 'chunked' }),
    400, 'bad_request', 'invalid chunked body');

# 405: ours, and nginx's own (TRACE is refused before any location)
error_is($t->raw_request('GET', '/v1/execute'), 405, 'method_not_allowed', 'GET on execute');
error_is($t->raw_request('TRACE', '/v1/execute'), 405, 'method_not_allowed', 'TRACE on execute');
error_is($t->raw_request('POST', '/v1/status', body => '', content_type => 'text/plain'),
    405, 'method_not_allowed', 'POST on status');

# somebody else's location keeps nginx's page
$r = $t->raw_request('TRACE', '/plain');
is($r->{status}, 405, 'TRACE elsewhere: 405');
unlike($r->{headers}{'content-type'} // '', qr/json/, 'TRACE elsewhere: not JSON');
$r = $t->raw_request('GET', '/plain', headers => { 'Host' => [ 'a', 'b' ] });
unlike($r->{headers}{'content-type'} // '', qr/json/, 'bad request elsewhere: not JSON');

# which URIs name a hermes location: prefix, exact, regex, in this server
for my $uri ('/v1/kernelsx', '/v1/kernels/s1') {
    error_is($t->raw_request('TRACE', $uri), 405, 'method_not_allowed', "TRACE $uri, under a prefix");
}
error_is($t->raw_request('TRACE', '/r7/execute'), 405, 'method_not_allowed', 'TRACE on a regex location');
for my $uri ('/v1/execute/x', '/v1/executex', '/v1/kernel', '/r7/executex', '/rx/execute') {
    $r = $t->raw_request('TRACE', $uri);
    is($r->{status}, 405, "TRACE $uri: 405");
    unlike($r->{headers}{'content-type'} // '', qr/json/, "TRACE $uri: not JSON");
}
$r = $t->raw_request('TRACE', '/v1/kernels', port => $t->port(1));
is($r->{status}, 405, 'TRACE on another server: 405');
unlike($r->{headers}{'content-type'} // '', qr/json/, 'TRACE on another server: not JSON');

# 408: half a body, then silence past client_body_timeout
sub half_body {
    my ($path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0),
        Proto => 'tcp', Timeout => 5) or die "connect: $!";
    print $s "POST $path HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        . "Content-Length: 100\r\n\r\n{\"session\":\"a\",";
    my $sel = IO::Select->new($s);
    my ($buf, $t0) = ('', time);
    while (time - $t0 < 8 && $sel->can_read(8 - (time - $t0))) {
        my $n = sysread($s, $buf, 65536, length $buf);
        last unless $n;
    }
    close $s;
    my ($head, $body) = split /\r\n\r\n/, $buf, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.\d (\d+)};
    my ($ct) = ($head // '') =~ m{^Content-Type:\s*(\S+)}mi;
    return { status => $status // 599, headers => { 'content-type' => $ct },
             raw => $body // '', elapsed => time - $t0 };
}

$r = half_body('/v1/execute');
error_is($r, 408, 'request_timeout', 'half a body');
cmp_ok($r->{elapsed}, '<', 4, '408 sent at the timeout');

############################################################################
# client text never forges a line in error.log

my $forged = "\n2099/01/01 00:00:00 [emerg] 1#1: forged";
post($J->encode({ session => "s$forged", code => '1' }));
post($J->encode({ session => 'ok', code => '1', extra => $forged }));
$t->raw_request('DELETE', '/v1/kernels/x%0A2099%2F01%2F01%2000:00:00%20[emerg]%20forged');
$t->execute('/o/execute', { session => 'logsafe', code => 'print(1)' },
    headers => { 'X-Owner' => "o\x1b[2K 2099/01/01 [emerg] forged" });
$t->execute('/v1/execute', { session => 'logsafe', code => "import os\nos._exit(0)" });
sleep 0.5;
my $log = $t->error_log;
unlike($log, qr/^2099\S* .*forged/m, 'no forged line in error.log');
unlike($log, qr/\x1b/, 'no escape byte in error.log');

$t->stop;
done_testing;
