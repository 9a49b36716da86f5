#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Tool calls from cells (local backend): code calls hermes_tools.NAME(),
# the module checks each rpc/req_N and dispatches it as a subrequest to
# hermes_tools_pass, a real HTTP tool endpoint here that logs every hit.
# Forged requests written straight into a running cell's rpc/ reach the
# endpoint zero times, are never answered, and are counted by reason.

use strict;
use warnings;

use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $J = JSON::PP->new->canonical;
my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

# the tool endpoint
my $hitlog = $t->tool_server;

$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        hermes_tools echo fail slow notjson big;
        hermes_tools_pass /tools;
        hermes_max_tool_calls 5;

        location = /x { hermes_execute; }
        location = /small { hermes_execute; hermes_max_output 2k; }
        location = /tiny { hermes_execute; hermes_max_code 4k; }
        location = /many { hermes_execute; hermes_max_tool_calls 64; hermes_max_output 8m; }
        location = /down { hermes_execute; hermes_tools_pass /tools-down; }
        location = /none { hermes_execute; hermes_tools off; }

        location /tools {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/;
            proxy_read_timeout 1s;
        }
        location /tools-down {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_2%%/;
        }

        location = /status { hermes_status; }
        location = /schema { hermes_schema; }
        location = /schema-none { hermes_schema; hermes_tools off; }
    }

    # a schema location as the README has it: hermes_tools, no tools_pass
    server {
        listen 127.0.0.1:%%PORT_3%%;
        location = /v1/schema { hermes_tools web_search fetch_url; hermes_schema; }
        location = /odd/schema { hermes_tools get-sum web.search class 3d a-b a.b; hermes_schema; }
    }
CONF
$t->run;

sub hits {
    open my $fh, '<', $hitlog or return [];
    my @h = map { $J->decode($_) } <$fh>;
    return \@h;
}

sub status { $t->http(GET => '/status')->{json} }

sub types { [map { $_->{type} } @{ $_[0]{events} }] }

# -- a round trip --------------------------------------------------------

my $r = $t->execute('/x', {session => 'rt', code => <<'PY'}, headers => {Cookie => 'secret=1'});
r = hermes_tools.echo(q="hi", n=[1, 2])
print(r["tool"], r["args"], r["owner"], r["session"], r["ctype"])
print(hermes_tools.call("echo", {"again": True}, timeout=10)["args"])
PY
is($r->{result}{status}, 'success', 'round trip: the cell succeeds') or diag explain $r;
is($r->{result}{output},
   "echo {'q': 'hi', 'n': [1, 2]} anonymous rt application/json\n{'again': True}\n",
   'round trip: the tool saw the args, the owner, the session; the code got its answer');
is($r->{result}{tool_calls_made}, 2, 'tool_calls_made');
my @ev = grep { $_->{type} =~ /^tool_/ } @{ $r->{events} };
is_deeply([map { [$_->{type}, $_->{seq}, $_->{tool}] } @ev],
          [[tool_call => 1, 'echo'], [tool_done => 1, 'echo'],
           [tool_call => 2, 'echo'], [tool_done => 2, 'echo']],
          'tool_call and tool_done events on the stream (no schemas to ask for: none asked)');
ok($ev[1]{ok} && $ev[1]{ms} =~ /^\d+$/, 'tool_done: ok, ms');
is(scalar @{ hits() }, 2, 'two hits at the endpoint');
is(hits()->[0]{cookie}, undef, "the client's headers are not the tool's");
is(status()->{tool_calls_total}, 2, 'tool_calls_total');
my $kid = $r->{events}[0]{kernel_id};
my ($kdir) = grep { /$kid/ } $t->kroot_dirs;
opendir my $dh, "$kdir/rpc"; my @left = grep { !/^\./ } readdir $dh; closedir $dh;
is_deeply(\@left, [], 'rpc/ is empty after the calls');

# -- only the enabled tools ------------------------------------------------

my $before = scalar @{ hits() };
my $t0 = time;
$r = $t->execute('/x', {session => 'rt', code => <<'PY'});
try:
    hermes_tools.rm_rf(path="/")
except hermes_tools.ToolError as e:
    print(e)
hermes_tools._allowed = None      # past the client's own check: the module's
for name in ("rm_rf", "ech", "echoo", "ECHO", "notjso"):
    try:
        hermes_tools.call(name, {"path": "/"}, timeout=10)
    except hermes_tools.ToolError as e:
        print(e)
