#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Every kernel in its own sandbox (hermes_sandbox bwrap, the default):
# written from the side of a cell of owner mallory that goes after the
# kernels of owner alice on the same kernel host, as the same unix user.
# It cannot list, read, write or signal them, /proc shows its own
# processes only; killing a kernel ends every process it started, however
# it left the group; limits hold; kernels never run as root.

use strict;
use warnings;

use Test::More;
use JSON::PP ();
use Time::HiRes qw(time sleep);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

plan skip_all => 'bwrap not installed (Debian package bubblewrap)'
    unless -x '/usr/bin/bwrap';

my $t = Hermes::Test->new(workers => 1);
my $kroot = $t->kroot;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 20s;

        location = /x {
            hermes_execute;
            hermes_owner $http_x_owner;
        }

        location = /tight {
            hermes_execute;
            hermes_sandbox bwrap memory=256m pids=64 net=off;
            hermes_cell_timeout 5s;
        }

        location = /off {
            hermes_execute;
            hermes_sandbox off;
        }

        location = /small {
            hermes_execute;
            hermes_sandbox bwrap tmp=16m;
        }

        location = /cpu {
            hermes_execute;
            hermes_sandbox bwrap cpu=20;
        }

        location = /ro {
            hermes_execute;
            hermes_sandbox bwrap user=nobody "ro=%%PREFIX%%/sha red";
        }
    }
CONF
# what ro= shows the kernel, by a name with a blank
mkdir $t->prefix . '/sha red', 0755 or die;
{
    open my $f, '>', $t->prefix . '/sha red/hello' or die;
    print $f "hello\n";
    close $f;
    chmod 0644, $t->prefix . '/sha red/hello';
}
$t->run;

sub run_as {
    my ($owner, $session, $code, %o) = @_;
    return $t->execute($o{loc} // '/x', {session => $session, code => $code},
        headers => {'X-Owner' => $owner});
}

my $r = run_as('alice', 'a', "secret = 'alice-secret'\nopen('notes', 'w').write('alice notes')");
is($r->{result}{status}, 'success', 'alice has a kernel');
my $alice = $r->{events}[0]{kernel_id};
my $adir = "$kroot/hermes_rkernel_$alice";
my $apid = runner_pid($alice);
ok($apid, 'her runner runs');

$r = run_as('mallory', 'm', 'import os');
my $mallory = $r->{events}[0]{kernel_id};
my $mpid = runner_pid($mallory);

# what mallory's cell tries, given everything a co-tenant could learn
my $attack = <<"PY";
import os, json, glob, signal
out = {}
root = os.path.dirname(os.getcwd())
try:
    out['root'] = sorted(os.listdir(root))
except OSError as e:
    out['root'] = [type(e).__name__]
out['alice_dir'] = os.path.exists('$adir')
for name, f in (('read', lambda: open('$adir/notes').read()),
                ('write', lambda: open('$adir/cells/cell_req_000099.json', 'w').write('{"id":99,"code":"x"}')),
                ('wake', lambda: os.open('$adir/wake', os.O_WRONLY | os.O_NONBLOCK)),
                ('signal', lambda: os.kill($apid, 0)),
                ('environ', lambda: open('/proc/$apid/environ', 'rb').read())):
    try:
        f()
        out[name] = 'allowed'
    except OSError as e:
        out[name] = type(e).__name__
