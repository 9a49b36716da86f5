#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The official reference MCP server, @modelcontextprotocol/server-everything
# (from npm: make npm-deps), in its streamable HTTP mode, as the tool
# server of cells on both backends (local, and ssh to a real sshd): its
# listed tools by their identifiers (get-sum as get_sum), an answer as an
# SSE stream with event ids, progress of a long operation as tool_progress
# lines; two kernels whose calls overlap each get their own answers.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $missing = Hermes::Test::node_missing();
plan skip_all => $missing if $missing;

my $t = Hermes::Test->new(workers => 2);
my $p = $t->prefix;
my $url = $t->everything_server(1);

my $no_ssh = Hermes::Sshd->unavailable;
my ($s, $ssh_loc) = (undef, '');
unless ($no_ssh) {
    $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
    $s->start;
    mkdir "$p/kroot/ssh", 0711;
    $ssh_loc = <<"LOC";
        location = /ssh {
            hermes_execute;
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

        hermes_tools auto;
        hermes_tools_pass /mcp protocol=mcp;
        hermes_cell_timeout 60s;

        location = /local { hermes_execute; }
$ssh_loc
        location = /mcp {
            internal;
            proxy_pass $url;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 30s;
        }
    }
CONF
$t->run;

my $one = <<'PY';
print(hermes_tools.get_sum(a=2, b=3))
print(hermes_tools.echo(message="hello"))
PY

# each kernel's calls at once, two threads: a long operation (progress)
# and echoes that name the kernel; each answer must be the kernel's own
my $overlap = <<'PY';
import threading, time
out, t0 = [], time.monotonic()
def long():
    out.append(hermes_tools.trigger_long_running_operation(duration=2, steps=4))
def echo():
    for i in range(3):
        out.append(hermes_tools.echo(message="%s-%d" % (NAME, i)))
ts = [threading.Thread(target=f) for f in (long, echo)]
for t in ts: t.start()
for t in ts: t.join()
for line in sorted(out): print(line)
print("took %.1f" % (time.monotonic() - t0))
PY

for my $loc ('/local', '/ssh') {
    SKIP: {
        skip "ssh: $no_ssh", 1 if $loc eq '/ssh' && $no_ssh;

        subtest "$loc: server-everything's tools" => sub {
            my $r = $t->execute($loc, {session => "one" . substr($loc, 1), code => $one});
            is($r->{result}{status}, 'success', 'the cell succeeds') or diag explain $r->{result};
            is($r->{result}{output}, "The sum of 2 and 3 is 5.\nEcho: hello\n",
               'get-sum as get_sum, echo: the answers as text');
        };

        subtest "$loc: two kernels' calls overlap" => sub {
            my $t0 = time;
            my @a = map {
                my $name = "k$_";
                $t->execute_async($loc, {session => "ov$_" . substr($loc, 1),
                                         code => "NAME = '$name'\n$overlap"});
            } 1, 2;
            my @r = map { $_->wait } @a;
            my $took = time - $t0;
            for my $i (1, 2) {
                my $r = $r[$i - 1];
                is($r->{result}{status}, 'success', "kernel $i: the cell succeeds")
                    or diag explain $r;
                my $out = $r->{result}{output} // '';
                $out =~ s/^took .*\n//m;
                is($out, "Echo: k$i-0\nEcho: k$i-1\nEcho: k$i-2\n"
                       . "Long running operation completed. Duration: 2 seconds, Steps: 4.\n",
                   "kernel $i: its own answers, none of the other's");
                my @pg = grep { ($_->{type} // '') eq 'tool_progress' } @{ $r->{events} };
                is_deeply([map { $_->{progress} } @pg], [1, 2, 3, 4],
                          "kernel $i: the long operation's progress, in its own stream")
                    or diag explain \@pg;
            }
            # each cell waits 2 s for its long call: run one after the
            # other they would take 4 s and more
            ok($took < 3.9, sprintf('the two cells ran at once (%.1f s)', $took));
        };
    }
}

$t->stop;
done_testing;