PY
ok(time - $t0 < 5, 'a disallowed tool raises at once');
is($r->{result}{output},
   "tool 'rm_rf' is not enabled here; enabled tools: echo, fail, slow, notjson, big\n"
   . "tool \"rm_rf\" is not enabled here\n"
   . "tool \"ech\" is not enabled here\n"
   . "tool \"echoo\" is not enabled here\n"
   . "tool \"ECHO\" is not enabled here\n"
   . "tool \"notjso\" is not enabled here\n",
   'the client names the enabled tools; the module refuses what it is not told to, a prefix or a longer name too');
is(scalar @{ hits() }, $before, 'no hit for a disallowed tool');
is($r->{result}{tool_calls_made}, 0, 'a refused call is not made');

$r = $t->execute('/none', {session => 'none', code => <<'PY'});
try:
    hermes_tools.echo()
except hermes_tools.ToolError as e:
    print(e)
PY
is($r->{result}{output}, "tool 'echo' is not enabled here; enabled tools: none\n",
   'hermes_tools off: no tools');

# -- the wait's inotify fd: a thread's own, kept from call to call ----------
# (closing one with a watch waits for the kernel to free the mark: tens of
# us a call, at times ms).  A cell that closes it, or puts a file of its
# own at its number, gets a new one and keeps its file; a thread's closes
# with the thread; a forked child makes its own.

$r = $t->execute('/many', {session => 'watch', code => <<'PY'}, timeout => 60);
import os, threading, time
def inotify_fds():
    n = 0
    for fd in os.listdir('/proc/self/fd'):
        try:
            n += os.readlink('/proc/self/fd/' + fd) == 'anon_inode:inotify'
        except OSError:
            pass
    return n
base = inotify_fds()
for i in range(3):
    hermes_tools.echo(i=i)
print('kept', inotify_fds() - base)
os.close(hermes_tools._watches.w.fd)
print('closed', hermes_tools.echo(i=3)['args'], inotify_fds() - base)
os.close(hermes_tools._watches.w.fd)
f = os.open('/dev/null', os.O_RDONLY)
print('taken', hermes_tools.echo(i=4)['args'], os.readlink('/proc/self/fd/%d' % f))
t = threading.Thread(target=lambda: hermes_tools.echo(i=5))
t.start()
t.join()
for _ in range(100):
    if inotify_fds() - base == 1:
        break
    time.sleep(0.02)
print('thread', inotify_fds() - base)
mine = hermes_tools._watches.w.fd
pid = os.fork()
if pid == 0:
    ok = hermes_tools.echo(i=6)['args'] == {'i': 6}
    w = hermes_tools._watches.w
    os._exit(0 if ok and w.pid == os.getpid() and w.fd != mine else 1)
print('child', os.waitpid(pid, 0)[1])
PY
is($r->{result}{output},
   "kept 1\nclosed {'i': 3} 1\ntaken {'i': 4} /dev/null\nthread 1\nchild 0\n",
   "tool calls keep their thread's inotify fd; a cell that closes it or takes its number, a thread, a fork")
    or diag explain $r->{result};

# -- the budget ------------------------------------------------------------

$before = scalar @{ hits() };
$r = $t->execute('/x', {session => 'budget', code => <<'PY'});
for i in range(7):
    try:
        hermes_tools.echo(i=i)
    except hermes_tools.ToolError as e:
        print(i, e)
PY
is($r->{result}{output},
   "5 the cell's budget of 5 tool calls is spent (hermes_max_tool_calls)\n"
   . "6 the cell's budget of 5 tool calls is spent (hermes_max_tool_calls)\n",
   'hermes_max_tool_calls: the sixth call gets an error');
is(scalar @{ hits() } - $before, 5, 'five hits, not seven');
is($r->{result}{tool_calls_made}, 5, 'tool_calls_made counts the calls made');
$r = $t->execute('/x', {session => 'budget', code => 'print(hermes_tools.echo()["tool"])'});
is($r->{result}{output}, "echo\n", 'the budget is per cell');

# -- failing, wrong and slow endpoints: a ToolError, the cell goes on -----

