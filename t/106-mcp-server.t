#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# hermes_mcp: the gateway as an MCP server (streamable HTTP), from a
# client's side and an attacker's: sessions bound to owners, Host and
# Origin checks, execute_code's state, progress, errors, and the zone
# keeping sessions across a reload.

use strict;
use warnings;

use Test::More;
use JSON::PP;
use POSIX ();

use Hermes::Test;

my $JSON = JSON::PP->new->canonical;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_zone capped:1m mcp_sessions=2;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /mcp {
            hermes_mcp zone=kernels;
            hermes_owner $http_x_owner;
            hermes_cell_timeout 20s;
            hermes_max_code 2000;
        }

        location = /mcp-open {
            hermes_mcp zone=kernels;
            hermes_owner $http_x_owner;
            hermes_mcp_hosts gateway.example.com;
            hermes_mcp_origins https://app.example.com;
        }

        location = /mcp-capped {
            hermes_mcp zone=capped;
        }

        location = /v1/execute {
            hermes_execute zone=kernels;
            hermes_owner $http_x_owner;
        }

        location = /status {
            hermes_status zone=kernels;
        }
    }
CONF
$t->run;

# one JSON-RPC message; the answer's JSON, or its SSE events' messages
sub rpc {
    my ($path, $sid, $msg, %opt) = @_;
    my %h = (
        'Accept' => 'application/json, text/event-stream',
        'X-Owner' => $opt{owner} // 'alice',
        %{ $opt{headers} || {} },
    );
    $h{'Mcp-Session-Id'} = $sid if defined $sid;
    my $r = $t->raw_request($opt{method} // 'POST', $path,
        body => ref $msg ? $JSON->encode($msg) : $msg,
        content_type => 'application/json', headers => \%h,
        timeout => $opt{timeout} // 30);
    my $ct = $r->{headers}{'content-type'} // '';
    $r->{messages} = [];
    if ($ct =~ m{^text/event-stream}) {
        for my $ev (split /\n\n/, $r->{raw}) {
            my ($data) = $ev =~ /^data: (.*)$/m or next;
            push @{ $r->{messages} }, eval { $JSON->decode($data) };
        }
        $r->{json} = $r->{messages}[-1];
    } else {
        $r->{json} = eval { $JSON->decode($r->{raw}) };
    }
    return $r;
}

sub initialize {
    my ($path, %opt) = @_;
    my $r = rpc($path, undef, { jsonrpc => '2.0', id => 0,
        method => 'initialize',
        params => { protocolVersion => $opt{version} // '2025-11-25',
                    capabilities => {},
                    clientInfo => { name => 't', version => '1' } } },
        %opt);
    my $sid = $r->{headers}{'mcp-session-id'};
    rpc($path, $sid, { jsonrpc => '2.0',
        method => 'notifications/initialized' }, %opt) if $sid;
    return wantarray ? ($sid, $r) : $sid;
}

my $n = 0;
sub call {
    my ($path, $sid, $tool, $args, %opt) = @_;
    my %params = (name => $tool, arguments => $args);
    $params{_meta} = { progressToken => $opt{token} } if defined $opt{token};
    return rpc($path, $sid, { jsonrpc => '2.0', id => ++$n,
        method => 'tools/call', params => \%params }, %opt);
}

sub text_of {
    my ($r) = @_;
    return join '', map { $_->{text} // '' }
        grep { $_->{type} eq 'text' } @{ $r->{json}{result}{content} || [] };
}

# initialize: a session id, the version asked for if served
my ($sid, $r) = initialize('/mcp', version => '2025-06-18');
is($r->{status}, 200, 'initialize: 200');
like($sid // '', qr/^[0-9a-f]{32}$/, 'Mcp-Session-Id: 128 random bits in hex');
is($r->{json}{result}{protocolVersion}, '2025-06-18', 'the version asked for');
is($r->{json}{result}{serverInfo}{name}, 'ngx_hermes', 'serverInfo');
ok($r->{json}{result}{capabilities}{tools}, 'tools capability');
my (undef, $r2) = initialize('/mcp', version => '1999-01-01');
is($r2->{json}{result}{protocolVersion}, '2025-11-25',
   'an unknown version: our newest, for the client to judge');

# every later message names a live session of the same owner
$r = rpc('/mcp', undef, { jsonrpc => '2.0', id => 1, method => 'ping' });
is($r->{status}, 400, 'no Mcp-Session-Id: 400');
$r = rpc('/mcp', 'f' x 32, { jsonrpc => '2.0', id => 1, method => 'ping' });
is($r->{status}, 404, 'an unknown session: 404');
is($r->{json}{error}{code}, -32600, '... a JSON-RPC error');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' },
         owner => 'mallory');
is($r->{status}, 404, "another owner's session id: 404, as if none");
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 7, method => 'ping' });
is($r->{status}, 200, 'ping: 200');
is_deeply($r->{json}{result}, {}, 'ping: {}');
is($r->{json}{id}, 7, 'ping: its id');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 'x', method => 'ping' },
         headers => { 'MCP-Protocol-Version' => '2024-01-01' });
