#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Tool calls from cells on an ssh kernel: the kernel-host agent watches
# rpc/ and brings each request whole over its channel; the module checks
# it (token, seq, replay: the same checks as on the local backend, never
# left to the host side), dispatches it to hermes_tools_pass, and sends
# the answer back for the agent to write (res_N, or an archived answer in
# pieces).  Forged requests written straight into rpc/ on the kernel host
# reach the endpoint zero times, are never answered, and are counted.

use strict;
use warnings;

use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use POSIX ();

use Hermes::Test;
use Hermes::Sshd;

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $J = JSON::PP->new->canonical;
my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;
my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
$s->start;
mkdir "$p/kroot/ssh", 0711;

# the tool endpoint, and a minimal MCP server
my $hitlog = $t->tool_server(1);
$t->mcp_server(3);

my $ssh = "hermes_backend ssh host=127.0.0.1:${\ $s->port } root=%%KROOT%%/ssh "
        . "user=root identity=${\ $s->identity } known_hosts=${\ $s->known_hosts } "
        . "connect_timeout=3s;";

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        hermes_tools echo fail slow big;
        hermes_tools_pass /tools;
        hermes_max_tool_calls 5;
        hermes_cell_timeout 60s;
        $ssh

        location = /x { hermes_execute; }
        location = /small { hermes_execute; hermes_max_output 2k; }
        location = /down { hermes_execute; hermes_tools_pass /tools-down; }
        location = /mcp-x {
            hermes_execute;
            hermes_tools auto;
            hermes_tools_pass /mcp protocol=mcp;
        }

        location /tools {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/;
            proxy_read_timeout 1s;
        }
        location /tools-down {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_2%%/;
        }
        location /mcp {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_3%%/mcp;
        }

        location = /status { hermes_status; }
    }
CONF
$t->run;

sub hits {
    open my $fh, '<', $hitlog or return [];
    my @h = map { $J->decode($_) } <$fh>;
    return \@h;
}

sub status { $t->http(GET => '/status')->{json} }

sub kdir {
    my ($kid) = @_;
    my @d = glob "$p/kroot/ssh/hermes_rkernel_*$kid*";
    return $d[0];
}

# -- a round trip ----------------------------------------------------------

my $r = $t->execute('/x', {session => 'rt', code => <<'PY'});
r = hermes_tools.echo(q="hi", n=[1, 2])
print(r["tool"], r["args"], r["owner"], r["session"])
print(hermes_tools.call("echo", {"again": True}, timeout=10)["args"])
PY
is($r->{result}{status}, 'success', 'round trip over ssh: the cell succeeds') or diag explain $r;
is($r->{result}{output},
   "echo {'q': 'hi', 'n': [1, 2]} anonymous rt\n{'again': True}\n",
   'the tool saw the args, the owner, the session; the code got its answer');
is($r->{result}{tool_calls_made}, 2, 'tool_calls_made');
my @ev = grep { $_->{type} =~ /^tool_/ } @{ $r->{events} };
is_deeply([map { [$_->{type}, $_->{seq}, $_->{tool}] } @ev],
          [[tool_call => 1, 'echo'], [tool_done => 1, 'echo'],
           [tool_call => 2, 'echo'], [tool_done => 2, 'echo']],
          'tool_call and tool_done events on the stream (no schemas to ask for: none asked)');
is(scalar @{ hits() }, 2, 'two hits at the endpoint');
my $kid = $r->{events}[0]{kernel_id};
my $kdir = kdir($kid);
ok($kdir && -d "$kdir/rpc", 'the kernel dir is on the (loopback) host');
opendir my $dh, "$kdir/rpc"; my @left = grep { !/^\./ } readdir $dh; closedir $dh;
is_deeply(\@left, [], 'rpc/ is empty after the calls');

# -- an MCP server, its tools listed ----------------------------------------

$r = $t->execute('/mcp-x', {session => 'mcp', code => <<'PY'});
print(hermes_tools.add(a=1, b=2))
print(repr(hermes_tools.greet(name="ssh")))
try:
    hermes_tools.nosuch()