$r = $t->execute('/x', {session => 'bad', code => <<'PY'});
for name, args in (("fail", {}), ("notjson", {}), ("slow", {"s": 3})):
    try:
        print(getattr(hermes_tools, name)(args))
    except hermes_tools.ToolError as e:
        print("ToolError:", e)
print("still here")
PY
is($r->{result}{status}, 'success', 'a failing endpoint does not fail the cell');
is($r->{result}{output},
   "ToolError: tool \"fail\" failed (HTTP 500): boom\n"
   . "ToolError: tool \"notjson\": the tool endpoint's answer is not JSON\n"
   . "ToolError: tool \"slow\": the tool endpoint did not answer in time (HTTP 504)\n"
   . "still here\n", 'HTTP 500, not JSON, and a timeout are clear ToolErrors');
my @done = grep { $_->{type} eq 'tool_done' } @{ $r->{events} };
is_deeply([map { $_->{ok} ? 1 : 0 } @done], [0, 0, 0], 'tool_done ok:false for each');

$r = $t->execute('/down', {session => 'down', code => <<'PY'});
try:
    hermes_tools.echo()
except hermes_tools.ToolError as e:
    print(e)
PY
is($r->{result}{output}, "tool \"echo\": the tool endpoint is unavailable (HTTP 502)\n",
   'an endpoint that is down: a ToolError');

# -- the client leaves while a tool runs: the cell goes on without tools -

$r = $t->execute('/x', {session => 'gone', code => <<'PY'},
import time
out = []
try:
    hermes_tools.slow(s=0.8)
except hermes_tools.ToolError as e:
    out.append(str(e))
try:
    hermes_tools.echo()
except hermes_tools.ToolError as e:
    out.append(str(e))
open("gone.txt", "w").write("\n".join(out))
PY
    on_event => sub { $_[0]{type} eq 'tool_call' ? ABORT_STREAM : undef });
ok($r->{aborted}, 'the client hangs up once the tool call started');
sleep 1.5;
$r = $t->execute('/x', {session => 'gone', code => 'print(open("gone.txt").read())'});
is($r->{result}{output},
   "tool \"slow\": the client that started this cell disconnected while the tool ran; "
   . "its answer is lost\nthe client that started this cell has disconnected; tool "
   . "calls run on its behalf, so there are no more in this cell\n",
   'the call in flight and the next one get a ToolError saying why');

# -- an answer over hermes_max_output is archived --------------------------

$r = $t->execute('/small', {session => 'big', code => <<'PY'});
import os, stat
r = hermes_tools.big(n=20000)
print(type(r).__name__, r["bytes"], r["head"][:11], r["tail"][-6:])
st, dst = os.stat(r.path), os.stat(os.path.dirname(r.path))
print(oct(stat.S_IMODE(st.st_mode)), oct(stat.S_IMODE(dst.st_mode)))
print(len(r.load()["data"]), len(r["head"]) + len(r["tail"]) <= 2048)
PY
is($r->{result}{output}, "LargeResult 20012 {\"data\": \"x xxxx\"}\n0o600 0o700\n20000 True\n",
   'a large answer: its path (0600 in 0700), size, head and tail');

# tool_results/ made by the code, a link to another directory of the kernels'
# user (another kernel's, say): not followed, nothing written there
$r = $t->execute('/small', {session => 'biglink', code => 'import os; print(os.getuid())'});
my $kuid = (stat((grep { /$r->{events}[0]{kernel_id}/ } $t->kroot_dirs)[0]))[4];
my $elsewhere = "$p/elsewhere";
mkdir $elsewhere, 0700 or die;
chown $kuid, -1, $elsewhere or die;
$r = $t->execute('/small', {session => 'biglink', code => <<"PY"});
import os
os.symlink("$elsewhere", "tool_results")
try:
    hermes_tools.big(n=20000)
except hermes_tools.ToolError as e:
    print(e)
PY
is($r->{result}{output},
   "tool \"big\": its answer could not be passed on (see the gateway's error log)\n",
   'a tool_results/ that is a link: a ToolError');
opendir my $eh, $elsewhere or die;
is_deeply([grep { !/^\./ } readdir $eh], [], 'nothing written through the link');
closedir $eh;

# -- forged requests into a running cell's rpc/ ----------------------------

