#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The module never follows a symlink a cell plants in its kernel dir: a
# cell that makes its own result file a symlink to a file elsewhere
# holding a valid-looking result gets status "error" (an unreadable
# result), never that file's content; a cell_out that is a symlink to a
# file of fake event lines gives the client none of them.

use strict;
use warnings;

use Test::More;
use JSON::PP ();

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 20s;

        location = /x {
            hermes_execute;
        }
    }
CONF
$t->run;

# files outside any kernel dir, readable by the worker
my $fake_res = "$p/fake_res.json";
my $fake_out = "$p/fake_out";
for my $id (1 .. 9) {
    write_file("$fake_res.$id", JSON::PP->new->canonical->encode({
        id => $id, status => 'success', output => "FAKE-RESULT\n",
        error => undef, execution_count => 99, stdout_truncated => JSON::PP::false,
        stdout_bytes_total => 12, stream_truncated => JSON::PP::false,
        state_reset => JSON::PP::false, ended => JSON::PP::false,
        duration_seconds => 0.1 }));
}
write_file($fake_out, join '', map { qq({"type":"stdout","text":"FAKE-OUT $_\\n"}\n) } 1 .. 20);

my $ME = <<'PY';
import glob, os, time
r = sorted(glob.glob('cells/cell_res_*.json'))   # the last cell's: this id - 1
n = int(r[-1].split('_')[-1].split('.')[0]) + 1 if r else 1
def plant(target, name):
    os.symlink(target, 'cells/.plant')
    os.rename('cells/.plant', 'cells/' + name)
PY

# the cell's own result, a symlink to a valid-looking result
{
    my $r = $t->execute('/x', {session => 'res', code => 'x = 1'});
    is(($r->{result} // {})->{status}, 'success', 'res: a kernel');
    $r = $t->execute('/x', {session => 'res', code => $ME
        . "plant('$fake_res.%d' % n, 'cell_res_%06d.json' % n)\n"
        . "time.sleep(2)\nprint('real')"});
    is($r->{status}, 200, 'res: the stream');
    is(($r->{result} // {})->{status}, 'error', 'res: status error')
        or diag explain $r->{result};
    like(($r->{result} // {})->{error} // '', qr/unreadable result/, 'res: an unreadable result');
    unlike($r->{raw} // '', qr/FAKE/, "res: nothing of the symlink's target reaches the client");
    like($t->error_log, qr/unreadable result "cell_res_\d+\.json"/, 'res: error.log says which file');
}

# the next cell's cell_out, a symlink to fake event lines, there when the
# module first looks for it (at once after the cell is shipped).  Old
# files for the runner to remove first keep it from replacing the
# symlink before that.
{
    my $r = $t->execute('/x', {session => 'out', code => $ME
        . "for k in range(6, 230):\n"
        . "    for sfx in ('', '.json', '.tmp', '.json.tmp'):\n"
        . "        open('cells/cell_res_' + '0' * k + sfx, 'w').close()\n"
        . "        open('cells/cell_out_' + '0' * k + sfx, 'w').close()\n"
        . "plant('$fake_out', 'cell_out_%06d' % (n + 1))\n"
        . "print('planted', n)"});
    my ($n) = (($r->{result} // {})->{output} // '') =~ /^planted (\d+)$/;
    ok($n, "out: planted") or diag explain $r->{result};
    ok(-l $t->kroot . "/hermes_rkernel_$r->{events}[0]{kernel_id}/cells/"
        . sprintf('cell_out_%06d', ($n // 0) + 1),
        "out: the next cell's cell_out is a symlink");
    $r = $t->execute('/x', {session => 'out', code => "print('real')"});
    is($r->{status}, 200, 'out: the stream');
    ok($r->{result}, 'out: it ends with a result');
    unlike($r->{raw} // '', qr/FAKE/, "out: no line of the symlink's target reaches the client")
        or diag substr($r->{raw} // '', 0, 600);
    my $text = join '', map { $_->{text} // '' } @{ $r->{events} // [] };
    ok($text eq '' || $text eq "real\n", "out: only the cell's own output, if any")
        or diag $text;
}

$t->stop;
done_testing;

sub write_file {
    my ($f, $content) = @_;
    open my $fh, '>:raw', $f or die "write $f: $!";
    print $fh $content;
    close $fh or die "close $f: $!";
}