except hermes_tools.ToolError as e:
    print("ToolError:", e)
PY
is($r->{result}{output},
   "{'sum': 3}\n'hello, ssh'\nToolError: tool \"nosuch\": not one of the MCP server's tools (tools/list)\n",
   'MCP over ssh: structuredContent as data, text as str, tools/list enforced');

# -- refusals, the budget, failing endpoints ---------------------------------

my $before = scalar @{ hits() };
$r = $t->execute('/x', {session => 'rt', code => <<'PY'});
hermes_tools._allowed = None      # past the client's own check: the module's
try:
    hermes_tools.call("rm_rf", {"path": "/"}, timeout=10)
except hermes_tools.ToolError as e:
    print(e)
for i in range(6):
    try:
        hermes_tools.echo(i=i)
    except hermes_tools.ToolError as e:
        print(i, e)
for name in ("fail", "slow"):
    try:
        getattr(hermes_tools, name)(s=3)
    except hermes_tools.ToolError as e:
        print("ToolError:", e)
PY
is($r->{result}{output},
   "tool \"rm_rf\" is not enabled here\n"
   . "5 the cell's budget of 5 tool calls is spent (hermes_max_tool_calls)\n"
   . "ToolError: the cell's budget of 5 tool calls is spent (hermes_max_tool_calls)\n"
   . "ToolError: the cell's budget of 5 tool calls is spent (hermes_max_tool_calls)\n",
   'a tool not enabled and a spent budget: the module answers an error');
is(scalar @{ hits() } - $before, 5, 'five hits: no disallowed tool, no call past the budget');

$r = $t->execute('/x', {session => 'bad', code => <<'PY'});
for name, args in (("fail", {}), ("slow", {"s": 3})):
    try:
        print(getattr(hermes_tools, name)(args))
    except hermes_tools.ToolError as e:
        print("ToolError:", e)
print("still here")
PY
is($r->{result}{output},
   "ToolError: tool \"fail\" failed (HTTP 500): boom\n"
   . "ToolError: tool \"slow\": the tool endpoint did not answer in time (HTTP 504)\n"
   . "still here\n", 'a failing and a slow endpoint: clear ToolErrors, the cell goes on');

$r = $t->execute('/down', {session => 'down', code => <<'PY'});
try:
    hermes_tools.echo()
except hermes_tools.ToolError as e:
    print(e)
PY
is($r->{result}{output}, "tool \"echo\": the tool endpoint is unavailable (HTTP 502)\n",
   'an endpoint that is down: a ToolError');

# -- a large answer: archived on the kernel host, written in pieces ----------

$r = $t->execute('/small', {session => 'big', code => <<'PY'}, timeout => 90);
import os, stat
r = hermes_tools.big(n=1200000)
print(type(r).__name__, r["bytes"], r["head"][:11], r["tail"][-6:])
st, dst = os.stat(r.path), os.stat(os.path.dirname(r.path))
print(oct(stat.S_IMODE(st.st_mode)), oct(stat.S_IMODE(dst.st_mode)))
print(len(r.load()["data"]), len(r["head"]) + len(r["tail"]) <= 2048)
print(sorted(n for n in os.listdir(os.path.dirname(r.path)) if n.endswith(".tmp")))
PY
is($r->{result}{output},
   "LargeResult 1200012 {\"data\": \"x xxxx\"}\n0o600 0o700\n1200000 True\n[]\n",
   'an answer over a frame: archived whole (0600 in 0700), its head and tail to the code')
    or diag explain $r;

# -- forged requests into a running cell's rpc/ on the host ----------------

$r = $t->execute('/x', {session => 'forge', code => 'print(hermes_tools._token)'});
my $token = $r->{result}{output};
chomp $token;
$kdir = kdir($r->{events}[0]{kernel_id});
my $rpc = "$kdir/rpc";
like($token, qr/^[0-9a-f]{64}$/, 'the kernel token (the code has it)');

my $st0 = status()->{rpc_rejected_total};
$before = scalar @{ hits() };

