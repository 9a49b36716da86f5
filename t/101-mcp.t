#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Tool calls to an MCP server: hermes_tools_pass URI protocol=mcp speaks
# MCP's streamable HTTP transport (JSON-RPC 2.0: initialize,
# notifications/initialized, tools/call, tools/list for "hermes_tools
# auto") through subrequests, to a minimal real MCP server here.

use strict;
use warnings;

use Test::More;
use JSON::PP;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $J = JSON::PP->new->canonical;
my $t = Hermes::Test->new(workers => 1);
my $hitlog = $t->mcp_server;

$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        hermes_tools_pass /mcp protocol=mcp;

        location = /x { hermes_execute; hermes_tools add greet two oops stream missing ask slow; }
        location = /short {
            hermes_execute; hermes_tools slow;
            hermes_tools_pass /mcp-short protocol=mcp;
        }
        location = /auto { hermes_execute; hermes_tools auto; }
        location = /schema { hermes_schema; hermes_tools auto; }
        location = /paged {
            hermes_execute; hermes_tools auto;
            hermes_tools_pass /mcp-paged protocol=mcp;
        }
        location = /f400 {
            hermes_execute; hermes_tools add;
            hermes_tools_pass /mcp-400 protocol=mcp;
        }
        location = /oldv {
            hermes_execute; hermes_tools add;
            hermes_tools_pass /mcp-old protocol=mcp;
        }

        location /mcp {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/mcp;
            proxy_read_timeout 5s;
            proxy_buffering off;
        }

        location = /mcp-short {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/mcp-short;
            proxy_read_timeout 1s;
            proxy_buffering off;
        }
    }
CONF
$t->run;

sub hits {
    open my $fh, '<', $hitlog or return [];
    return [map { $J->decode($_) } <$fh>];
}

sub forget {
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:" . $t->port(1)) or die;
    print $s "POST /forget HTTP/1.0\r\nContent-Length: 0\r\n\r\n";
    local $/; <$s>;
}