is($r->{status}, 400, 'an unsupported MCP-Protocol-Version: 400');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 'x', method => 'ping' },
         headers => { 'MCP-Protocol-Version' => '2025-03-26' });
is($r->{status}, 200, 'MCP-Protocol-Version 2025-03-26 is served');

# malformed messages
$r = rpc('/mcp', $sid, '{"jsonrpc":');
is($r->{status}, 400, 'not JSON: 400');
is($r->{json}{error}{code}, -32700, '... parse error');
$r = rpc('/mcp', $sid, [ { jsonrpc => '2.0', id => 1, method => 'ping' } ]);
is($r->{status}, 400, 'a batch: 400');
$r = rpc('/mcp', $sid, { jsonrpc => '1.0', id => 1, method => 'ping' });
is($r->{json}{error}{code}, -32600, 'not JSON-RPC 2.0: invalid request');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'nope/nope' });
is($r->{json}{error}{code}, -32601, 'an unknown method: -32601');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, result => {} });
is($r->{status}, 202, "a client's answer: 202");
$r = rpc('/mcp', $sid, undef, method => 'GET');
is($r->{status}, 405, 'GET: 405 (no server stream)');
like($r->{headers}{allow} // '', qr/POST/, '... Allow names POST');

# tools/list: JSON Schema 2020-12 input schemas
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 2, method => 'tools/list' });
my %tools = map { $_->{name} => $_ } @{ $r->{json}{result}{tools} || [] };
is_deeply([ sort keys %tools ],
          [ qw(download_file execute_code interrupt list_kernels
               reset_session upload_file) ],
          'tools/list: the six tools');
is($tools{execute_code}{inputSchema}{'$schema'},
   'https://json-schema.org/draft/2020-12/schema', '$schema 2020-12');
is_deeply($tools{execute_code}{inputSchema}{required}, ['code'],
          'execute_code requires code');
ok(!grep({ !$_->{description} } values %tools), 'each tool described');

# execute_code: state kept in the session's own kernel
$r = call('/mcp', $sid, 'execute_code', { code => "x = 41\nprint('set')" });
is($r->{status}, 200, 'execute_code: 200');
like($r->{headers}{'content-type'}, qr{^text/event-stream}, '... over SSE');
is($r->{json}{result}{isError}, JSON::PP::false, '... not an error');
is(text_of($r), "set\n", '... its output as text');
is($r->{json}{result}{structuredContent}{status}, 'success',
   '... the result object as structuredContent');
$r = call('/mcp', $sid, 'execute_code', { code => 'x + 1' });
is(text_of($r), "42\n", 'state kept between calls of one MCP session');

# another MCP session of the same owner has a kernel of its own
my $sid2 = initialize('/mcp');
$r = call('/mcp', $sid2, 'execute_code', { code => "print('x' in dir())" });
is(text_of($r), "False\n", 'another MCP session: a kernel of its own');

