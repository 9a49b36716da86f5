#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Execute on the local backend: state, streaming, results, answers.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_cell_timeout 20s;
        }

        location = /v1/small {
            hermes_execute;
            hermes_max_output 1000;
            hermes_max_stream 3000;
        }
    }
CONF
$t->run;

# a cell's state is there for the next cell
my $r = $t->execute('/v1/execute', { session => 's1', code => "x = 41\nprint('set')" });
is($r->{status}, 200, 'first cell: 200');
like($r->{headers}{'content-type'}, qr{^application/x-ndjson}, 'NDJSON stream');
is($r->{events}[0]{type}, 'kernel', 'stream opens with the kernel line');
is($r->{events}[0]{session}, 's1', 'kernel line names the session');
is($r->{events}[0]{reused}, JSON::PP::false, 'first cell: a new kernel');
like($r->{events}[0]{kernel_id}, qr/^[0-9a-f]{32}$/, 'kernel id');
my ($out) = grep { $_->{type} eq 'stdout' } @{ $r->{events} };
is($out->{text}, "set\n", 'stdout event');
is($r->{result}{status}, 'success', 'result: success');
is($r->{result}{output}, "set\n", 'result output');
is($r->{result}{execution_count}, 1, 'execution_count 1');
my $kid = $r->{events}[0]{kernel_id};

$r = $t->execute('/v1/execute', { session => 's1', code => "x + 1" });
is($r->{events}[0]{reused}, JSON::PP::true, 'second cell reuses the kernel');
is($r->{events}[0]{kernel_id}, $kid, 'same kernel id');
is($r->{result}{output}, "42\n", 'state persists; last expression shown');
is($r->{result}{execution_count}, 2, 'execution_count 2');
is($r->{result}{kernel}{kernel_id}, $kid, 'result names the kernel');

# streaming is incremental: the first line arrives before the sleep ends
$r = $t->execute('/v1/execute', { session => 's1',
    code => "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')" });
my @stdout = grep { $_->{type} eq 'stdout' } @{ $r->{events} };
is(join('', map { $_->{text} } @stdout), "first\nsecond\n", 'both lines streamed');
my ($i1) = grep { ($r->{events}[$_]{text} // '') eq "first\n" } 0 .. $#{ $r->{events} };
my $t_first = $r->{times}[$i1];
my $t_result = $r->{times}[-1];
ok($t_result - $t_first > 0.8,
    sprintf('first line %.3fs before the result', $t_result - $t_first));

# errors: status, the exception's last line, the traceback after the marker
$r = $t->execute('/v1/execute', { session => 's1', code => "print('before')\n1/0" });
is($r->{result}{status}, 'error', 'exception: error');
is($r->{result}{error}, 'ZeroDivisionError: division by zero', 'error line');
like($r->{result}{output}, qr/^before\n\n--- stderr ---\n.*Traceback.*ZeroDivisionError/s,
    'stdout, marker, traceback');
ok((grep { $_->{type} eq 'stderr' } @{ $r->{events} }), 'traceback streamed as stderr');

$r = $t->execute('/v1/execute', { session => 's1', code => "x" });
is($r->{result}{output}, "41\n", 'kernel survives an exception');

# Accept: application/json gives the result object alone
$r = $t->execute('/v1/execute', { session => 's1', code => "print(x * 2)" }, json => 1);
is($r->{status}, 200, 'json answer: 200');
like($r->{headers}{'content-type'}, qr{^application/json}, 'json content type');
is($r->{json}{status}, 'success', 'json answer: result object');
is($r->{json}{output}, "82\n", 'json answer: output');
ok(!exists $r->{json}{type}, 'json answer: no event type');
is($r->{json}{kernel}{reused}, JSON::PP::true, 'json answer: kernel object');

# an OpenAI-style tool call is unwrapped; json answer is the tool message
my $call = { id => 'call_7', type => 'function', function => {
    name => 'execute_code',
    arguments => JSON::PP->new->encode({ session => 's1', code => 'print(x - 1)' }) } };
$r = $t->execute('/v1/execute', $call, json => 1);
is($r->{json}{role}, 'tool', 'tool message role');
is($r->{json}{tool_call_id}, 'call_7', 'tool_call_id');
my $content = JSON::PP->new->decode($r->{json}{content});
is($content->{output}, "40\n", 'tool message content is the result as a string');
$r = $t->execute('/v1/execute', $call);
is($r->{result}{output}, "40\n", 'tool call, streaming');

# reset discards the state
$r = $t->execute('/v1/execute', { session => 's1', code => "'x' in globals()", reset => JSON::PP::true });
is($r->{result}{output}, "False\n", 'reset clears globals');
is($r->{result}{kernel}{state_reset}, JSON::PP::true, 'state_reset reported');
is($r->{result}{kernel}{kernel_id}, $kid, 'reset keeps the kernel');

# sessions are separate kernels
$r = $t->execute('/v1/execute', { session => 's2', code => "'x' in globals()" });
is($r->{result}{output}, "False\n", 'another session, another kernel');
isnt($r->{result}{kernel}{kernel_id}, $kid, 'different kernel id');

# output over hermes_max_output: 40% head, 60% tail, a marker between
$r = $t->execute('/v1/small', { session => 's3',
    code => "print('A' * 2000)\nprint('B' * 2000)" });
my $o = $r->{result}{output};
ok(length($o) <= 1100, 'output capped near hermes_max_output: ' . length $o);
like($o, qr/^A{300,}/, 'head kept');
like($o, qr/B{500,}\n$/, 'tail kept');
like($o, qr/truncated/, 'marker line');
is($r->{result}{stdout_truncated}, JSON::PP::true, 'stdout_truncated');
is($r->{result}{stdout_bytes_total}, 4002, 'stdout_bytes_total');

# the stream is cut exactly at hermes_max_stream, and says so
my $streamed = join '', map { $_->{text} } grep { $_->{type} eq 'stdout' } @{ $r->{events} };
is(length $streamed, 3000, 'stream cut at hermes_max_stream');
ok((grep { $_->{type} eq 'stream_truncated' } @{ $r->{events} }), 'cut reported in the stream');
is($r->{result}{stream_truncated}, JSON::PP::true, 'cut reported in the result');

# SystemExit ends the kernel; the next call gets a fresh one
$r = $t->execute('/v1/execute', { session => 's4', code => "y = 1" });
my $k4 = $r->{result}{kernel}{kernel_id};
my $pid4 = runner_pid($k4);
$r = $t->execute('/v1/execute', { session => 's4', code => "raise SystemExit" });
is($r->{result}{kernel}{ended}, JSON::PP::true, 'SystemExit: kernel.ended');
ok(wait_until(sub { !grep { m{/hermes_rkernel_$k4$} } $t->kroot_dirs }, 5),
    'ended kernel: directory removed');
$r = $t->execute('/v1/execute', { session => 's4', code => "'y' in globals()" });
is($r->{result}{output}, "False\n", 'after SystemExit: fresh state');
isnt($r->{result}{kernel}{kernel_id}, $k4, 'after SystemExit: new kernel');
is($r->{events}[0]{reused}, JSON::PP::false, 'after SystemExit: not reused');

# unicode and a NUL in the output survive the round trip
$r = $t->execute('/v1/execute', { session => 's1', code => "print('h\\u00e9llo \\u2603 a\\x00b')" });
is($r->{result}{output}, "h\x{e9}llo \x{2603} a\x00b\n", 'unicode and NUL in output');

$t->stop;
done_testing;
