#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Bad input gets a clear JSON error and loses nothing.

use strict;
use warnings;

use Test::More;
use MIME::Base64 ();

use Hermes::Test;

my $t = Hermes::Test->new;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        client_max_body_size 4k;

        location = /v1/execute {
            hermes_execute;
            hermes_max_code 100;
            hermes_cell_timeout 30s;
        }

        location = /v1/owned {
            hermes_execute;
            hermes_owner $http_x_owner;
        }

        location = /v1/basic {
            auth_basic "agents";
            auth_basic_user_file %%PREFIX%%/htpasswd;
            hermes_owner $remote_user;
            hermes_execute;
        }

        location = /v1/denied {
            deny all;
            hermes_execute;
        }
    }
CONF
open my $pw, '>', $t->prefix . '/htpasswd' or die;
print $pw "agent:{PLAIN}s3cret\n";
close $pw;
$t->run;

sub error_is {
    my ($r, $status, $code, $name) = @_;
    is($r->{status}, $status, "$name: $status");
    like($r->{headers}{'content-type'} // '', qr{^application/json}, "$name: JSON");
    is($r->{json}{error}{code}, $code, "$name: code $code") if defined $code;
    ok(length($r->{json}{error}{message} // ''), "$name: a message");
}

# a cell running in another session must not notice any of this
my $bg = $t->execute_async('/v1/execute', { session => 'bystander',
    code => "import time\nx = 5\ntime.sleep(2)\nprint('bystander done')" });

error_is($t->execute('/v1/execute', '{"session": "a", "code": '), 400, 'invalid_json', 'truncated JSON');
error_is($t->execute('/v1/execute', 'not json at all'), 400, 'invalid_json', 'not JSON');
error_is($t->execute('/v1/execute', '[1,2]'), 400, 'invalid_json', 'a JSON array');
error_is($t->execute('/v1/execute', '{"session":"a","code":"1"} trailing'), 400, 'invalid_json', 'trailing garbage');
error_is($t->execute('/v1/execute', "{\"session\":\"a\",\"code\":\"\xff\xfe\"}"), 400, 'invalid_json', 'invalid UTF-8');
# no session is a one-shot cell (t/023-oneshot.t), not an error
is($t->execute('/v1/execute', { code => 'print(1)' })->{status}, 200, 'missing session: a one-shot cell');
error_is($t->execute('/v1/execute', { session => 'a' }), 400, 'invalid_request', 'missing code');
error_is($t->execute('/v1/execute', { session => 'a', code => 5 }), 400, 'invalid_request', 'code not a string');
error_is($t->execute('/v1/execute', { session => 'a b', code => '1' }), 400, 'invalid_session', 'session with a space');
error_is($t->execute('/v1/execute', { session => '', code => '1' }), 400, 'invalid_session', 'empty session');
error_is($t->execute('/v1/execute', { session => 'x' x 129, code => '1' }), 400, 'invalid_session', 'session of 129 chars');
error_is($t->execute('/v1/execute', { session => '../etc', code => '1' }), 400, 'invalid_session', 'session with a slash');
# names a kernels URL cannot address (nginx normalises them away)
error_is($t->execute('/v1/execute', { session => '.', code => '1' }), 400, 'invalid_session', 'session "."');
error_is($t->execute('/v1/execute', { session => '..', code => '1' }), 400, 'invalid_session', 'session ".."');
error_is($t->execute('/v1/execute', { session => 'a', code => '1', timeout => 0 }), 400, 'invalid_request', 'timeout 0');
error_is($t->execute('/v1/execute', { session => 'a', code => '1', timeout => 31 }), 400, 'invalid_request', 'timeout over the cap');
error_is($t->execute('/v1/execute', { session => 'a', code => '1', timeout => 'soon' }), 400, 'invalid_request', 'timeout not a number');
error_is($t->execute('/v1/execute', { session => 'a', code => '1', reset => 'yes' }), 400, 'invalid_request', 'reset not a bool');
error_is($t->execute('/v1/execute', { type => 'function', function => { name => 'execute_code', arguments => '{bad' } }),
    400, 'invalid_json', 'tool call with bad arguments');
error_is($t->execute('/v1/execute', { type => 'function', function => { name => 'other', arguments => '{}' } }),
    400, 'invalid_request', 'tool call of another function');
error_is($t->execute('/v1/execute', { session => 'a', code => 'x' x 101 }), 413, 'code_too_large', 'code over hermes_max_code');
error_is($t->execute('/v1/execute', { session => 'a', code => '#' . 'x' x 5000 }), 413, 'body_too_large', 'body over client_max_body_size');

my $r = $t->raw_request('POST', '/v1/execute', body => '{"session":"a","code":"1"}',
    content_type => 'text/plain');
$r->{json} = eval { JSON::PP->new->decode($r->{raw}) };
error_is($r, 415, 'unsupported_media_type', 'text/plain body');

$r = $t->http('GET', '/v1/execute');
error_is($r, 405, 'method_not_allowed', 'GET');
is($r->{headers}{allow}, 'POST', '405 says Allow: POST');

# owner: an empty value is 401; the anonymous default is fine elsewhere
error_is($t->execute('/v1/owned', { session => 'a', code => '1' }), 401, 'unauthorized', 'owner empty');
$r = $t->execute('/v1/owned', { session => 'a', code => 'print(1)' }, headers => { 'X-Owner' => 'alice' });
is($r->{result}{status}, 'success', 'owner set: runs');

# nginx's own refusals on a hermes location: a code of their own
$r = $t->execute('/v1/basic', { session => 'a', code => '1' });
error_is($r, 401, 'unauthorized', 'auth_basic without credentials');
like($r->{json}{error}{message}, qr/needs credentials/, '401: says what is missing');
like($r->{headers}{'www-authenticate'} // '', qr/^Basic realm="agents"/, '401: WWW-Authenticate kept');
error_is($t->execute('/v1/basic', { session => 'a', code => '1' },
    headers => { Authorization => 'Basic ' . MIME::Base64::encode_base64('agent:wrong', '') }),
    401, 'unauthorized', 'auth_basic with a wrong password');
$r = $t->execute('/v1/basic', { session => 'a', code => 'print(1)' },
    headers => { Authorization => 'Basic ' . MIME::Base64::encode_base64('agent:s3cret', '') });
is($r->{result}{status}, 'success', 'auth_basic with the password: runs');
error_is($t->execute('/v1/denied', { session => 'a', code => '1' }), 403, 'forbidden', 'deny all');

# nothing was lost: the bystander finished with its state intact
$r = $bg->wait;
is($r->{result}{status}, 'success', 'bystander cell finished');
is($r->{result}{output}, "bystander done\n", 'bystander output whole');
$r = $t->execute('/v1/execute', { session => 'bystander', code => 'print(x)' });
is($r->{result}{output}, "5\n", 'bystander kernel kept its state');
is(scalar(() = $t->worker_pids), 2, 'both workers still up');

$t->stop;
done_testing;
