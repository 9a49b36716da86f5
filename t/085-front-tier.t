#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# More than one gateway: a front tier of plain nginx hashes the session
# (from the URL, by a map) over two gateways, which read it with
# hermes_session.  Sessions stick to one gateway, spread over both, and
# keep their kernels across a reload of the front.  The kernels routes of
# a session (GET, interrupt, files, a cell's stream again, DELETE) reach
# the gateway that holds it, as its cells do.

use strict;
use warnings;

use Test::More;

use Hermes::Test;

my $J = JSON::PP->new;

my @gw;
for my $n (1, 2) {
    my $g = Hermes::Test->new(workers => 1);
    $g->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location ~ ^/v1/sessions/(?<s>[^/]+)/execute$ {
            hermes_execute;
            hermes_session $s;
        }

        location /v1/kernels {
            hermes_kernels;
            client_max_body_size 100m;
        }
    }
CONF
    $g->run;
    push @gw, $g;
}

my ($p1, $p2) = map { $_->port(0) } @gw;

my $front = Hermes::Test->new(workers => 1, no_module => 1);
$front->write_conf(<<"CONF");
    map \$uri \$hermes_front_session {
        ~^/v1/sessions/(?<s>[^/]+)/   \$s;
        ~^/v1/kernels/(?<s>[^/]+)     \$s;
        default                        "";
    }

    upstream gateways {
        hash \$hermes_front_session consistent;
        server 127.0.0.1:$p1;
        server 127.0.0.1:$p2;
        keepalive 8;
    }

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location /v1/sessions/ {
            proxy_pass http://gateways;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }

        location /v1/kernels/ {
            proxy_pass http://gateways;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
            client_max_body_size 100m;
        }
    }
CONF
$front->run;

my @sessions = map { "fs$_" } 1 .. 16;

# each session's first cell, through the front
for my $i (0 .. $#sessions) {
    my $s = $sessions[$i];
    my $r = $front->execute("/v1/sessions/$s/execute", { code => "n = $i" });
    is($r->{status}, 200, "$s: first cell through the front");
}

# where each session's kernel is: exactly one gateway lists it
my %home;
for my $n (0, 1) {
    my $r = $gw[$n]->http(GET => '/v1/kernels');
    for my $k (@{ $J->decode($r->{content})->{kernels} }) {
        $home{$k->{session}}{$n}++;
    }
}
is(scalar(grep { keys %{ $home{$_} || {} } == 1 } @sessions), scalar @sessions,
    'every session has its kernel on exactly one gateway');
my %on = (0 => 0, 1 => 0);
$on{ (keys %{ $home{$_} })[0] }++ for grep { $home{$_} } @sessions;
ok($on{0} > 0 && $on{1} > 0, "sessions spread over both gateways ($on{0} + $on{1})");

# the next cells find their state: they went to the same gateway
my $sticky = 0;
for my $i (0 .. $#sessions) {
    my $r = $front->execute("/v1/sessions/$sessions[$i]/execute", { code => 'print(n)' });
    $sticky++ if ($r->{result}{output} // '') eq "$i\n"
        && $r->{events}[0]{reused};
}
is($sticky, scalar @sessions, 'every session sticks to its gateway');

# a reload of the front changes nothing for them
ok($front->reload, 'front reloaded');
$sticky = 0;
for my $i (0 .. $#sessions) {
    my $r = $front->execute("/v1/sessions/$sessions[$i]/execute", { code => 'print(n * 2)' });
    $sticky++ if ($r->{result}{output} // '') eq ($i * 2) . "\n";
}
is($sticky, scalar @sessions, 'after the reload of the front, every session still has its state');

# the kernels routes of each session reach the gateway that holds it (the
# other gateway has no kernel for it: it would answer 404)
my ($get, $put, $read, $resume) = (0, 0, 0, 0);
for my $i (0 .. $#sessions) {
    my $s = $sessions[$i];
    my $r = $front->http(GET => "/v1/kernels/$s");
    $get++ if $r->{status} == 200 && ($r->{json}{session} // '') eq $s;
    $r = $front->http(PUT => "/v1/kernels/$s/files/in.txt", body => "file of $s");
    $put++ if $r->{status} == 204;
    $r = $front->http(GET => "/v1/kernels/$s/files/in.txt");
    $read++ if $r->{status} == 200 && $r->{content} eq "file of $s";
    $r = $front->execute("/v1/sessions/$s/execute", { code => 'print(open("in.txt").read())' });
    my $cell = $r->{events}[0]{cell};
    $r = $front->raw_request('GET', "/v1/kernels/$s/cells/$cell?offset=0");
    $resume++ if $r->{status} == 200 && $r->{raw} =~ /"file of \Q$s\E\\n"/;
}
is($get, scalar @sessions, 'GET /v1/kernels/SESSION through the front: every session\'s kernel');
is($put, scalar @sessions, 'PUT files/PATH through the front: 204 for every session');
is($read, scalar @sessions, 'GET files/PATH through the front: every file back');
is($resume, scalar @sessions, 'a cell\'s stream again (cells/ID?offset=0) through the front');

# interrupt: the running cell of a session, on its gateway
my $s = $sessions[0];
my $running = $front->execute_async("/v1/sessions/$s/execute",
    { code => "import time\nfor i in range(300):\n    time.sleep(0.1)" });
ok(wait_until(sub {
    ($front->http(GET => "/v1/kernels/$s")->{json}{state} // '') eq 'running' }, 10),
    'the long cell runs');
my $r = $front->http(POST => "/v1/kernels/$s/interrupt");
is($r->{status}, 202, 'POST interrupt through the front: 202');
is($running->wait->{result}{status}, 'interrupted', 'the cell was interrupted');
is($front->execute("/v1/sessions/$s/execute", { code => 'print(n)' })->{result}{output},
    "0\n", 'the kernel kept its state');

# DELETE: the session's kernel on its gateway goes
$r = $front->http(DELETE => "/v1/kernels/$s");
is($r->{status}, 204, 'DELETE through the front: 204');
is($front->http(GET => "/v1/kernels/$s")->{status}, 404, 'then GET: 404');
$r = $front->execute("/v1/sessions/$s/execute", { code => 'print(1)' });
is($r->{events}[0]{lost_reason}, 'deleted', 'its next cell hears lost_reason deleted: same gateway');

$front->stop;
$_->stop for @gw;

done_testing;