$r = $t->execute('/x', {session => 'forge', code => 'print(hermes_tools._token)'});
my $token = $r->{result}{output};
chomp $token;
$kid = $r->{events}[0]{kernel_id};
($kdir) = grep { /$kid/ } $t->kroot_dirs;
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
sleep 0.3;

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
    101 => [token => qq({"tool":"echo","args":{"f":101},"seq":101,"token":"$bad"})],
    102 => [token => qq({"tool":"echo","args":{"f":102},"seq":102})],
    111 => [token => qq({"tool":"echo","args":{"f":111},"seq":111,"token":"${token}00"})],
    103 => [seq => qq({"tool":"echo","args":{"f":103},"seq":"103","token":"$token"})],
    104 => [seq => qq({"tool":"echo","args":{"f":104},"seq":1.5,"token":"$token"})],
    105 => [seq => qq({"tool":"echo","args":{"f":105},"seq":true,"token":"$token"})],
    106 => [seq => qq({"tool":"echo","args":{"f":106},"seq":107,"token":"$token"})],
    108 => [malformed => qq({"tool":"echo","args":{"f":108},"seq":108,"token":"$token")],
    109 => [malformed => qq([{"tool":"echo","seq":109,"token":"$token"}])],
    110 => [malformed => qq({"tool":"echo","seq":110,"seq":110,"token":"$token"})],
);
forge($_, $forged{$_}[1]) for sort keys %forged;

# one good request with the token, then the same seq again: a replay
forge(201, qq({"tool":"echo","args":{"f":201},"seq":201,"token":"$token"}));
ok(wait_until(sub { -e "$rpc/res_000201" }, 5), 'a request with the token is answered');
unlink "$rpc/res_000201";
forge(201, qq({"tool":"echo","args":{"f":201,"again":1},"seq":201,"token":"$token"}));

ok(wait_until(sub { !grep { -e sprintf("%s/req_%06d", $rpc, $_) } keys %forged, 201 }, 5),
   'every forged request is removed');
sleep 0.5;
my @answers = do { opendir(my $d, $rpc); grep { /^res_/ } readdir $d };
is_deeply(\@answers, [], 'no forged request is answered');
my @fh = grep { ref $_->{args} eq 'HASH' && defined $_->{args}{f} } @{ hits() };
is_deeply([map { $_->{args}{f} } @fh], [201], 'only the good request reached the endpoint, once');

