#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The MCP client against the official conformance suite
# (@modelcontextprotocol/conformance, from npm: make npm-deps), client
# mode: the suite starts its own test server per scenario and runs
# t/mcp-conformance-client.pl (the real nginx with the module, one cell
# calling the scenario's tools through hermes_tools_pass protocol=mcp);
# each scenario's checks.json must hold no FAILURE and its own checks.
#
#   initialize   the handshake (protocol version, clientInfo)
#   tools_call   tools/call add_numbers reaches the tool
#   sse-retry    the server closes a tools/call's SSE stream before the
#                answer: the client reconnects with GET and Last-Event-ID
#                after the stream's retry: time (2025-11-25 SSE polling)

use strict;
use warnings;

use Test::More;
use JSON::PP;
use File::Temp ();

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $missing = Hermes::Test::node_missing();
plan skip_all => $missing if $missing;

my $root = Hermes::Test::repo_root();
my $node = Hermes::Test::node_bin();
my $suite = Hermes::Test::npm_modules() . '/@modelcontextprotocol/conformance/dist/index.js';
my $client = "$root/t/mcp-conformance-client.pl";

# the checks of one scenario's run, or undef with the run's output
sub scenario {
    my ($name) = @_;
    my $dir = File::Temp::tempdir('conformance-XXXXXXXX', TMPDIR => 1, CLEANUP => 1);
    local $ENV{NODE_OPTIONS} = Hermes::Test::node_loopback_options();
    local $ENV{PERL5LIB} = join ':', "$root/t/lib", grep { defined } $ENV{PERL5LIB};
    my $out = `timeout 120 '$node' '$suite' client --command '$client' --scenario '$name' -o '$dir' 2>&1`;
    my $rc = $? >> 8;
    my ($file) = glob("$dir/*/checks.json");
    my $checks = $file && eval {
        open my $fh, '<', $file or die;
        local $/;
        decode_json(<$fh>);
    };
    return ($checks, $out, $rc);
}

sub check_status {
    my ($checks, $id) = @_;
    my @c = grep { $_->{id} eq $id } @$checks;
    return @c ? $c[-1]{status} : 'ABSENT';
}

my %want = (
    'initialize' => { 'mcp-client-initialization' => ['SUCCESS'] },
    'tools_call' => { 'tool-add-numbers' => ['SUCCESS'] },
    'sse-retry'  => {
        'client-sse-graceful-reconnect' => ['SUCCESS'],
        'client-sse-last-event-id'      => ['SUCCESS'],
        # "slightly late" (within 200 ms past retry:) is the suite's WARNING
        'client-sse-retry-timing'       => ['SUCCESS', 'WARNING'],
    },
);

for my $name ('initialize', 'tools_call', 'sse-retry') {
    subtest $name => sub {
        my ($checks, $out, $rc) = scenario($name);
        ok($checks, "$name: the suite wrote its checks") or do {
            diag $out;
            return;
        };
        my @failed = grep { $_->{status} eq 'FAILURE' } @$checks;
        is(scalar @failed, 0, "$name: no check failed")
            or diag explain \@failed;
        for my $id (sort keys %{ $want{$name} }) {
            my $st = check_status($checks, $id);
            ok((grep { $_ eq $st } @{ $want{$name}{$id} }), "$name: $id is $st")
                or diag explain [grep { $_->{id} eq $id } @$checks];
        }
        is($rc, 0, "$name: the suite passed the run (the client script too)")
            or diag $out;
    };
}

done_testing;