# progress while the cell runs, with the client's token
$r = call('/mcp', $sid, 'execute_code',
          { code => "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.3)" },
          token => 'tok-1');
my @progress = grep { ($_->{method} // '') eq 'notifications/progress' }
               @{ $r->{messages} };
ok(@progress >= 1, 'progress notifications while printing');
is($progress[0]{params}{progressToken}, 'tok-1', '... with the token sent');
like(join('', map { $_->{params}{message} } @progress), qr/step 0.*step 2/s,
     '... carrying the output');
my @p = map { $_->{params}{progress} } @progress;
is_deeply(\@p, [ sort { $a <=> $b } @p ], '... progress increases');
is($r->{messages}[-1]{id}, $n, 'the result is the last message');
$r = call('/mcp', $sid, 'execute_code', { code => "print('quiet')" });
ok(!grep({ ($_->{method} // '') =~ /^notifications/ } @{ $r->{messages} }),
   'no token, no level: no notifications');

# logging/setLevel: stdout as info, stderr as warning
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 3, method => 'logging/setLevel',
                         params => { level => 'loud' } });
is($r->{json}{error}{code}, -32602, 'an unknown level: invalid params');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 3, method => 'logging/setLevel',
                         params => { level => 'warning' } });
is_deeply($r->{json}{result}, {}, 'logging/setLevel: {}');
$r = call('/mcp', $sid, 'execute_code',
          { code => "import sys\nprint('out')\nprint('err', file=sys.stderr)" });
my @log = grep { ($_->{method} // '') eq 'notifications/message' }
          @{ $r->{messages} };
is(scalar @log, 1, 'level warning: stderr only');
is($log[0]{params}{level}, 'warning', '... as a warning');
is($log[0]{params}{data}, "err\n", '... its text');

# errors name themselves
$r = call('/mcp', $sid, 'execute_code', { code => '1/0' });
is($r->{json}{result}{isError}, JSON::PP::true, 'an exception: isError');
like(text_of($r), qr/ZeroDivisionError/, '... named in the text');
$r = call('/mcp', $sid, 'execute_code',
          { code => 'import time; time.sleep(30)', timeout => 1 });
is($r->{json}{result}{isError}, JSON::PP::true, 'a timeout: isError');
like(text_of($r), qr/\[timeout\]/, '... named in the text');
$r = call('/mcp', $sid, 'execute_code', { code => 'x' });
is(text_of($r), "41\n", 'the kernel kept its state after the timeout');
$r = call('/mcp', $sid, 'execute_code', { code => '#' x 3000 });
like(text_of($r), qr/^code_too_large:/, 'over hermes_max_code: named');
is($r->{json}{result}{isError}, JSON::PP::true, '... isError');
$r = call('/mcp', $sid, 'execute_code', { session => '../etc' , code => '1' });
like(text_of($r), qr/^invalid_session:/, 'a bad session name: named');
$r = call('/mcp', $sid, 'execute_code', {});
like(text_of($r), qr/code/, 'no code: said so');
$r = call('/mcp', $sid, 'execute_code', { code => '1', timeout => 99 });
like(text_of($r), qr/hermes_cell_timeout/, 'a timeout over the cap: said so');
$r = call('/mcp', $sid, 'no_such_tool', {});
is($r->{json}{error}{code}, -32602, 'an unknown tool: invalid params');

# images: a PNG display is image content
$r = call('/mcp', $sid, 'execute_code', { code => <<'PY' });
import base64
class Dot:
    def _repr_png_(self):
        return base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')
display(Dot())
PY
my ($img) = grep { $_->{type} eq 'image' } @{ $r->{json}{result}{content} || [] };
is($img->{mimeType}, 'image/png', 'a PNG display: image content');
like($img->{data} // '', qr/^iVBORw0KGgo/, '... its base64 data');

# named sessions are the owner's, shared with /v1/execute
$r = call('/mcp', $sid, 'execute_code', { session => 'shared', code => 'y = 7' });
my $e = $t->execute('/v1/execute', { session => 'shared', code => 'y * 6' },
                    headers => { 'X-Owner' => 'alice' });
is($e->{result}{output}, "42\n", "a named session is the owner's, on /v1/execute too");
$r = call('/mcp', scalar(initialize('/mcp', owner => 'bob')), 'execute_code',
          { session => 'shared', code => "print('y' in dir())" }, owner => 'bob');
is(text_of($r), "False\n", "another owner's session of the same name is not it");

# list_kernels: the owner's kernels only
$r = call('/mcp', $sid, 'list_kernels', {});
my @sessions = sort map { $_->{session} }
               @{ $r->{json}{result}{structuredContent}{kernels} || [] };
ok((grep { $_ eq "mcp-$sid" } @sessions), 'list_kernels: the MCP session kernel');
ok((grep { $_ eq 'shared' } @sessions), '... and the named one');
is(scalar(grep { !/^(mcp-|shared$)/ } @sessions), 0, "... none of another owner's");

# interrupt: a running cell stops, the kernel lives on
my $async = do {
    my $pid = fork // die;
    if (!$pid) {
        call('/mcp', $sid, 'execute_code', { code => "import time\ntime.sleep(20)" });
        POSIX::_exit(0);
    }
    $pid;
};
my $done = Hermes::Test::wait_until(sub {
    my $l = call('/mcp', $sid, 'list_kernels', {});
    grep { $_->{session} eq "mcp-$sid" && $_->{state} eq 'running' }
        @{ $l->{json}{result}{structuredContent}{kernels} || [] };
}, 10);
ok($done, 'the long cell runs');
$r = call('/mcp', $sid2, 'interrupt', { session => "mcp-$sid" });
like(text_of($r), qr/^interrupted cell \d+/, 'interrupt: from another MCP session of the owner');
waitpid $async, 0;
$r = call('/mcp', $sid, 'interrupt', {});
like(text_of($r), qr/^no_cell:/, 'interrupt with nothing running: no_cell');
$r = call('/mcp', $sid, 'execute_code', { code => 'x' });
is(text_of($r), "41\n", 'the kernel kept its state after the interrupt');

# notifications/cancelled of a call in flight interrupts its cell
my $cancel_id = ++$n;
$async = do {
    my $pid = fork // die;
    if (!$pid) {
        my $res = rpc('/mcp', $sid, { jsonrpc => '2.0', id => $cancel_id,
            method => 'tools/call', params => { name => 'execute_code',
            arguments => { code => "import time\ntime.sleep(20)" } } });
        open my $fh, '>', $t->prefix . '/logs/cancelled.json';
        print $fh $JSON->encode($res->{json} // {});
        close $fh;
        POSIX::_exit(0);
    }
    $pid;
};
ok(Hermes::Test::wait_until(sub {
    my $l = call('/mcp', $sid, 'list_kernels', {});
    grep { $_->{session} eq "mcp-$sid" && $_->{state} eq 'running' }
        @{ $l->{json}{result}{structuredContent}{kernels} || [] };
}, 10), 'a long cell runs');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', method => 'notifications/cancelled',
                         params => { requestId => $cancel_id + 1000 } });
is($r->{status}, 202, 'a cancel of another id: 202');
sleep 1;
$r = call('/mcp', $sid, 'list_kernels', {});
ok((grep { $_->{session} eq "mcp-$sid" && $_->{state} eq 'running' }
    @{ $r->{json}{result}{structuredContent}{kernels} || [] }),
   '... and the cell runs on');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', method => 'notifications/cancelled',
                         params => { requestId => $cancel_id }, },
         owner => 'mallory');
is($r->{status}, 404, "another owner cannot cancel it");
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', method => 'notifications/cancelled',
                         params => { requestId => $cancel_id,
                                     reason => 'the user pressed Esc' } });
