#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A worker keeps its verified handles on a local kernel from one cell to
# the next (a pidfd, the kernel dir, cells/, rpc/ and their watches:
# src/ngx_hermes_local_handles.c).  A cell's code, with the kernel's uid,
# changes what they point at between two cells: the kernel dir or cells/
# opened to others, cells/ or rpc/ swapped for directories of its own.
# The next cell is never shipped into a directory that is no longer the
# kernel's, nor a request planted in a swapped rpc/ served; each case
# ends in a clear answer, and the cell after it runs.  A small request
# comes inline (the wake FIFO): so the cells here are large, to be files.

use strict;
use warnings;

use Test::More;
use JSON::PP ();
use Time::HiRes qw(time sleep);

use POSIX ();
use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

# the tool endpoint, which logs every call it gets
my $hitlog = $t->tool_server;

$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 10s;
        hermes_tools echo;
        hermes_tools_pass /tools;

        location = /x { hermes_execute; }
        location /tools {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/;
        }
    }
CONF
$t->run;

my $pad = "\n#" . ('p' x 5000);     # over PIPE_BUF: the request is a file

sub kid { ($_[0]{events} // [{}])->[0]{kernel_id} // '' }
sub dir_of { $t->kroot . "/hermes_rkernel_$_[0]" }
sub hits { -e $hitlog ? scalar(() = do { local $/; open my $f, '<', $hitlog; <$f> } =~ /\n/g) : 0 }

# the kernel dir or cells/ opened to others between two cells: the kernel
# is taken for dead, nothing of the next cell goes into its old dir
for my $c (['.', 0750, 'the kernel dir at 0750'], ['cells', 0755, 'cells/ at 0755']) {
    my ($sub, $mode, $what) = @$c;
    my $s = "mode-" . ($sub eq '.' ? 'dir' : $sub);
    my $r = $t->execute('/x', {session => $s, code => 'x = 1'});
    my $kid = kid($r);
    ok($kid, "$what: a kernel");
    $r = $t->execute('/x', {session => $s, code => 'y = 2'});
    is(kid($r), $kid, "$what: its next cell on the kept handles");
    $r = $t->execute('/x', {session => $s,
        code => sprintf("import os\nos.chmod('%s', 0o%o)", $sub, $mode)});
    is($r->{result}{status}, 'success', "$what: the cell opened it");
    $r = $t->execute('/x', {session => $s, code => "print(globals().get('x'))$pad"});
    isnt(kid($r), $kid, "$what: the kernel is taken for dead");
    is($r->{result}{output}, "None\n", "$what: the cell ran in a new kernel, no state carried");
    my $d = dir_of($kid);
    ok(!grep({ -e "$d/cells/$_" } map { sprintf "cell_%s_%06d%s", @$_ }
             ['req', 4, '.json'], ['out', 4, ''], ['res', 4, '.json']),
       "$what: nothing of the cell in the old dir");
}

# cells/ swapped for a directory of the cell's own (owner-only): the
# module holds the one it verified and does not take the new one for it
{
    my $r = $t->execute('/x', {session => 'swap-cells', code => 'x = 1'});
    my $kid = kid($r);
    my $d = dir_of($kid);
    # after the cell's end, by a thread of it (a cell that swaps cells/
    # while it runs has its result written into the new one, which the
    # module does not read: it ends at its timeout)
    $r = $t->execute('/x', {session => 'swap-cells', code => "import os, threading\n"
        . "def swap():\n    os.rename('cells', 'cells.old')\n    os.mkdir('cells', 0o700)\n"
        . "threading.Timer(0.5, swap).start()"});
    is($r->{result}{status}, 'success', 'cells/ swapped: the cell did it');
    sleep 1;
    $r = $t->execute('/x', {session => 'swap-cells', code => "print(globals().get('x'))$pad"});
    is($r->{status}, 200, 'cells/ swapped: the next cell answers');
    is($r->{result}{status}, 'success', '... and runs');
    isnt(kid($r), $kid, '... in a new kernel: the swapped one is not taken for the kernel');
    ok(!-e "$d/cells/cell_req_000003.json" && !-e "$d/cells.old/cell_req_000003.json",
        '... its request in neither directory');
}

# the wake FIFO replaced by a FIFO of the cell's own, which no one reads:
# the next cells still reach the runner (the worker holds the FIFO it
# verified), the kernel and its state kept
{
    my $r = $t->execute('/x', {session => 'wake', code => 'x = 1'});
    my $kid = kid($r);
    $r = $t->execute('/x', {session => 'wake',
        code => "import os\nos.mkfifo('wake.new', 0o600)\nos.rename('wake.new', 'wake')"});
    is($r->{result}{status}, 'success', 'wake replaced: the cell did it');
    for my $c (['print(x)', 'small'], ["print(x)$pad", 'large (a file)']) {
        $r = $t->execute('/x', {session => 'wake', code => $c->[0]}, timeout => 20);
        is($r->{result}{output}, "1\n", "wake replaced: a $c->[1] request reaches the runner");
        is(kid($r), $kid, '... the same kernel, its state kept');
    }
}

# rpc/ swapped for a directory of the cell's own, a request planted in it
# with the kernel's own token: it is never served, the next cell gets a
# clear answer, and the cell after it calls tools again
{
    my $r = $t->execute('/x', {session => 'swap-rpc',
        code => "import hermes_tools\nprint(hermes_tools.echo(q='first'))"});
    is($r->{result}{status}, 'success', 'rpc/: a tool call works');
    my $hits0 = hits();
    $r = $t->execute('/x', {session => 'swap-rpc', code => <<'PY'});
import os, json, hermes_tools
os.rename('rpc', 'rpc.old')
os.mkdir('rpc', 0o700)
with open('rpc/req_000001', 'w') as f:
    json.dump({"tool": "echo", "args": {"q": "planted"}, "seq": 1,
               "token": hermes_tools._token}, f)
PY
    is($r->{result}{status}, 'success', 'rpc/ swapped: the cell did it, a request planted');
    $r = $t->execute('/x', {session => 'swap-rpc', code => "1 + 1$pad"});
    ok(defined $r->{json} || defined $r->{result}, 'rpc/ swapped: the next cell gets an answer in JSON')
        or diag explain $r;
    is(hits(), $hits0, '... and the planted request was not served');
    unlike(do { local $/; open my $f, '<', $hitlog; <$f> } // '', qr/planted/,
        '... the tool never saw it');
    $r = $t->execute('/x', {session => 'swap-rpc',
        code => "import hermes_tools\nprint(hermes_tools.echo(q='again'))"});
    is($r->{result}{status}, 'success', 'rpc/ swapped: a later cell calls tools again')
        or diag explain $r->{result};
}

# the kernel dir moved away while its runner runs (which writes its files
# by path) and another made at its path, with a reader on its wake FIFO:
# the path no longer names the kernel, so the next cell goes to a new
# kernel and nothing of it reaches the directory made again
{
    my $r = $t->execute('/x', {session => 'moved', code => 'x = 1'});
    my $kid = kid($r);
    $r = $t->execute('/x', {session => 'moved', code => 'y = 2'});
    is(kid($r), $kid, 'dir moved: its second cell on the kept handles');
    my $d = dir_of($kid);
    rename $d, "$d.old" or die "rename: $!";
    mkdir $d, 0700 or die;
    mkdir "$d/$_", 0700 for qw(cells rpc);
    system('mkfifo', '-m', '600', "$d/wake") == 0 or die;
    my $holder = fork // die;
    if (!$holder) {
        open my $w, '+<', "$d/wake";
        sleep 30;
        POSIX::_exit(0);
    }
    sleep 0.2;
    $r = $t->execute('/x', {session => 'moved', code => 'print(globals().get("x"))'}, timeout => 20);
    sysopen my $fifo, "$d/wake", POSIX::O_RDONLY() | POSIX::O_NONBLOCK();
    sysread($fifo, my $sent, 65536) if $fifo;
    opendir my $dh, "$d/cells";
    my @got = grep { !/^\.\.?$/ } readdir $dh;
    push @got, "wake: $sent" if length($sent // '');
    is("@got", '', 'dir moved: nothing shipped into the directory made again');
    is($r->{result}{status}, 'success', 'dir moved: the cell ran')
        or diag explain $r->{result} // $r;
    isnt(kid($r), $kid, '... on a new kernel');
    is($r->{result}{output}, "None\n", '... no state carried');
    kill 'KILL', $holder;
    waitpid $holder, 0;
    system('rm', '-rf', $d, "$d.old");
}

unlike($t->error_log, qr/\[(alert|crit|emerg)\]/, 'no alert in error.log');

done_testing;
