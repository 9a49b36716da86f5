#!/usr/bin/perl
# Tool calls do not travel over ssh in this release: a cell on an ssh
# kernel finds no tool enabled and its calls fail at once (ToolNotEnabled),
# rather than wait for an answer that cannot come.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time);

use Hermes::Test;
use Hermes::Sshd;

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;
my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
$s->start;
mkdir "$p/kroot/ssh", 0711;

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /x {
            hermes_execute;
            hermes_cell_timeout 60s;
            hermes_tools echo;
            hermes_tools_pass /tools;
            hermes_backend ssh host=127.0.0.1:${\ $s->port } root=%%KROOT%%/ssh
                user=root identity=${\ $s->identity }
                known_hosts=${\ $s->known_hosts } connect_timeout=3s;
        }

        location /tools {
            internal;
            return 200 '{"ok":true}';
        }
    }
CONF
$t->run;

my $t0 = time;
my $r = $t->execute('/x', { session => 'rs1', code =>
    "try:\n    hermes_tools.call('echo', {})\nexcept Exception as e:\n"
  . "    print(type(e).__name__, 'not enabled' in str(e))" });
is($r->{result}{output}, "ToolNotEnabled True\n", 'a tool call over ssh fails at once, saying why');
ok(time - $t0 < 20, sprintf('and does not wait (%.1f s)', time - $t0));
is($r->{result}{tool_calls_made}, 0, 'no call was made');

$t->stop;
$s->stop;
done_testing;