is($r->{status}, 202, 'notifications/cancelled: 202');
my $t0 = time;
waitpid $async, 0;
ok(time - $t0 < 10, 'the cancelled call ended at once');
my $cancelled = do {
    open my $fh, '<', $t->prefix . '/logs/cancelled.json'; local $/; <$fh>
};
like($cancelled // '', qr/\[interrupted\]/, '... its cell interrupted');
$r = call('/mcp', $sid, 'execute_code', { code => 'x' });
is(text_of($r), "41\n", 'the kernel kept its state after the cancel');

# reset_session: the state is gone
$r = call('/mcp', $sid, 'reset_session', {});
is($r->{json}{result}{isError}, JSON::PP::false, 'reset_session');
$r = call('/mcp', $sid, 'execute_code', { code => "print('x' in dir())" });
is(text_of($r), "False\n", '... a fresh kernel');

# Host and Origin: DNS rebinding is refused
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' },
         headers => { Host => 'evil.example.com' });
is($r->{status}, 403, 'a Host not of this host: 403');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' },
         headers => { Origin => 'http://evil.example.com' });
is($r->{status}, 403, 'an Origin not of this host: 403');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' },
         headers => { Origin => 'http://localhost.evil.example.com:8080' });
is($r->{status}, 403, 'an Origin that starts as localhost: 403');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' },
         headers => { Origin => 'null' });
