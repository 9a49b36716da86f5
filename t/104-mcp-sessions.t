#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# One MCP session per kernel, never shared across owners: a stateful MCP
# server (remember/recall, as a memory or browser server keeps state per
# session) gives each kernel its own state; one owner's kernel never sees
# another's, whichever worker runs the cell; a kernel's session follows it
# from worker to worker.

use strict;
use warnings;

use Test::More;
use JSON::PP;

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $J = JSON::PP->new->canonical;
my $t = Hermes::Test->new(workers => 2);
my $hitlog = $t->mcp_server;

$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        hermes_tools_pass /mcp protocol=mcp;

        location = /x {
            hermes_execute;
            hermes_owner $http_x_owner;
            hermes_tools remember recall;
        }

        location /k {
            hermes_kernels;
            hermes_owner $http_x_owner;
        }

        location /mcp {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/mcp;
            proxy_read_timeout 5s;
        }
    }
CONF
$t->run;

sub hits {
    open my $fh, '<', $hitlog or return [];
    return [map { $J->decode($_) } <$fh>];
}

sub cell {
    my ($owner, $session, $code) = @_;
    return $t->execute('/x', {session => $session, code => $code},
        headers => {'X-Owner' => $owner});
}

my $r = cell('alice', 's', "hermes_tools.remember(x='alice-secret')\nprint(hermes_tools.recall())");
is($r->{result}{output}, "alice-secret\n", 'alice remembers');

# bob, same session name, another owner: another kernel, another session
for my $i (1 .. 4) {
    $r = cell('bob', 's', 'print(hermes_tools.recall())');
    is($r->{result}{output}, "None\n", "bob never sees alice's state (cell $i)");
}

# alice's kernel keeps its session on whichever worker runs its cells
for my $i (1 .. 6) {
    $r = cell('alice', 's', 'print(hermes_tools.recall())');
    is($r->{result}{output}, "alice-secret\n", "alice's state is her kernel's (cell $i)");
}

my %by;
for my $h (@{ hits() }) {
    next unless ($h->{method} // '') eq 'tools/call' && $h->{session};
    $by{$h->{owner}}{$h->{session}}++;
}
is(scalar keys %{ $by{alice} || {} }, 1, "alice's kernel used one MCP session");
is(scalar keys %{ $by{bob} || {} }, 1, "bob's kernel used one of its own");
my ($sa) = keys %{ $by{alice} || {} };
my ($sb) = keys %{ $by{bob} || {} };
ok($sa && $sb && $sa ne $sb, 'never the same session');
my $inits = grep { ($_->{method} // '') eq 'initialize' } @{ hits() };
is($inits, 2, 'one initialize a kernel, whichever worker ran its cells');

# a kernel that ends (here its owner deletes it) ends its MCP session: the
# next call to that server, whoever makes it, sends the DELETE first
my $deletes = sub { [grep { ($_->{method} // '') eq 'DELETE' } @{ hits() }] };
is(scalar @{ $deletes->() }, 0, 'no session ended while its kernel lives');
my $d = $t->http(DELETE => '/k/s', headers => {'X-Owner' => 'alice'});
is($d->{status}, 204, "alice deletes her kernel");
$r = cell('bob', 's', 'print(hermes_tools.recall())');
is($r->{result}{output}, "None\n", 'bob calls the same server');
ok(wait_until(sub { @{ $deletes->() } }, 5), 'a DELETE reaches the server');
my @del = @{ $deletes->() };
is(scalar @del, 1, 'one DELETE');
is($del[0]{session}, $sa, "... of alice's ended kernel's session");
ok($del[0]{known}, '... a session the server knew');
is($del[0]{version}, '2025-06-18', '... with the protocol version');
ok(!defined $del[0]{owner}, "... and nothing of bob's request (no X-Hermes-Owner)");
ok(!$del[0]{length}, '... nor its body');
$r = cell('bob', 's', 'print(hermes_tools.recall())');
is(scalar @{ $deletes->() }, 1, "bob's own session lives on: never ended twice");

# alice's new kernel starts a new session
$r = cell('alice', 's', 'print(hermes_tools.recall())');
is($r->{result}{output}, "None\n", "alice's new kernel: a new session, nothing of the old");
$inits = grep { ($_->{method} // '') eq 'initialize' } @{ hits() };
is($inits, 3, '... made by initialize');

$t->stop;
done_testing;
