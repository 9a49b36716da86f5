#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The gateway as a client under the MCP conformance suite (t/105):
#
#   conformance client --command 't/mcp-conformance-client.pl' --scenario S
#
# The suite starts its test server and runs this with the server's URL
# appended (and MCP_CONFORMANCE_SCENARIO=S).  This starts the real nginx
# with the built module, its hermes_tools_pass at that URL with
# protocol=mcp, and runs one cell that calls the scenario's tools through
# the gateway's MCP client; it prints the cell's result and exits 0 when
# the cell ran and error.log is clean (TAP on stdout; the suite judges
# what its server saw).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Hermes::Test;

my $url = $ARGV[-1] // die "usage: $0 URL\n";
my $scenario = $ENV{MCP_CONFORMANCE_SCENARIO} // 'initialize';

# only loopback: the suite says localhost
my ($port, $path) = $url =~ m{^http://(?:localhost|127\.0\.0\.1):(\d+)(/[^?#]*)?$}
    or die "not a local URL: $url\n";
$path //= '/';

# each scenario's calls; a ToolError is printed, not fatal (the
# initialize scenario lists no tool at all)
my %code = (
    'initialize' => 'print(hermes_tools.call("none"))',
    'tools_call' => 'print(hermes_tools.add_numbers(a=5, b=3))',
    'sse-retry'  => 'print(hermes_tools.test_reconnection())',
);
my $code = $code{$scenario} // 'print(hermes_tools.call("none"))';
$code = "try:\n    " . join("\n    ", split /\n/, $code)
      . "\nexcept hermes_tools.ToolError as e:\n    print('ToolError:', e)\n";

my $t = Hermes::Test->new(workers => 1);
$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /x {
            hermes_execute;
            hermes_tools auto;
            hermes_tools_pass /mcp protocol=mcp;
        }

        location = /mcp {
            internal;
            proxy_pass http://127.0.0.1:$port$path;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 10s;
        }
    }
CONF
$t->run;

my $r = $t->execute('/x', {session => 'conformance', code => $code}, json => 1);
is($r->{json}{status}, 'success', "$scenario: the cell ran")
    or diag explain $r;
note('output: ' . ($r->{json}{output} // ''));
$t->stop;

done_testing;
