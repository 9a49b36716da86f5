#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Cells that survive the client: the kernel line names the cell; a client
# that lost the stream gets the rest with GET <kernels>/SESSION/cells/ID
# ?offset=N (N: the bytes of the kernel's event lines it got), live while
# the cell runs and from the files once it ended, exactly once; on the
# local and the ssh backend.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

my $J = JSON::PP->new;

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

my $s;
my $ssh = '';
unless (Hermes::Sshd->unavailable) {
    $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
    $s->start;
    $ssh = "host=127.0.0.1:" . $s->port . " known_hosts=" . $s->known_hosts
        . " user=root identity=" . $s->identity . " connect_timeout=3s";
}
mkdir "$p/kroot/ssh", 0711;

my $ssh_loc = $s ? <<"LOC" : '';
        location = /ssh/execute {
            hermes_execute;
            hermes_owner \$http_x_owner;
            hermes_backend ssh $ssh root=%%KROOT%%/ssh;
        }
LOC

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
            hermes_owner \$http_x_owner;
        }
$ssh_loc
        location /v1/kernels {
            hermes_kernels;
            hermes_owner \$http_x_owner;
        }
    }
CONF
$t->run;

my %ALICE = (headers => { 'X-Owner' => 'alice' });

# the bytes of the kernel's own event lines in a (partial) NDJSON body
sub event_bytes {
    my ($raw) = @_;
    my $n = 0;
    for my $line ($raw =~ /([^\n]*\n)/g) {
        my $e = eval { $J->decode($line) } or next;
        next if $e->{type} =~ /^(?:kernel|heartbeat|tool_call|tool_done|result)$/;
        $n += length $line;
    }
    return $n;
}

sub stdout_of { join '', map { $_->{text} } grep { $_->{type} eq 'stdout' } @{ $_[0] } }