my $st1 = status()->{rpc_rejected_total};
my %want = (malformed => 3, token => 3, seq => 4, replay => 1);
is($st1->{$_} - ($st0->{$_} // 0), $want{$_}, "rpc_rejected_total{reason=\"$_\"}")
    for sort keys %want;

$r = $run->wait;
is($r->{result}{status}, 'success', 'the cell ran on, untouched') or diag explain $r;
is($r->{result}{output}, "cell runs\ncell done\n", 'its output');

my $prom = $t->http(GET => '/status?format=prometheus')->{content};
like($prom, qr/hermes_rpc_rejected_total\{zone="kernels",reason="replay"\} 1/,
     'prometheus: rpc_rejected_total{reason}');

# -- a flood of bad-token requests: counted exactly, a few log lines -------

{
    my $off = length $t->error_log;
    my $tok0 = status()->{rpc_rejected_total}{token} // 0;
    my $fr = $t->execute('/x', {session => 'forge', code => <<'PY'}, timeout => 60);
import os, time
n = 0
end = time.time() + 2
# (bounded: a worker under AddressSanitizer takes each several times slower)
while time.time() < end and n < 4000:
    n += 1
    p = "rpc/req_%06d" % (1000 + n)
    with open(p + ".x", "w") as f:
        f.write('{"tool":"echo","args":{},"seq":%d,"token":"%s"}'
                % (1000 + n, "0" * 64))
    os.rename(p + ".x", p)
while os.listdir("rpc") and time.time() < end + 30:
    time.sleep(0.05)
print(n)
PY
    my $n = $fr->{result}{output} // 0;
    chomp $n;
    ok($n > 200, "the cell wrote $n bad-token requests");
    is((status()->{rpc_rejected_total}{token} // 0) - $tok0, $n,
       'rpc_rejected_total{reason="token"} counts every one');
    my $log = substr($t->error_log, $off);
    my $lines = () = $log =~ /kernel \Q$kid\E: tool call request "req_\d+" rejected \(token\)/g;
    # (the forged requests above took this minute's lines, or some)
    ok($lines <= 5, "at most a few lines for them ($lines)");
    my ($more) = $log =~ /kernel \Q$kid\E: (\d+) more tool call request\(s\) rejected, not logged/;
    is(($more // 0) + $lines, $n, 'and one line for the rest, with their number')
        or diag $log;
    ok(length($log) < 4096, sprintf('error.log grew by %d bytes', length $log));
}

# -- a tool call request over hermes_max_code: refused unread, counted ----

{
    my $m0 = status()->{rpc_rejected_total}{malformed} // 0;
    my $n0 = scalar @{ hits() };
    my $tr = $t->execute('/tiny', {session => 'tiny', code => <<'PY'});
try:
    hermes_tools.call("echo", {"pad": "x" * 5000}, timeout=2)
except hermes_tools.ToolError as e:
    print("ToolError:", e)
print("small" in str(hermes_tools.echo(f="small")))
PY
    like($tr->{result}{output} // '', qr/^ToolError: .*\nTrue\n$/s,
         'a request over hermes_max_code is never answered; a small one is') or diag explain $tr->{result};
    is((status()->{rpc_rejected_total}{malformed} // 0) - $m0, 1, 'it is counted as malformed');
    my @big = grep { ref $_->{args} eq 'HASH' && defined $_->{args}{pad} } @{ hits() }[$n0 .. $#{ hits() }];
    is(scalar @big, 0, 'and never reaches the endpoint');
}

# -- 40 large answers at once: a few in the worker's memory at a time -----

{
    my ($w) = $t->worker_pids;
    my $hwm = sub {
        my $st = do { local $/; open my $f, '<', "/proc/$w/status" or return 0; <$f> } // '';
        return $st =~ /^VmHWM:\s+(\d+) kB/m ? $1 : 0;
    };
    # the worker's peak so far, a first large answer included
    $t->execute('/many', {session => 'many', code => 'hermes_tools.big(n=4900000)'});
    my $before = $hwm->();
    my $mr = $t->execute('/many', {session => 'many', code => <<'PY'}, timeout => 120);
import threading
got = []
def one():
    got.append(len(hermes_tools.big(n=4900000)["data"]))
ts = [threading.Thread(target=one) for _ in range(40)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(len(got), set(got))
PY
    is($mr->{result}{output}, "40 {4900000}\n", '40 concurrent answers of 4.9 MB, all whole')
        or diag explain $mr->{result};
    SKIP: {
        # ASan keeps freed memory in its quarantine (256 MB by default)
        skip 'AddressSanitizer: freed memory stays resident in its quarantine', 1
            if ($ENV{HERMES_NGINX_PRELOAD} // '') =~ /asan/;
        my $grew = ($hwm->() - $before) / 1024;
        ok($grew < 64, sprintf('the worker grew by %.0f MB at most (bound: 64)', $grew));
    }
}

# -- a request left from an earlier cell has no authority in the next ------

# (requests and answers go; a .tmp is nobody's request yet, and other
# names are not the channel's)
forge(301, qq({"tool":"echo","args":{"f":301},"seq":301,"token":"$token"}));
# more than one listing of the directory takes (1024 names)
forge($_, qq({"tool":"echo","args":{"f":301},"seq":$_,"token":"$token"}))
    for 50001 .. 53000;
for my $name (qw(res_000003 req_000009.tmp keep.txt)) {
    open my $fh, '>', "$rpc/$name" or die; print $fh '{}'; close $fh;
}
$r = $t->execute('/x', {session => 'forge', code => 'import os; print(sorted(os.listdir("rpc")))'});
is($r->{result}{output}, "['keep.txt', 'req_000009.tmp']\n", 'leftovers are swept before a cell');
unlink "$rpc/keep.txt", "$rpc/req_000009.tmp";
ok(!grep({ ref $_->{args} eq 'HASH' && ($_->{args}{f} // '') eq '301' } @{ hits() }),
   'and never dispatched');

# more than a sweep takes (16 listings): the kernel is not trusted with a
# cell; the session's next cell has a new one
forge($_, qq({"tool":"echo","args":{"f":302},"seq":$_,"token":"$token"}))
    for 60001 .. 77000;
$r = $t->execute('/x', {session => 'forge', code => 'x = 1'});
is($r->{status}, 502, 'a flood of leftovers over the sweep: 502');
is($r->{json}{error}{code}, 'ship_failed', 'ship_failed') or diag explain $r->{json};
like(substr($t->error_log, -4096), qr/more than 16384 requests left in rpc\/ by earlier cells/,
     'the warning says why');
$r = $t->execute('/x', {session => 'forge', code => 'import os; print(os.listdir("rpc"))'});
is($r->{result}{output}, "[]\n", 'the next cell: a new kernel, its rpc/ empty') or diag explain $r;
ok($r->{result}{kernel}{state_lost}, 'state_lost says so');
ok(!grep({ ref $_->{args} eq 'HASH' && ($_->{args}{f} // '') eq '302' } @{ hits() }),
   'and none dispatched');

# -- the execute_code schema ----------------------------------------------

$r = $t->http(GET => '/schema');
is($r->{status}, 200, 'hermes_schema');
my $sc = $r->{json};
is($sc->{openai}{type}, 'function', 'OpenAI format');
is($sc->{openai}{function}{name}, 'execute_code', 'its name');
is_deeply($sc->{openai}{function}{parameters}{required}, ['code'], 'code is required');
is($sc->{anthropic}{name}, 'execute_code', 'Anthropic format');
is($sc->{anthropic}{input_schema}{properties}{session}{type}, 'string', 'its input_schema');
like($sc->{anthropic}{description},
     qr/hermes_tools\.echo\(\.\.\.\), hermes_tools\.fail\(\.\.\.\), hermes_tools\.slow\(\.\.\.\), hermes_tools\.notjson\(\.\.\.\), hermes_tools\.big\(\.\.\.\)\.  At most 5 tool calls/,
     'the description lists the enabled tools and the budget');
is($sc->{openai}{function}{description}, $sc->{anthropic}{description}, 'one description');
is_deeply($t->http(GET => '/schema?format=anthropic')->{json}, $sc->{anthropic}, '?format=anthropic');
is_deeply($t->http(GET => '/schema?format=openai')->{json}, $sc->{openai}, '?format=openai');
is($t->http(GET => '/schema?format=x')->{status}, 400, 'an unknown format: 400');
like($t->http(GET => '/schema-none')->{json}{openai}{function}{description},
     qr/No tools can be called/, 'no tools: said so');
like($t->http(GET => '/v1/schema', port => $t->port(3))->{json}{openai}{function}{description},
     qr/hermes_tools\.web_search\(\.\.\.\), hermes_tools\.fetch_url\(\.\.\.\)\.  At most 50 tool calls/,
     'a schema location without hermes_tools_pass names its hermes_tools');
like($t->http(GET => '/odd/schema', port => $t->port(3))->{json}{openai}{function}{description},
     qr/hermes_tools\.get_sum\(\.\.\.\), hermes_tools\.web_search\(\.\.\.\), hermes_tools\.class_\(\.\.\.\), hermes_tools\.tool_3d\(\.\.\.\), hermes_tools\.call\("a-b", \{\.\.\.\}\), hermes_tools\.call\("a\.b", \{\.\.\.\}\)\./,
     'names that are not Python identifiers: as the code calls them (get_sum, class_, tool_3d), call() where two meet');

$t->stop;

# -- nginx -t names the directive and the reason ---------------------------

for my $case (
    ['hermes_tools "a b";', qr/"hermes_tools": invalid tool name "a b"/],
    ['hermes_tools echo echo;', qr/"hermes_tools": "echo" is listed twice/],
    ['hermes_tools_pass tools;', qr/"hermes_tools_pass": "tools" is not a location's URI/],
    ['hermes_tools_pass /tools protocol=soap;', qr/"hermes_tools_pass": invalid parameter "protocol=soap"/],
    ['hermes_max_tool_calls -1;', qr/"hermes_max_tool_calls" directive invalid number/],
    ['hermes_max_tool_calls 1000000;', qr/"hermes_max_tool_calls" must be between 0 and 100000/],
)
{
    my $c = Hermes::Test->new(workers => 1);
    $c->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /x { hermes_execute; $case->[0] }
    }
CONF
    my ($rc, $out) = $c->test_config;
    isnt($rc, 0, "nginx -t fails: $case->[0]");
    like($out, $case->[1], "and says why: $case->[0]");
}

done_testing;
