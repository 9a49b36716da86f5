#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A worker that ran a kernel's cell keeps its watches on the kernel's
# cells/ and rpc/ (src/ngx_hermes_local_handles.c).  When another worker
# runs the kernel's cells from then on, their results and tool calls must
# not wake the first one each time: the first event it cannot use quiets
# its watches until a cell of its own runs there again, and then its
# cells (a streamed answer, a tool call) work as before.
#
# Which worker a keep-alive connection is on: each answer names it
# (add_header X-Pid $pid).  How often an idle worker woke: its
# voluntary_ctxt_switches in /proc.

use strict;
use warnings;

use Test::More;
use JSON::PP ();
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $t = Hermes::Test->new(workers => 2);

my $hitlog = $t->tool_server;

$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 10s;
        hermes_tools echo;
        hermes_tools_pass /tools;

        location = /x {
            hermes_execute;
            add_header X-Pid $pid always;
        }
        location /tools {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/;
        }
    }
CONF
$t->run;

my $json = JSON::PP->new->canonical;

# A keep-alive connection: a request in one write (no wait on a delayed
# ACK), an answer with Content-Length or chunked.
sub conn {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0),
                                  Timeout => 30) or die "connect: $!";
    $s->setsockopt(IPPROTO_TCP, TCP_NODELAY, 1);
    return $s;
}

sub cell {
    my ($s, $session, $code, $accept) = @_;
    my $body = $json->encode({ session => $session, code => $code });
    print $s "POST /x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        . "Accept: " . ($accept // 'application/json') . "\r\n"
        . "Content-Length: " . length($body) . "\r\n\r\n$body";
    my ($status, %h) = (0);
    while (defined(my $line = <$s>)) {
        $line =~ s/\r?\n$//;
        last if $line eq '';
        if ($line =~ m{^HTTP/1\.1 (\d+)}) { $status = $1 }
        elsif ($line =~ /^([^:]+):\s*(.*)$/) { $h{lc $1} = $2 }
    }
    my $data = '';
    if (defined $h{'content-length'}) {
        read($s, $data, $h{'content-length'});
    } else {
        while (defined(my $size = <$s>)) {
            $size = hex($size =~ s/\r?\n$//r);
            my $chunk = '';
            read($s, $chunk, $size + 2) if $size;
            last unless $size;
            $data .= substr($chunk, 0, $size);
        }
        <$s>;       # the empty line after the last chunk
    }
    my $res;
    if (($accept // '') eq 'application/x-ndjson') {
        my @ev = map { eval { $json->decode($_) } // {} } split /\n/, $data;
        ($res) = grep { ($_->{type} // '') eq 'result' } @ev;
        $res = { %{ $res // { raw => $data } }, events => \@ev };
    } else {
        $res = eval { $json->decode($data) } // { raw => $data };
    }
    $res->{pid} = $h{'x-pid'};
    $res->{http} = $status;
    return $res;
}

# one keep-alive connection per worker: new ones until both are seen
my %conn;
for (1 .. 64) {
    last if keys %conn == 2;
    my $s = conn();
    my $c = cell($s, 'warm', 'x = 0');
    $conn{$c->{pid}} //= $s if $c->{pid};
}
is(scalar(keys %conn), 2, 'a keep-alive connection on each worker')
    or BAIL_OUT('no connection on each worker');
my ($wa, $wb) = sort keys %conn;

sub wakes {
    my ($pid) = @_;
    open my $f, '<', "/proc/$pid/status" or return -1;
    local $/;
    my ($n) = <$f> =~ /^voluntary_ctxt_switches:\s+(\d+)/m;
    return $n // -1;
}

# A runs the kernel's first cells, with a tool call and a streamed answer:
# its watches on cells/ (with writes) and rpc/ are in place
my $r = cell($conn{$wa}, 'k', "import hermes_tools\nprint(hermes_tools.echo(q='a'))");
is($r->{status}, 'success', 'worker A: a tool call') or diag explain $r;
is($r->{pid}, $wa, '... on worker A');
$r = cell($conn{$wa}, 'k', "print('streamed')", 'application/x-ndjson');
is($r->{output}, "streamed\n", 'worker A: a streamed answer') or diag explain $r;

# then B runs 300 cells of the kernel, tool calls among them
my $n = 300;
my $before = wakes($wa);
my $ok = 0;
for my $i (1 .. $n) {
    my $code = $i % 10 ? 'x = 1' : "import hermes_tools\n_ = hermes_tools.echo(i=$i)";
    my $c = cell($conn{$wb}, 'k', $code);
    $ok++ if ($c->{status} // '') eq 'success' && ($c->{pid} // '') eq $wb;
}
my $woke = wakes($wa) - $before;
is($ok, $n, "worker B: $n cells of the kernel");
ok($woke >= 0 && $woke < 40, "worker A was woken $woke times by them (not once a cell)");

# A's cells of the kernel work again: a streamed answer, a tool call
$r = cell($conn{$wa}, 'k', "import time\nprint('one', flush=True)\ntime.sleep(0.3)\nprint('two')",
          'application/x-ndjson');
is($r->{output}, "one\ntwo\n", 'worker A again: a streamed answer');
my @out = grep { ($_->{type} // '') eq 'stdout' } @{ $r->{events} };
ok(@out >= 2, '... streamed as it ran (' . scalar(@out) . ' stdout events)')
    or diag explain $r->{events};
$r = cell($conn{$wa}, 'k', "import hermes_tools\nprint(hermes_tools.echo(q='again'))");
is($r->{status}, 'success', 'worker A again: a tool call') or diag explain $r;
like($r->{output}, qr/again/, '... answered');

# and now B is the one not woken
$before = wakes($wb);
$ok = 0;
for my $i (1 .. $n) {
    my $c = cell($conn{$wa}, 'k', 'x = 1');
    $ok++ if ($c->{status} // '') eq 'success';
}
$woke = wakes($wb) - $before;
is($ok, $n, "worker A: $n cells");
ok($woke >= 0 && $woke < 40, "worker B was woken $woke times by them");

$t->stop;
done_testing;