sub resume {
    my ($sess, $id, $offset, $owner) = @_;
    my $r = $t->raw_request('GET', "/v1/kernels/$sess/cells/$id" . (defined $offset ? "?offset=$offset" : ''),
        headers => { 'X-Owner' => $owner // 'alice' });
    $r->{result} = $r->{events}[-1] if @{ $r->{events} } && $r->{events}[-1]{type} eq 'result';
    $r->{json} = eval { $J->decode($r->{raw}) } if ($r->{headers}{'content-type'} // '') =~ m{^application/json};
    return $r;
}

my $code = "import time\nfor i in range(8):\n    print('line', i, flush=True)\n    time.sleep(0.25)\nz = 7";
my $whole = join '', map { "line $_\n" } 0 .. 7;

my @backends = (['local', '/v1/execute']);
push @backends, ['ssh', '/ssh/execute'] if $s;

for my $b (@backends) {
    my ($name, $exec) = @$b;
    my $sess = "rs-$name";

    my $r = $t->execute($exec, { session => $sess, code => 'print("warm")' }, %ALICE);
    is($r->{events}[0]{cell}, 1, "$name: the kernel line names the cell");

    # the client leaves after two lines
    my $lines = 0;
    $r = $t->execute($exec, { session => $sess, code => $code }, %ALICE,
        on_event => sub { my ($e) = @_;
            $lines++ if $e->{type} eq 'stdout';
            return $lines == 2 ? ABORT_STREAM : undef });
    ok($r->{aborted}, "$name: the client left mid-cell");
    my $id = $r->{events}[0]{cell};
    is($id, 2, "$name: the second cell");
    my $got = event_bytes($r->{raw});
    my $had = stdout_of($r->{events});
    is($had, "line 0\nline 1\n", "$name: two lines before it left");

    # live: the rest, exactly once, then the result
    $r = resume($sess, $id, $got);
    is($r->{status}, 200, "$name: resume: 200");
    like($r->{headers}{'content-type'}, qr{^application/x-ndjson}, "$name: resume: NDJSON");
    is($had . stdout_of($r->{events}), $whole, "$name: resume: the rest, nothing lost or twice");
    is(($r->{result} // {})->{status}, 'success', "$name: resume: the result last");
    is(($r->{result} // {})->{output}, $whole, "$name: resume: the result's output is the whole");

    # ended: from the files, from any offset
    $r = resume($sess, $id, 0);
    is(stdout_of($r->{events}), $whole, "$name: after the end, from 0: all of it");
    my $res = $r->{result} // {};
    ok(($res->{duration_seconds} // 0) >= 1.5,
        "$name: the result's duration_seconds is the runner's own (the cell ran 2 s)")
        or diag explain $res;
    is($res->{queue_seconds}, 0, "$name: its queue_seconds 0: the resume took no turn");
    is($res->{tool_calls_made}, 0, "$name: its tool_calls_made 0: none were made for it");
    $r = resume($sess, $id);
    is(stdout_of($r->{events}), $whole, "$name: no offset is 0");
    my $all = event_bytes($r->{raw});
    my $first = ($r->{raw} =~ /^([^\n]*\n)/)[0];
    $r = resume($sess, $id, 3);
    is(substr($r->{raw}, 0, length($first) - 3), substr($first, 3),
        "$name: an offset inside a line: the rest of that line first");
    is(stdout_of($r->{events}), substr($whole, length "line 0\n"),
        "$name: then the whole lines after it");
    $r = resume($sess, $id, $all);
    is(stdout_of($r->{events}), '', "$name: from the end: no output");
    is(($r->{result} // {})->{status}, 'success', "$name: from the end: the result");

    # the kernel went on, with its state
    $r = $t->execute($exec, { session => $sess, code => 'print(z)' }, %ALICE);
    is($r->{result}{output}, "7\n", "$name: the kernel kept its state");

    # what there is not
    $r = resume($sess, $id, 0);
    is($r->{status}, 410, "$name: an earlier cell: 410");
    is(($r->{json} // {})->{error}{code}, 'cell_gone', "$name: cell_gone");
    $r = resume($sess, 99, 0);
    is($r->{status}, 404, "$name: a cell to come: 404");
    $r = resume($sess, 3, 0, 'mallory');
    is($r->{status}, 404, "$name: another owner's: 404");
    $r = resume($sess, 3, 'x');
    is($r->{status}, 400, "$name: a bad offset: 400");
    $r = resume($sess, 'abc', 0);
    is($r->{status}, 404, "$name: a bad id: 404");

    # events made once the code was over (its last value) come with the
    # result file, not cell_out: the same stream, live and resumed
    my $v = "'" . ('v' x 30) . "'";
    $r = $t->execute($exec, { session => $sess, code => "'v' * 30" }, %ALICE);
    $id = $r->{events}[0]{cell};
    is(join('|', map { $_->{type} } @{ $r->{events} }), 'kernel|stdout|display|result',
        "$name: last value: its events, then the result");
    is(stdout_of($r->{events}), "$v\n", "$name: last value: its text");
    is(($r->{result} // {})->{output}, "$v\n", "$name: last value: the result's output");
    $all = event_bytes($r->{raw});
    my $live = join '', grep { !/"type":"(?:kernel|result)"/ } $r->{raw} =~ /([^\n]*\n)/g;
    $r = resume($sess, $id, 0);
    is(join('', grep { !/"type":"result"/ } $r->{raw} =~ /([^\n]*\n)/g), $live,
        "$name: last value, resumed from 0: the same lines");
    is(($r->{result} // {})->{output}, "$v\n", "$name: last value, resumed: the result");
    $r = resume($sess, $id, 5);
    is(substr($r->{raw}, 0, length($live) - 5), substr($live, 5),
        "$name: last value, resumed inside a line: the rest of the lines");
    $r = resume($sess, $id, $all);
    is(scalar @{ $r->{events} }, 1, "$name: last value, resumed from the end: the result alone");
    is(($r->{result} // {})->{status}, 'success', "$name: ... the result");
}

$t->stop;
$s->stop if $s;
done_testing;
