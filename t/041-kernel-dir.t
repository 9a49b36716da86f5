#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The kernel directory is the gateway's own or nothing starts: a co-tenant
# who reads a kernel directory's name (from ps) and makes it first, as the
# same user or another, or as a symlink, never gets a runner started in it;
# the spawn picks another id and leaves the planted path alone.  A kernels
# root that others can write without the sticky bit is refused.
#
# The co-tenant acts through the test sshd's hook, which runs just before
# each command the module sends: it sees the directory step's command line
# (as ps would) and makes the directory before the step runs.  Both
# backends run the same spawn steps.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;
plan skip_all => 'needs root (a co-tenant of another uid)' if $> != 0;

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5), record => 1);

# a root shared by every user, as /tmp is: sticky, world-writable
my $shared = "$p/shared";
mkdir $shared or die;
chmod 01777, $shared;

# a root anyone may write and rename in
my $open = "$p/open";
mkdir $open or die;
chmod 0755, $open;      # nginx -t refuses 0777; it changes after the start

my $marker = "$p/pwned";
my $mode = "$p/attack";

# The co-tenant: plants the kernel dir named on the command line before
# the command runs.  $mode holds how: same (the gateway's uid), nobody
# (another uid, a world-writable dir), symlink (to a dir of its own);
# "always" plants every name it sees, otherwise only the first.
my $hook = $s->hook_file;
open my $fh, '>', $hook or die;
print $fh <<"HOOK";
#!/usr/bin/perl
use strict;
my \$c = \$ENV{SSH_ORIGINAL_COMMAND} // '';
exit 0 unless \$c =~ m{^sh -c SCRIPT hermes dir (\\S+) ([0-9a-f]{32}) };
my \$d = "\$1/hermes_rkernel_\$2";
open my \$m, '<', '$mode' or exit 0;
my \$how = <\$m> // ''; chomp \$how;
exit 0 if \$how eq '' || -e \$d || -l \$d;
my \$always = \$how =~ s/^always-//;
if (!\$always) { open my \$w, '>', '$mode' or die; close \$w }
my \$bait = <<'PY';
open('$marker', 'a').write('imported\\n')
PY
if (\$how eq 'symlink') {
    mkdir "\$d.bait", 0700; symlink "\$d.bait", \$d;
    open my \$f, '>', "\$d.bait/ast.py"; print \$f \$bait; close \$f;
    open my \$l, '>>', '$p/planted'; print \$l "\$d\\n"; close \$l;
    exit 0;
}
mkdir \$d, 0700 or exit 0;
for my \$n (qw(ast.py json.py os.py)) {
    open my \$f, '>', "\$d/\$n"; print \$f \$bait; close \$f;
}
mkdir "\$d/cells", 0700; mkdir "\$d/rpc", 0700;
if (\$how eq 'nobody') {
    my (\$uid, \$gid) = (getpwnam('nobody'))[2, 3];
    chmod 0777, \$d;
    chown \$uid, \$gid, \$d, "\$d/cells", "\$d/rpc", map { "\$d/\$_" } qw(ast.py json.py os.py);
}
open my \$l, '>>', '$p/planted'; print \$l "\$d\\n"; close \$l;
HOOK
close $fh;
chmod 0700, $hook;

$s->start;

my $common = "user=root identity=${\ $s->identity } known_hosts=${\ $s->known_hosts }"
    . " connect_timeout=3s";
$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 20s;

        location = /ssh {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:${\ $s->port } root=$shared $common;
        }

        location = /local {
            hermes_execute;
            hermes_backend local root=$shared;
        }

        location = /open {
            hermes_execute;
            hermes_backend local root=$open;
        }
    }
CONF
$t->run;
chmod 0777, $open;

sub attack {
    my ($how) = @_;
    open my $m, '>', $mode or die;
    print $m "$how\n";
    close $m;
    unlink "$p/planted";
}

sub planted {
    open my $f, '<', "$p/planted" or return ();
    chomp(my @d = <$f>);
    return @d;
}

for my $how (qw(same nobody symlink)) {
    attack($how);
    unlink $marker;

    my $r = $t->execute('/ssh', {session => "race-$how",
        code => "import ast, json, os\nprint('ran in', os.getcwd())"});

    is($r->{status}, 200, "$how: the spawn goes on") or diag explain $r;
    is($r->{result}{status}, 'success', "$how: the cell ran");
    my @p = planted();
    is(scalar @p, 1, "$how: the co-tenant planted the directory first");
    my $kid = $r->{events}[0]{kernel_id} // '';
    ok($kid && !grep(/\Q$kid\E$/, @p), "$how: the kernel got another id")
        or diag "kernel $kid, planted @p";
    like($r->{result}{output}, qr{ran in \Q$shared\E/hermes_rkernel_\Q$kid\E$}m,
        "$how: the runner runs in its own directory");
    ok(!-e $marker, "$how: nothing planted was imported");
    ok(-e $p[0] || -l $p[0], "$how: the planted path is left alone") if @p;
    if ($how eq 'same' && @p) {
        ok(-e "$p[0]/ast.py", "$how: the planted files are left alone");
    }
}

like($t->error_log, qr/kernel directory "[^"]*hermes_rkernel_\w+" exists, made by someone else; picking another id/,
    'error.log says a planted directory was skipped');

# a co-tenant who plants every name: the spawn gives up, clearly, and
# removes nothing of theirs
{
    attack('always-nobody');
    my $r = $t->execute('/ssh', {session => 'race-always', code => 'print(1)'});
    is($r->{status}, 502, 'planted every time: 502');
    is($r->{json}{error}{code}, 'spawn_failed', '... spawn_failed');
    my @p = planted();
    is(scalar @p, 5, '... after five names');
    is(scalar(grep { -d $_ } @p), 5, '... every planted directory left alone');
    like($t->error_log, qr/5 kernel directories in a row existed already/,
        '... and error.log says why');
    attack('');
}

# the local backend, same root, no co-tenant: it works in a sticky root
{
    my $r = $t->execute('/local', {session => 'plain', code => 'print(2)'});
    is($r->{result}{status}, 'success', 'local backend in a sticky shared root');
}

# a root that others may write without the sticky bit: refused, nothing made
{
    my $r = $t->execute('/open', {session => 'open', code => 'print(3)'});
    is($r->{status}, 502, 'world-writable root without the sticky bit: 502');
    is($r->{json}{error}{code}, 'spawn_failed', '... spawn_failed');
    opendir my $dh, $open or die;
    my @made = grep { !/^\.\.?$/ } readdir $dh;
    is_deeply(\@made, [], '... and nothing made in it');
    like($t->error_log,
        qr/\[error\].*the kernels root \Q$open\E is writable by others without the sticky bit/,
        '... error.log names the root and why');
}

$t->stop;
$s->stop;

done_testing;