out['procs'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
out['cmdlines'] = [open('/proc/%s/cmdline' % p, 'rb').read().decode(errors='replace')
                   for p in os.listdir('/proc') if p.isdigit()]
out['uid'] = os.getuid()
out['tmp'] = os.listdir('/tmp')
print(json.dumps(out))
PY

$r = run_as('mallory', 'm', $attack);
is($r->{result}{status}, 'success', "mallory's probe ran") or diag $r->{result}{output};
my $o = eval { JSON::PP->new->decode($r->{result}{output}) } // {};
is_deeply($o->{root}, ["hermes_rkernel_$mallory"], 'the kernels root shows its own directory alone');
ok(!$o->{alice_dir}, "alice's directory does not exist for it");
for my $what (qw(read write wake signal environ)) {
    ok(defined $o->{$what} && $o->{$what} ne 'allowed',
        "mallory cannot $what alice's kernel (" . ($o->{$what} // 'not tried') . ')');
}
ok(@{ $o->{procs} || [] } && @{ $o->{procs} } <= 4,
    "/proc shows its own processes only (@{ $o->{procs} || [] })");
ok(!grep(/\Q$alice\E/, @{ $o->{cmdlines} || [] }), "... none of alice's");
ok(!grep(/nginx/, @{ $o->{cmdlines} || [] }), '... not nginx');
# /tmp is a tmpfs of its own: at most the mount point of its directory
my ($first) = $kroot =~ m{^/tmp/([^/]+)};
is_deeply($o->{tmp}, $first ? [$first] : [], '/tmp is its own');

$r = run_as('alice', 'a', 'print(secret, open("notes").read())');
is($r->{result}{output}, "alice-secret alice notes\n", "alice's kernel is untouched");
ok(!-e "$adir/cells/cell_req_000099.json", '... nothing planted in it');

# never root
for my $pid ($apid, $mpid) {
    open my $st, '<', "/proc/$pid/status" or next;
    my ($uid) = map { /^Uid:\s+(\d+)/ ? $1 : () } <$st>;
    isnt($uid, 0, "the runner $pid runs as uid $uid, not root");
}
my @owner = stat $adir;
isnt($owner[4], 0, 'the kernel directory belongs to the kernel user');
is($owner[2] & 07777, 0700, '... mode 0700');

# containment: every way out of the process group ends with the kernel
{
    my $tag = 4000 + int(rand 900);
    my $code = <<"PY";
import os, subprocess, time
subprocess.Popen(['setsid', 'sleep', '$tag.1'])
subprocess.Popen(['sleep', '$tag.2'], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp('sleep', ['sleep', '$tag.3'])
    os._exit(0)
time.sleep(0.5)
print('started', flush=True)
while True:             # the timeout's interrupt does not stop it: killed
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        pass
PY
    $r = $t->execute('/tight', {session => 'escape', code => $code});
    is($r->{result}{status}, 'timeout', 'a cell that hides children times out');
    my @left;
    ok(wait_until(sub { @left = procs_matching(qr/^sleep $tag\.\d$/); !@left }, 5),
        'setsid, start_new_session and double-forked children all died with the kernel')
        or diag "left: @left";
}

# limits
{
    $r = $t->execute('/tight', {session => 'forks', code => <<'PY'});
import os, time
n = 0
try:
    for i in range(200):
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as e:
    print('fork failed after', n, type(e).__name__)
PY
    like($r->{result}{output} // '', qr/fork failed after (\d+)/, 'pids=64: 200 forks do not all succeed');
    my ($n) = ($r->{result}{output} // '') =~ /after (\d+)/;
    ok(defined $n && $n < 64, "... $n succeeded");

    $r = $t->execute('/tight', {session => 'mem',
        code => "b = bytearray(1024 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\nprint('allocated')"});
    unlike($r->{result}{output} // '', qr/allocated/, 'memory=256m: a 1 GiB allocation does not succeed');
    is($r->{result}{status}, 'error', '... the cell ends in an error');

    $r = $t->execute('/tight', {session => 'net',
        code => "import socket\ntry:\n    socket.create_connection(('127.0.0.1', ${\ $t->port(0) }), timeout=2)\n    print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)"});
    like($r->{result}{output} // '', qr/refused/, 'net=off: no connection to the gateway');
    $r = run_as('alice', 'a', "import socket\ns = socket.create_connection(('127.0.0.1', ${\ $t->port(0) }), timeout=2)\ns.close()\nprint('connected')");
    like($r->{result}{output} // '', qr/connected/, 'net=on (the default): it connects');
}

# every writable place but the kernel's own dir is bounded, root or not
# (tmpfs is not counted by RLIMIT_AS): /tmp and /var/tmp share tmp=,
# /dev/shm has tmp= of its own, the sandbox's / and /dev are read-only
{
    $r = $t->execute('/small', {session => 'fill', code => <<'PY'});
import os
def fill(d):
    try:
        f = open(os.path.join(d, "fill" + d.replace("/", "_")), "wb")
    except OSError as e:
        return "ro"
    n = 0
    try:
        while n < 40 << 20:
            n += f.write(b"x" * (1 << 20))
            f.flush()
    except OSError:
        pass
    try:
        f.close()
    except OSError:
        pass
    return n >> 20
for d in ("/tmp", "/var/tmp", "/dev/shm", "/", "/var", "/dev", "/run", "/home"):
    print(d, fill(d))
PY
    my %got = ($r->{result}{output} // '') =~ /^(\S+) (\S+)$/mg;
    is($got{'/tmp'}, 16, 'tmp=16m: /tmp takes 16 MB, no more') or diag $r->{result}{output};
    is($got{'/var/tmp'}, 0, '/var/tmp shares it (it is full)');
    ok(defined $got{'/dev/shm'} && $got{'/dev/shm'} ne 'ro' && $got{'/dev/shm'} <= 16, "/dev/shm takes at most 16 MB ($got{'/dev/shm'})");
    is($got{$_}, 'ro', "$_ is not writable") for qw(/ /var /dev /run /home);
}

# cpu=20: the kernel's cgroup holds a fifth of one CPU (as root, where
# the kernel has cgroups)
SKIP: {
    skip 'cgroups need root', 1 if $> != 0;
    $r = $t->execute('/cpu', {session => 'cpu', code => 'print(1)'});
    my $k = $r->{events}[0]{kernel_id} // '';
    my @q = grep { -e } ("/sys/fs/cgroup/hermes/$k/cpu.max", "/sys/fs/cgroup/cpu/hermes/$k/cpu.cfs_quota_us");
    skip 'no writable cgroup hierarchy here', 1 unless @q;
    my $q = do { local $/; open my $f, '<', $q[0] or die; <$f> };
    like($q, qr/^(?:20000 100000|20000)$/, "cpu=20: the kernel's CPU quota is 20% of one CPU ($q[0])");
}

# ro=PATH: that path, read-only, in the sandbox; user=: the kernel's
# user as root
{
    my $p = $t->prefix . '/sha red';
    $r = $t->execute('/ro', {session => 'ro', code => "import os\n"
        . "print(open('$p/hello').read().strip(), os.getuid())\n"
        . "try:\n    open('$p/new', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n"});
    my $uid = $> == 0 ? scalar getpwnam('nobody') : $>;
    is($r->{result}{output} // '', "hello $uid\nro 30\n",
        'ro= with a blank in its path: readable, read-only; user=nobody: the kernel runs as nobody (as root)')
        or diag explain $r;
}

# off: no namespaces, still not root
{
    $r = $t->execute('/off', {session => 'plain', code => "import os\nprint(os.getuid(), len(os.listdir('/proc')) > 20)"});
    like($r->{result}{output} // '', qr/^[1-9]\d* True$/, 'hermes_sandbox off: the host /proc, a user that is not root');
}

$t->stop;
done_testing;
