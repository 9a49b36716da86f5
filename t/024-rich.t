#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Output from anywhere in a cell and rich results, on the local backend
# and over ssh: what a subprocess, os.system or os.write(1, ...) writes
# joins the cell's stream in order with its prints (bytes after the cell
# go to runner.log, a flood is cut at hermes_max_stream); display() and
# the last expression give display events and the result's "displays"
# (a matplotlib figure as image/png when the kernel host has matplotlib,
# a PNG over hermes_max_output replaced by a note); top-level await.

use strict;
use warnings;

use Test::More;
use MIME::Base64 qw(decode_base64);
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $t = Hermes::Test->new;
my $p = $t->prefix;

my $no_ssh = Hermes::Sshd->unavailable;
my ($sshd, $ssh);
if (!$no_ssh) {
    $sshd = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
    $sshd->start;
    $ssh = "hermes_backend ssh host=127.0.0.1:" . $sshd->port
         . " known_hosts=" . $sshd->known_hosts . " user=root identity="
         . $sshd->identity . " root=%%KROOT%% connect_timeout=3s;";
}

my $conf = <<'CONF';
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 60s;

        location = /local/x {
            hermes_execute;
            hermes_max_output 200k;
            hermes_max_stream 100k;
        }

        location = /local/small {
            hermes_execute;
            hermes_max_output 2k;
        }
CONF
$conf .= <<"CONF" if $ssh;

        location = /ssh/x {
            hermes_execute;
            hermes_max_output 200k;
            hermes_max_stream 100k;
            $ssh
        }

        location = /ssh/small {
            hermes_execute;
            hermes_max_output 2k;
            $ssh
        }
CONF
$conf .= "    }\n";
$t->write_conf($conf);
$t->run;

# the kernel host's python3 (the same machine for both backends)
my $has_mpl = system('/usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1') == 0;

my @backends = ('local');
push @backends, 'ssh' if $ssh;
diag "ssh backend not tested: $no_ssh" if $no_ssh;