like($t->http(GET => '/schema')->{json}{anthropic}{description},
     qr/the tools of the gateway's MCP server/, 'hermes_schema with auto, before any list');

# tool names that would end a header or forge a log line, before any
# MCP session exists (the first call of the worker initializes): refused
# by the name grammar before any use, in every mode (the cell's own
# allow-list bypassed); nothing reaches the server, error.log holds no
# line the cell wrote
{
    my $off = length $t->error_log;
    for my $loc ('/auto', '/x') {
        my $r0 = $t->execute($loc, {session => 'inject', code => <<'PY'});
hermes_tools._allowed = None
for name in ("recall\r\nX-Hermes-Owner: bob",
             "nope\n2099/01/01 00:00:00 [alert] 1#1: FORGED",
             "add\x00", "a" * 129, "caf\u00e9"):
    try:
        hermes_tools.call(name, {"a": 1, "b": 2})
    except hermes_tools.ToolError as e:
        print("ToolError:", e)
PY
        is($r0->{result}{output},
           "ToolError: a tool call needs \"tool\": a name of 1-128 of A-Z a-z 0-9 _ - .\n" x 5,
           "$loc: names outside the grammar are refused") or diag explain $r0;
    }
    is(scalar @{ hits() }, 0, 'nothing reached the MCP server: no initialize with an injected header');
    my $log = substr($t->error_log, $off);
    unlike($log, qr/^2099/m, 'no forged line in error.log');
    unlike($log, qr/X-Hermes-Owner: bob/, 'no injected header text in error.log');
}

my $r = $t->execute('/x', {session => 'm', code => <<'PY'});
print(hermes_tools.add(a=1, b=2))
print(repr(hermes_tools.greet(name="nginx")))
print(repr(hermes_tools.two()))
print(repr(hermes_tools.stream(x=7)))
for name in ("oops", "missing"):
    try:
        getattr(hermes_tools, name)()
    except hermes_tools.ToolError as e:
        print("ToolError:", e)
PY
is($r->{result}{status}, 'success', 'MCP: the cell succeeds') or diag explain $r;
is($r->{result}{output}, <<'OUT', 'structuredContent as data, text as str, SSE answers, isError and JSON-RPC errors as ToolError');
{'sum': 3}
'hello, nginx'
'one\ntwo'
'streamed: 7'
ToolError: tool "oops" failed: it broke
ToolError: tool "missing" failed (MCP error -32602): Unknown tool: missing
OUT
is($r->{result}{tool_calls_made}, 6, 'tool_calls_made');

my $h = hits();
is_deeply([map { $_->{method} } @$h[0 .. 2]],
          ['initialize', 'notifications/initialized', 'tools/call'],
          'initialize, notifications/initialized, then tools/call');
open my $vf, '<', Hermes::Test::repo_root() . '/VERSION' or die "VERSION: $!";
chomp(my $version = <$vf>);
is_deeply($h->[0]{client}, {name => 'ngx_hermes', version => $version},
          "initialize's clientInfo names this build's version");
my @calls = grep { $_->{method} eq 'tools/call' } @$h;
is(scalar @calls, 6, 'one tools/call a call, one session for all');
ok(!grep({ !$_->{known} || ($_->{version} // '') ne '2025-06-18' } @calls),
   'every tools/call carries the Mcp-Session-Id and MCP-Protocol-Version');
like($calls[0]{accept}, qr{application/json.*text/event-stream}, 'Accept: JSON and SSE');
is_deeply($calls[0]{arguments}, {a => 1, b => 2}, 'arguments as the code passed them');
is($calls[0]{owner}, 'anonymous', 'the owner header');

# the session is the worker's: the next cell calls at once
my $n = @$h;
$r = $t->execute('/x', {session => 'm', code => 'print(hermes_tools.add(a=2, b=2)["sum"])'});
is($r->{result}{output}, "4\n", 'a second cell');
is_deeply([map { $_->{method} } @{ hits() }[$n .. $#{ hits() }]], ['tools/call'],
          'the session is reused');

# the server forgets it: 404, a new session, the call done once
forget();
$n = @{ hits() };
$r = $t->execute('/x', {session => 'm', code => 'print(hermes_tools.add(a=5, b=5)["sum"])'});
is($r->{result}{output}, "10\n", 'an expired session is replaced');
is_deeply([map { $_->{method} } @{ hits() }[$n .. $#{ hits() }]],
          ['tools/call', 'initialize', 'notifications/initialized', 'tools/call'],
          '404, initialize again, the call again');

# a call answered as an SSE stream that the server sends as it goes: its
# progress reaches the cell's stream, its requests are answered at once
# (no hang until the proxy's timeout)
{
    my $t0 = time;
    my $sr = $t->execute('/x', {session => 'ask', code => 'import json; print(json.loads(hermes_tools.ask()))'});
    my $took = time - $t0;
    is($sr->{result}{status}, 'success', 'a call whose stream asks the client things') or diag explain $sr->{result};
    is($sr->{result}{output},
       "{'elicitation/create': {'action': 'decline'}, 'ping': {}, 'roots/list': {'roots': []}, "
       . "'sampling/createMessage': {'code': -1, 'message': 'the gateway does not sample'}, "
       . "'x/other': {'code': -32601, 'message': 'Method not found'}}\n",
       '... each request answered as a client without those features: roots empty, elicitation declined, sampling refused');
    ok($took < 4, sprintf('... at once, not at a timeout (%.2f s)', $took));
    my ($pg) = grep { ($_->{type} // '') eq 'tool_progress' } @{ $sr->{events} };
    is_deeply($pg && {map { $_ => $pg->{$_} } qw(tool progress total message)},
              {tool => 'ask', progress => 1, total => 2, message => 'half way'},
              '... and its progress is a tool_progress event in the cell\'s stream');
    my @ans = grep { $_->{method} eq 'answer' } @{ hits() };
    is(scalar @ans, 5, '... five answers, one a request');
    ok(!grep({ !$_->{session} || defined $_->{owner} } @ans), '... in the kernel\'s session, nothing of the cell\'s request');
}

# a new kernel's first calls at once: one initialize, the others wait for
# its session and use it
$n = @{ hits() };
$r = $t->execute('/x', {session => 'conc', code => <<'PY'});
import threading
out = []
def f(i):
    out.append(hermes_tools.add(a=i, b=i)["sum"])
ts = [threading.Thread(target=f, args=(i,)) for i in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(sorted(out))
PY
is($r->{result}{output}, "[0, 2, 4, 6]\n", 'four first calls at once') or diag explain $r;
my @new = @{ hits() }[$n .. $#{ hits() }];
is(scalar(grep { $_->{method} eq 'initialize' } @new), 1, '... one initialize for all of them');
my %sess = map { ($_->{session} // '') => 1 } grep { $_->{method} eq 'tools/call' } @new;
is(scalar(keys %sess), 1, '... one session for the four calls');
ok(!grep({ $_->{method} eq 'tools/call' && !$_->{known} } @new), '... each sent once the session was made');
my ($first_call) = grep { $new[$_]{method} eq 'tools/call' } 0 .. $#new;
my ($notified) = grep { $new[$_]{method} eq 'notifications/initialized' } 0 .. $#new;
ok(defined $notified && $notified < $first_call, '... and initialized before any call');

# hermes_tools auto: the server's tools/list
$n = @{ hits() };
$r = $t->execute('/auto', {session => 'a', code => <<'PY'});
for i in range(2):
    try:
        hermes_tools.nope()
    except hermes_tools.ToolError as e:
        print("ToolError:", e)
    print(hermes_tools.add(a=3, b=i)["sum"])
PY
is($r->{result}{output}, <<'OUT', 'auto: the listed tools work, others raise');
ToolError: tool "nope": not one of the MCP server's tools (tools/list)
3
ToolError: tool "nope": not one of the MCP server's tools (tools/list)
4
OUT
is(scalar(grep { $_->{method} eq 'tools/list' } @{ hits() }[$n .. $#{ hits() }]), 1,
   'tools/list once, cached');

# a listed name that is not a Python identifier, called as one
$n = @{ hits() };
$r = $t->execute('/auto', {session => 'a', code => 'print(hermes_tools.get_sum(a=2, b=3)["sum"])'});
is($r->{result}{output}, "5\n", 'auto: get-sum called as get_sum') or diag explain $r->{result};
is_deeply([map { $_->{name} } grep { $_->{method} eq 'tools/call' } @{ hits() }[$n .. $#{ hits() }]],
          ['get-sum'], '... the server is asked for get-sum');

# a listed name outside the name grammar (300 characters) is never reached,
# not even by the identifier of its first 128
$r = $t->execute('/auto', {session => 'a', code => <<'PY'});
try:
    hermes_tools.call("x" * 128, {})
except hermes_tools.ToolError as e:
    print("ToolError:", e)
PY
like($r->{result}{output}, qr/^ToolError: tool "x{128}": not one of the MCP server's tools/,
     'a listed name longer than a tool name may be is not reached by a prefix') or diag explain $r->{result};
ok(!grep({ ($_->{name} // '') eq 'nope' } @{ hits() }), 'an unlisted tool is never called');

like($t->http(GET => '/schema')->{json}{openai}{function}{description},
     qr/hermes_tools\.add\(\.\.\.\), hermes_tools\.greet\(\.\.\.\)/,
     'hermes_schema with auto: the listed tools');

# tools/list in pages: every page's tools, each cursor sent back as it came
$n = @{ hits() };
$r = $t->execute('/paged', {session => 'p', code => 'print(hermes_tools.recall(), hermes_tools.add(a=1, b=1)["sum"])'});
is($r->{result}{output}, "None 2\n", 'paged tools/list: a tool of the last page and of the first') or diag explain $r;
my @lists = grep { $_->{method} eq 'tools/list' } @{ hits() }[$n .. $#{ hits() }];
is_deeply([map { $_->{cursor} } @lists], [undef, 'p2', 'p4', 'p6', 'p8', 'p10'], 'every page asked for, nextCursor followed');

# a server that answers a forgotten session 400, naming it: a new session
$r = $t->execute('/f400', {session => 'f', code => 'print(hermes_tools.add(a=1, b=2)["sum"])'});
is($r->{result}{output}, "3\n", 'a first call');
forget();
$n = @{ hits() };
$r = $t->execute('/f400', {session => 'f', code => 'print(hermes_tools.add(a=2, b=2)["sum"])'});
is($r->{result}{output}, "4\n", 'a 400 naming the session: a new session, the call done once')
    or diag explain $r;
is_deeply([map { $_->{method} } @{ hits() }[$n .. $#{ hits() }]],
          ['tools/call', 'initialize', 'notifications/initialized', 'tools/call'],
          '400, initialize again, the call again');

# a protocol version the client does not speak: a clear ToolError
$r = $t->execute('/oldv', {session => 'o', code => <<'PY'});
try:
    hermes_tools.add(a=1, b=2)
except hermes_tools.ToolError as e:
    print("ToolError:", e)
PY
like($r->{result}{output}, qr/^ToolError: tool "add": the MCP server chose protocol version "1999-01-01", not one this gateway speaks \(2025-06-18, 2025-03-26\)/,
     'an unknown protocol version is refused, named') or diag explain $r;

# a call whose cell ends before its answer: the server is told
# (notifications/cancelled, the call's id, a reason), and the call's
# stream ends then, not at the proxy's timeout (the server keeps it alive)
{
    $n = @{ hits() };
    $r = $t->execute('/x', {session => 'cancel', code => <<'PY'});
import threading, time
threading.Thread(target=hermes_tools.slow, daemon=True).start()
time.sleep(1)
print("left")
PY
    is($r->{result}{output}, "left\n", 'a cell leaves a call behind') or diag explain $r;
    my ($call) = grep { ($_->{name} // '') eq 'slow' } @{ hits() }[$n .. $#{ hits() }];
    ok(wait_until(sub { grep { $_->{method} eq 'notifications/cancelled' } @{ hits() }[$n .. $#{ hits() }] }, 5),
       '... notifications/cancelled reaches the server');
    my ($c) = grep { $_->{method} eq 'notifications/cancelled' } @{ hits() }[$n .. $#{ hits() }];
    ok($call && $c && defined $c->{request_id} && $c->{request_id} eq $call->{id},
       '... with the id of the call') or diag explain [$call, $c];
    like($c && $c->{reason}, qr/cell .* ended before the answer/, '... and a reason');
    ok($c && $c->{known} && ($c->{version} // '') eq '2025-06-18', "... in the kernel's session");
    ok(wait_until(sub { grep { $_->{method} eq 'slow-end' } @{ hits() }[$n .. $#{ hits() }] }, 8),
       '... the server stops');
    my ($end) = grep { $_->{method} eq 'slow-end' } @{ hits() }[$n .. $#{ hits() }];
    ok($end && $end->{cancelled} && defined $end->{closed_after} && $end->{closed_after} < 2,
       '... and the gateway ended the call\'s stream at once') or diag explain $end;
}

# a call the gateway stops waiting for (proxy_read_timeout 1s): cancelled
{
    $n = @{ hits() };
    $r = $t->execute('/short', {session => 'cancel2', code => <<'PY'});
try:
    hermes_tools.slow(quiet=True)
except hermes_tools.ToolError as e:
    print("ToolError:", e)
PY
    like($r->{result}{output}, qr/^ToolError: tool "slow": the MCP server's stream broke or timed out \(proxy_read_timeout\) before the answer/,
         'a stream past proxy_read_timeout is a ToolError') or diag explain $r->{result};
    my ($call) = grep { ($_->{name} // '') eq 'slow' } @{ hits() }[$n .. $#{ hits() }];
    ok(wait_until(sub { grep { $_->{method} eq 'notifications/cancelled' } @{ hits() }[$n .. $#{ hits() }] }, 5),
       '... and the call is cancelled with the server');
    my ($c) = grep { $_->{method} eq 'notifications/cancelled' } @{ hits() }[$n .. $#{ hits() }];
    ok($call && $c && $c->{request_id} eq $call->{id}, '... by its id');
    like($c && $c->{reason}, qr/stopped waiting/, '... saying why');
}

$t->stop;

# nginx -t: auto needs protocol=mcp
my $c = Hermes::Test->new(workers => 1);
$c->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /x { hermes_execute; hermes_tools auto; hermes_tools_pass /t; }
    }
CONF
my ($rc, $out) = $c->test_config;
isnt($rc, 0, 'hermes_tools auto without protocol=mcp: nginx -t fails');
like($out, qr/"hermes_tools auto" needs "hermes_tools_pass URI protocol=mcp"/, 'and says why');

done_testing;
