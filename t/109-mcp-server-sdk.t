#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# hermes_mcp judged by software nobody here wrote (from npm: make
# npm-deps): the official conformance suite in server mode, every
# scenario that applies to a server with its own tools; and the official
# TypeScript SDK's client calling execute_code on both backends (state
# within an MCP session, none across two, progress while a cell prints,
# isError on an exception, DELETE at the end).

use strict;
use warnings;

use Test::More;
use JSON::PP;
use File::Temp ();

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $missing = Hermes::Test::node_missing();
plan skip_all => $missing if $missing;

my $root = Hermes::Test::repo_root();
my $node = Hermes::Test::node_bin();
my $npm = Hermes::Test::npm_modules();
my $suite = "$npm/\@modelcontextprotocol/conformance/dist/index.js";

my $t = Hermes::Test->new(workers => 2);
my $p = $t->prefix;

my $no_ssh = Hermes::Sshd->unavailable;
my ($s, $ssh_loc) = (undef, '');
unless ($no_ssh) {
    $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
    $s->start;
    mkdir "$p/kroot/ssh", 0711;
    $ssh_loc = <<"LOC";
        location = /mcp-ssh {
            hermes_mcp;
            hermes_backend ssh host=127.0.0.1:${\ $s->port } root=%%KROOT%%/ssh
                user=root identity=${\ $s->identity }
                known_hosts=${\ $s->known_hosts } connect_timeout=3s;
        }
LOC
}

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 60s;

        location = /mcp { hermes_mcp; }
$ssh_loc
        location /kernels { hermes_kernels; }
    }
CONF
$t->run;

my $base = 'http://127.0.0.1:' . $t->port(0);

# the conformance suite, server mode: each scenario's checks.json
my %scenarios = (
    'server-initialize'           => ['server-initialize'],
    'ping'                        => ['ping'],
    'tools-list'                  => ['tools-list'],
    'logging-set-level'           => ['logging-set-level'],
    'server-sse-multiple-streams' => ['server-accepts-multiple-post-streams'],
    'dns-rebinding-protection'    => ['localhost-host-rebinding-rejected',
                                      'localhost-host-valid-accepted'],
);

for my $name (sort keys %scenarios) {
    subtest "conformance $name" => sub {
        my $dir = File::Temp::tempdir('conformance-XXXXXXXX', TMPDIR => 1,
                                      CLEANUP => 1);
        my $out = `timeout 120 '$node' '$suite' server --url '$base/mcp' --scenario '$name' -o '$dir' 2>&1`;
        my $rc = $? >> 8;
        my ($file) = glob("$dir/*/checks.json");
        my $checks = $file && eval {
            open my $fh, '<', $file or die;
            local $/;
            decode_json(<$fh>);
        };
        ok($checks, "$name: the suite wrote its checks") or do {
            diag $out;
            return;
        };
        my @failed = grep { $_->{status} =~ /FAILURE|WARNING/ } @$checks;
        is(scalar @failed, 0, "$name: no check failed or warned")
            or diag explain \@failed;
        for my $id (@{ $scenarios{$name} }) {
            my ($c) = grep { $_->{id} eq $id } @$checks;
            is($c && $c->{status}, 'SUCCESS', "$name: $id");
        }
        is($rc, 0, "$name: the suite passed") or diag $out;
    };
}

# the TypeScript SDK's client, on each backend
my @backends = ('/mcp');
push @backends, '/mcp-ssh' unless $no_ssh;

for my $loc (@backends) {
    subtest "SDK client on $loc" => sub {
        my $out = `timeout 120 '$node' '$root/t/lib/mcp-sdk-client.cjs' '$npm' '$base$loc' 2>&1`;
        my ($line) = grep { /^\{/ } split /\n/, $out;
        my $r = $line && eval { decode_json($line) };
        ok($r && !$r->{failed}, "$loc: the client ran") or do {
            diag $out;
            return;
        };
        is($r->{server}{name}, 'ngx_hermes', "$loc: serverInfo");
        is_deeply($r->{tools},
                  [qw(download_file execute_code interrupt list_kernels
                      reset_session upload_file)],
                  "$loc: tools");
        isnt($r->{sessions}[0], $r->{sessions}[1], "$loc: two MCP sessions");
        is($r->{same}, "42\n", "$loc: state kept within one MCP session");
        is($r->{other}, "False\n", "$loc: none across two");
        ok(@{ $r->{progress} } >= 1, "$loc: progress while the cell prints")
            or diag $out;
        like(join('', map { $_->{message} // '' } @{ $r->{progress} }),
             qr/tick 0/, "$loc: progress carries the output");
        like($r->{printed}, qr/tick 0\ntick 1\ntick 2\n/, "$loc: the output");
        ok($r->{error}{isError}, "$loc: isError on an exception");
        like($r->{error}{text}, qr/ZeroDivisionError/, "$loc: ... named");
        is($r->{structured}{status}, 'success', "$loc: structuredContent");
        is($r->{structured}{output}, "41\n", "$loc: ... the result object");

        # the DELETE ended the first session's kernel, not the second's
        my %k = map { $_->{session} => 1 }
                @{ $t->http('GET', '/kernels')->{json}{kernels} || [] };
        ok($k{"mcp-$r->{sessions}[1]"}, "$loc: the second session's kernel is there");
        ok(!$k{"mcp-$r->{sessions}[0]"}, "$loc: DELETE ended the first's");
    };
}

$t->check_error_log;
done_testing;