for my $b (@backends) {
    my $run = sub {
        my ($loc, $code, %o) = @_;
        return $t->execute("/$b/$loc", { session => "rich-$b", code => $code },
                           timeout => 60, %o);
    };
    my $text = sub {
        my ($r, $type) = @_;
        join '', map { $_->{text} } grep { $_->{type} eq $type } @{ $r->{events} };
    };

    # -- output from anywhere, in order with prints

    my $r = $run->('x', <<'PY');
import os, subprocess, sys
print('a')
os.system('echo x')
print('b')
os.write(1, b'w1\n')
print('c')
subprocess.run(['sh', '-c', 'echo e1 >&2'])
print('e2', file=sys.stderr)
subprocess.run([sys.executable, '-c', 'print("child")'])
_ = sys.stdout.write('d\n')
PY
    is($r->{result}{status}, 'success', "$b: the cell ran");
    is($text->($r, 'stdout'), "a\nx\nb\nw1\nc\nchild\nd\n",
        "$b: os.system, os.write(1) and a subprocess in order with prints");
    is($text->($r, 'stderr'), "e1\ne2\n", "$b: a subprocess's stderr in order");
    is($r->{result}{output}, "a\nx\nb\nw1\nc\nchild\nd\n\n--- stderr ---\ne1\ne2\n",
        "$b: and in the result's output");
    is($r->{result}{stdout_bytes_total}, 19, "$b: stdout_bytes_total counts them");
    my $kid = $r->{result}{kernel}{kernel_id};
    my $log = $t->kroot . "/hermes_rkernel_$kid/runner.log";

    # invalid UTF-8 on fd 1 is replaced, as sys.stdout.buffer does
    $r = $run->('x', "import os\n_ = os.write(1, b'\\xff ok\\n')");
    is($r->{result}{output}, "\x{fffd} ok\n", "$b: bytes that are not UTF-8: U+FFFD");

    # a child that outlives its cell: the cell ends, its late bytes go to
    # runner.log, not into the next cell
    my $t0 = time;
    $r = $run->('x', "import subprocess\n"
        . "subprocess.Popen(['sh', '-c', 'sleep 1.5; echo late-$b'])\nprint('end')");
    ok(time - $t0 < 1.4, "$b: a child outliving the cell does not hold its end");
    is($r->{result}{output}, "end\n", "$b: the cell's own output");
    ok(wait_until(sub { (slurp($log) // '') =~ /^late-$b$/m }, 5),
        "$b: bytes after the cell's end go to runner.log");
    $r = $run->('x', "print('next')");
    is($r->{result}{output}, "next\n", "$b: not into the next cell");

    # 300 MB to fd 1: cut at hermes_max_stream, the runner keeps reading
    $t0 = time;
    $r = $run->('x', "import os\nfor i in range(300):\n"
        . "    os.write(1, b'z' * 1000000)\nprint('done')");
    is($r->{result}{status}, 'success', "$b: 300 MB to fd 1: the cell ends");
    is(length $text->($r, 'stdout'), 100 * 1024, "$b: streamed up to hermes_max_stream");
    ok((grep { $_->{type} eq 'stream_truncated' } @{ $r->{events} }),
        "$b: stream_truncated");
    is($r->{result}{stdout_bytes_total}, 300_000_000 + 5, "$b: every byte counted");
    my $out = $r->{result}{output};
    my $i = index($out, "\n... [output truncated: ");
    is($i, 81920, "$b: the output's head: 40% of hermes_max_output");
    is(substr($out, 0, $i) =~ tr/z//, $i, "$b: ... all of it what fd 1 got");
    is(substr($out, -6), "zdone\n", "$b: the tail ends with the print after");
    ok(length $r->{result}{output} < 210_000, "$b: the output within hermes_max_output");
    diag sprintf "%s: 300 MB in %.1f s", $b, time - $t0;

    # -- rich results

    $r = $run->('x', "41 + 1");
    is($r->{result}{output}, "42\n", "$b: the last expression's text in the output");
    is_deeply([grep { $_->{type} eq 'display' } @{ $r->{events} }],
        [{ type => 'display', data => { 'text/plain' => '42' } }],
        "$b: and a display event");
    is_deeply($r->{result}{displays}, [{ 'text/plain' => '42' }],
        "$b: and the result's displays");

    $r = $run->('x', <<'PY');
class H:
    def __repr__(self):
        return 'H()'
    def _repr_html_(self):
        return '<b>hi</b>'
    def _repr_json_(self):
        return {'a': [1, 2]}
    def _repr_markdown_(self):
        return '**hi**'
print('before')
display(H())
print('after')
PY
    my @ev;
    for my $e (grep { $_->{type} =~ /^(?:stdout|display)$/ } @{ $r->{events} }) {
        if ($e->{type} eq 'stdout' && @ev && $ev[-1][0] eq 'stdout') {
            $ev[-1][1] .= $e->{text};       # where events split is timing
        } else {
            push @ev, [$e->{type}, $e->{text} // $e->{data}];
        }
    }
    my $bundle = { 'text/plain' => 'H()', 'text/html' => '<b>hi</b>',
                   'text/markdown' => '**hi**', 'application/json' => { a => [1, 2] } };
    is_deeply(\@ev, [['stdout', "before\nH()\n"], ['display', $bundle],
                     ['stdout', "after\n"]],
        "$b: display(obj): _repr_html_, _repr_json_, _repr_markdown_, in order");
    is_deeply($r->{result}{displays}, [$bundle], "$b: in the result");
    is($r->{result}{output}, "before\nH()\nafter\n", "$b: its text/plain in the output");

    $r = $run->('x', "print(1)", json => 1);
    is_deeply($r->{json}{displays}, [], "$b: no display: displays is []");
    $r = $run->('x', "display('s')", json => 1);
    is_deeply($r->{json}{displays}, [{ 'text/plain' => "'s'" }],
        "$b: displays in the JSON answer");

    # top-level await, on the runner's loop; asyncio.run as in plain Python
    $r = $run->('x', "import asyncio\nawait asyncio.sleep(0.01)\n"
        . "v = await asyncio.sleep(0, 'v')\nprint(v)\nawait asyncio.sleep(0, 7)");
    is($r->{result}{status}, 'success', "$b: top-level await");
    is($r->{result}{output}, "v\n7\n", "$b: ... and an awaited last expression");
    $r = $run->('x', "import asyncio\nasync def f():\n    return 3\nasyncio.run(f())");
    is($r->{result}{output}, "3\n", "$b: asyncio.run in a cell");
    $r = $run->('x', "async def f():\n    return 3\nawait f()\nc = f()\n"
        . "try:\n    asyncio.run(c)\nfinally:\n    c.close()\nprint('no')");
    is($r->{result}{status}, 'error', "$b: asyncio.run inside a running loop fails");
    like($r->{result}{error}, qr/^RuntimeError: asyncio\.run\(\) cannot be called from a running event loop/,
        "$b: ... as in plain Python");

    # matplotlib: a PNG, or (without it on the kernel host) text/plain
    SKIP: {
        skip "$b: matplotlib is not installed for /usr/bin/python3: no PNG to check", 8
            unless $has_mpl;
        $r = $run->('x', "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\n"
            . "plt.show()\nprint('shown')");
        my @d = grep { $_->{type} eq 'display' } @{ $r->{events} };
        is(scalar @d, 1, "$b: plt.show(): one display event");
        like($d[0]{data}{'text/plain'} // '', qr/^<Figure size/, "$b: with text/plain");
        is(substr(decode_base64($d[0]{data}{'image/png'} // ''), 0, 8), "\x89PNG\r\n\x1a\n",
            "$b: and image/png");
        is($r->{result}{displays}[0]{'image/png'}, $d[0]{data}{'image/png'},
            "$b: the PNG in the result too");
        is($r->{result}{output}, "<Figure size 640x480 with 1 Axes>\nshown\n",
            "$b: the figure's text in the output, before what came after");

        $r = $run->('x', "fig, ax = plt.subplots()\nax.plot([1, 2])\nfig");
        my @png = grep { $_->{'image/png'} } @{ $r->{result}{displays} };
        is(scalar @png, 1, "$b: a figure as the last expression: one PNG");

        # over hermes_max_output: a note, never silently dropped
        $r = $t->execute("/$b/small", { session => "small-$b",
            code => "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()" },
            timeout => 60);
        my ($ev) = grep { $_->{type} eq 'display' } @{ $r->{events} };
        ok($ev && $ev->{data}{'image/png'}, "$b: the stream still has the PNG");
        like($r->{result}{displays}[0]{'text/plain'} // '',
            qr/^<Figure size.*\n\[image\/png of \d+ bytes not shown: over hermes_max_output \(2048 bytes\)\]$/,
            "$b: a PNG over hermes_max_output: a note in the result instead");
    }
    unless ($has_mpl) {
        $r = $run->('x', "class Fig:\n    def __repr__(self):\n        return '<Fig>'\ndisplay(Fig())");
        is_deeply($r->{result}{displays}, [{ 'text/plain' => '<Fig>' }],
            "$b: without matplotlib, a text/plain display");
    }
}

# The module passes "displays" on as JSON it parsed and wrote itself: a
# result file a cell planted for its own cell shows what gets through.
my $plant = <<'PY';
import glob, os, time
r = sorted(glob.glob('cells/cell_res_*.json'))   # the last cell's: this id - 1
n = int(r[-1].split('_')[-1].split('.')[0]) + 1 if r else 1
with open('cells/.plant', 'w') as f:
    f.write('{"id":%d,"status":"success","output":"planted\\n","error":null,'
            '"execution_count":1,"displays":%s}' % (n, DISPLAYS))
os.rename('cells/.plant', 'cells/cell_res_%06d.json' % n)
time.sleep(0.5)
PY
my @cases = (
    ['[{"text/plain":"a\\u00e9\\ud83d\\udc0d\\n","application/json":{"k":[1,2.5e3,true,null]}}]',
     [{ 'text/plain' => "a\x{e9}\x{1f40d}\n", 'application/json' => { k => [1, 2.5e3, JSON::PP::true, undef] } }],
     'a bundle passes through, escapes and numbers intact'],
    ['[1]', [], 'an element that is not an object: no displays'],
    ['"text"', [], 'not an array: no displays'],
    ['[{"a":' . ('[' x 40) . (']' x 40) . '}]', [], 'nested too deep: no displays'],
    ['[{"a":' . ('[' x 20) . (']' x 20) . '}]', [{ a => eval('[' x 20 . ']' x 20) }],
     'nested 20 deep: passed'],
    ['[],"displays":[{"x":"y"}]', [], 'displays twice: no displays'],
);
for my $c (@cases) {
    my ($json, $want, $name) = @$c;
    (my $code = $plant) =~ s/DISPLAYS/r'$json'/;
    my $r = $t->execute('/local/x', { session => 'plant', code => $code }, timeout => 20);
    is($r->{result}{output}, "planted\n", "planted result: $name (read)");
    is_deeply($r->{result}{displays}, $want, "planted result: $name");
}

$t->stop;
$sshd->stop if $sshd;
done_testing;

sub slurp {
    open my $fh, '<', $_[0] or return undef;
    local $/;
    return <$fh>;
}
