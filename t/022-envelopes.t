#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Agent envelopes (OpenAI tool calls with string or object arguments,
# Anthropic tool_use blocks), errors answered as tool messages, and the
# session taken from hermes_session (a header, a URL capture).

use strict;
use warnings;

use Test::More;

use Hermes::Test;

my $J = JSON::PP->new->canonical;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_max_code 100;
        }

        location = /v1/by-header {
            hermes_execute;
            hermes_session $http_x_session;
        }

        location ~ ^/v1/sessions/(?<s>[^/]+)/execute$ {
            hermes_execute;
            hermes_session $s;
        }
    }
CONF
$t->run;

# OpenAI: arguments as an object, as some clients send them
my $r = $t->execute('/v1/execute', { id => 'call_1', type => 'function',
    function => { name => 'execute_code',
                  arguments => { session => 'e1', code => 'x = 6 * 7; print(x)' } } },
    json => 1);
is($r->{status}, 200, 'openai, object arguments: 200');
is($r->{json}{role}, 'tool', 'a tool message');
is($r->{json}{tool_call_id}, 'call_1', 'its tool_call_id');
my $c = $J->decode($r->{json}{content});
is($c->{output}, "42\n", 'object arguments ran');

# and as a string, on the same kernel
$r = $t->execute('/v1/execute', { id => 'call_2', type => 'function',
    function => { name => 'execute_code',
                  arguments => $J->encode({ session => 'e1', code => 'print(x + 1)' }) } },
    json => 1);
is($J->decode($r->{json}{content})->{output}, "43\n", 'string arguments, same kernel');

# Anthropic: a tool_use block, answered with a tool_result block
$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_01', name => 'execute_code',
    input => { session => 'e1', code => 'print(x * 2)' } }, json => 1);
is($r->{status}, 200, 'anthropic: 200');
is($r->{json}{type}, 'tool_result', 'a tool_result block');
is($r->{json}{tool_use_id}, 'toolu_01', 'its tool_use_id');
is($r->{json}{is_error}, JSON::PP::false, 'not an error');
$c = $J->decode($r->{json}{content});
is($c->{output}, "84\n", 'the result as a JSON string');
is($c->{kernel}{reused}, JSON::PP::true, 'the same kernel as the OpenAI calls');

$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_02', name => 'execute_code',
    input => { session => 'e1', code => '1/0' } }, json => 1);
is($r->{json}{is_error}, JSON::PP::true, 'a failing cell: is_error');
is($J->decode($r->{json}{content})->{status}, 'error', 'its status');

# the block streams like any request without Accept: application/json
$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_03', name => 'execute_code',
    input => { session => 'e1', code => 'print("streamed")' } });
is($r->{result}{output}, "streamed\n", 'anthropic, streamed');

# errors of an envelope with a JSON answer: a tool message the model reads
$r = $t->execute('/v1/execute', { id => 'call_3', type => 'function',
    function => { name => 'execute_code', arguments => { session => 'e1' } } }, json => 1);
is($r->{status}, 200, 'openai error: 200');
is($r->{json}{tool_call_id}, 'call_3', 'openai error: the call id');
$c = $J->decode($r->{json}{content});
is($c->{error}{code}, 'invalid_request', 'openai error: the code, in the content');
like($c->{error}{message}, qr/"code" is required/, 'openai error: the message');

$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_04', name => 'execute_code',
    input => { session => 'bad session!', code => '1' } }, json => 1);
is($r->{status}, 200, 'anthropic error: 200');
is($r->{json}{is_error}, JSON::PP::true, 'anthropic error: is_error');
is($J->decode($r->{json}{content})->{error}{code}, 'invalid_session',
    'anthropic error: the code');

$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_05', name => 'execute_code',
    input => { session => 'e1', code => 'x' x 200 } }, json => 1);
is($J->decode($r->{json}{content})->{error}{code}, 'code_too_large',
    'code over hermes_max_code: a tool message too');

# without Accept: application/json an envelope's error is an HTTP error
$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_06', name => 'execute_code',
    input => { session => 'e1' } });
is($r->{status}, 400, 'streaming envelope error: 400');
is($r->{json}{error}{code}, 'invalid_request', 'streaming envelope error: JSON error');

# envelopes that are not ours are refused
$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_07', name => 'web_search',
    input => { session => 'e1', code => '1' } });
is($r->{status}, 400, 'tool_use of another tool: 400');
$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_08', name => 'execute_code',
    input => 'print(1)' });
is($r->{status}, 400, 'tool_use whose input is not an object: 400');
$r = $t->execute('/v1/execute', { id => 'call_4', type => 'function',
    function => { name => 'execute_code', arguments => [1] } });
is($r->{status}, 400, 'arguments neither a string nor an object: 400');

# an envelope without a session: a one-shot kernel (t/023-oneshot.t)
$r = $t->execute('/v1/execute', { type => 'tool_use', id => 'toolu_10', name => 'execute_code',
    input => { code => 'print("once")' } }, json => 1);
is($J->decode($r->{json}{content})->{output}, "once\n", 'no session: runs once');

# hermes_session from a header
$r = $t->execute('/v1/by-header', { code => 'y = 5; print(y)' },
    headers => { 'X-Session' => 'hs1' });
is($r->{status}, 200, 'session from a header: 200');
is($r->{events}[0]{session}, 'hs1', 'the kernel line names it');
$r = $t->execute('/v1/by-header', { session => 'hs1', code => 'print(y)' },
    headers => { 'X-Session' => 'hs1' });
is($r->{result}{output}, "5\n", 'the body may name the same session');
$r = $t->execute('/v1/by-header', { session => 'other', code => 'print(y)' },
    headers => { 'X-Session' => 'hs1' });
is($r->{status}, 400, 'the body names another session: 400');
is($r->{json}{error}{code}, 'session_mismatch', 'session_mismatch');
$r = $t->execute('/v1/by-header', { code => '1' });
is($r->{status}, 400, 'no header: 400');
is($r->{json}{error}{code}, 'invalid_session', 'no header: invalid_session');
$r = $t->execute('/v1/by-header', { code => '1' }, headers => { 'X-Session' => 'a/b' });
is($r->{json}{error}{code}, 'invalid_session', 'a bad header: invalid_session');

# hermes_session from a URL capture; the same session as by header
$r = $t->execute('/v1/sessions/hs1/execute', { code => 'print(y * 2)' });
is($r->{result}{output}, "10\n", 'session from the URL: the same kernel');
$r = $t->execute('/v1/sessions/hs1/execute', { type => 'tool_use', id => 'toolu_09',
    name => 'execute_code', input => { code => 'print(y * 3)' } }, json => 1);
is($J->decode($r->{json}{content})->{output}, "15\n", 'an envelope without a session, URL names it');

$t->stop;

done_testing;