my $run = $t->execute_async('/x', {session => 'forge', code => <<'PY'});
import time
print("cell runs", flush=True)   # makes cell_out_000002
time.sleep(4)
print("cell done")
PY
wait_until(sub { -e "$kdir/cells/cell_out_000002" }, 10) or fail('the cell runs');
sleep 0.5;

sub forge {
    my ($seq, $text) = @_;
    my $f = sprintf "%s/req_%06d", $rpc, $seq;
    open my $fh, '>', "$f.x" or die; print $fh $text; close $fh;
    chmod 0600, "$f.x";
    rename "$f.x", $f or die;
    return $f;
}

my $bad = '0' x 64;
my %forged = (
    101 => qq({"tool":"echo","args":{"f":101},"seq":101,"token":"$bad"}),
    102 => qq({"tool":"echo","args":{"f":102},"seq":102}),
    103 => qq({"tool":"echo","args":{"f":103},"seq":"103","token":"$token"}),
    104 => qq({"tool":"echo","args":{"f":104},"seq":1.5,"token":"$token"}),
    105 => qq({"tool":"echo","args":{"f":105},"seq":true,"token":"$token"}),
    108 => qq({"tool":"echo","args":{"f":108},"seq":108,"token":"$token"),
);
forge($_, $forged{$_}) for sort keys %forged;

# not a request at all: a FIFO and a link, planted by whoever can write rpc/
POSIX::mkfifo("$rpc/x120", 0600) or die "mkfifo: $!";
rename "$rpc/x120", "$rpc/req_000120" or die;
# (to this test's canary, never a file of the host)
my $canary = $t->prefix . '/canary';
open my $cfh, '>', $canary or die;
print $cfh "canary\n";
close $cfh;
symlink $canary, "$rpc/x121" or die;
rename "$rpc/x121", "$rpc/req_000121" or die;

# one good request with the token, then the same seq again: a replay
forge(201, qq({"tool":"echo","args":{"f":201},"seq":201,"token":"$token"}));
ok(wait_until(sub { -e "$rpc/res_000201" }, 5), 'a request with the token is answered');
unlink "$rpc/res_000201";
forge(201, qq({"tool":"echo","args":{"f":201,"again":1},"seq":201,"token":"$token"}));

ok(wait_until(sub { !grep { -e sprintf("%s/req_%06d", $rpc, $_) || -l sprintf("%s/req_%06d", $rpc, $_) }
                  keys %forged, 201, 120, 121 }, 5),
   'every forged request is taken from rpc/');
sleep 0.5;
my @answers = do { opendir(my $d, $rpc); grep { /^res_/ } readdir $d };
is_deeply(\@answers, [], 'no forged request is answered');
my @fh = grep { ref $_->{args} eq 'HASH' && defined $_->{args}{f} } @{ hits() };
is_deeply([map { $_->{args}{f} } @fh], [201], 'only the good request reached the endpoint, once');

my $st1 = status()->{rpc_rejected_total};
my %want = (malformed => 3, token => 2, seq => 3, replay => 1);
is(($st1->{$_} // 0) - ($st0->{$_} // 0), $want{$_},
   "rpc_rejected_total{reason=\"$_\"}, counted by the module")
    for sort keys %want;

$r = $run->wait;
is($r->{result}{status}, 'success', 'the cell ran on, untouched') or diag explain $r;
is($r->{result}{output}, "cell runs\ncell done\n", 'its output');

# -- a request left from an earlier cell has no authority in the next ------

forge(301, qq({"tool":"echo","args":{"f":301},"seq":301,"token":"$token"}));
$r = $t->execute('/x', {session => 'forge', code => 'import os; print(sorted(os.listdir("rpc")))'});
is($r->{result}{output}, "[]\n", 'leftovers are swept before a cell, on the host');
ok(!grep({ ref $_->{args} eq 'HASH' && ($_->{args}{f} // 0) == 301 } @{ hits() }),
   'and never dispatched');

$t->stop;
$s->stop;
done_testing;