is($r->{status}, 403, 'Origin null: 403');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' },
         headers => { Origin => 'http://localhost:3000' });
is($r->{status}, 200, 'a localhost Origin: 200');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' },
         headers => { Host => '[::1]:8080', Origin => 'http://[::1]:8080' });
is($r->{status}, 200, '[::1]: 200');
my $osid = initialize('/mcp-open', headers => {
    Host => 'gateway.example.com', Origin => 'https://app.example.com' });
ok($osid, 'hermes_mcp_hosts and hermes_mcp_origins let a named host in');
(undef, $r) = initialize('/mcp-open', headers => {
    Host => 'gateway.example.com', Origin => 'https://evil.example.com' });
is($r->{status}, 403, '... not another origin');
(undef, $r) = initialize('/mcp-open', headers => { Host => 'localhost' });
is($r->{status}, 403, '... nor another host once hosts are named');

# the cap: the least recently used session gives way
my @capped = map { initialize('/mcp-capped') } 1 .. 3;
$r = rpc('/mcp-capped', $capped[0], { jsonrpc => '2.0', id => 1, method => 'ping' });
is($r->{status}, 404, 'mcp_sessions=2: the oldest gave way');
$r = rpc('/mcp-capped', $capped[2], { jsonrpc => '2.0', id => 1, method => 'ping' });
is($r->{status}, 200, '... the newest is there');

# sessions live in the zone: a reload keeps them
ok($t->reload, 'reload');
$r = call('/mcp', $sid, 'execute_code', { code => "print('after')" });
is(text_of($r), "after\n", 'the session and its kernel survive a reload');

# DELETE ends the session and its kernel
$r = rpc('/mcp', $sid, undef, method => 'DELETE', owner => 'mallory');
is($r->{status}, 404, "DELETE of another owner's session: 404");
$r = rpc('/mcp', $sid, undef, method => 'DELETE');
is($r->{status}, 200, 'DELETE: 200');
$r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 1, method => 'ping' });
is($r->{status}, 404, '... the session is gone');
$r = call('/mcp', $sid2, 'list_kernels', {});
ok(!grep({ $_->{session} eq "mcp-$sid" }
         @{ $r->{json}{result}{structuredContent}{kernels} || [] }),
   '... and its kernel');

# metrics: by method and tool
my $m = $t->http('GET', '/status?format=prometheus');
like($m->{content}, qr/hermes_mcp_requests_total\{zone="kernels",method="tools\/call"\} [1-9]/,
     'metrics: MCP requests by method');
like($m->{content}, qr/hermes_mcp_tool_calls_total\{zone="kernels",tool="execute_code"\} [1-9]/,
     'metrics: MCP tool calls by tool');

$t->check_error_log;
done_testing;
