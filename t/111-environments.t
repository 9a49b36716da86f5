#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Environments: each location or request picks the image its kernels run
# in: the host's python with settings of its own, a venv, a Debian trixie
# rootfs made by mmdebstrap (t/lib/make-rootfs.sh, cached under build/).
# The sandbox holds inside an environment; a session keeps its
# environment; nginx -t says what an environment lacks; over ssh a host
# without the rootfs says so.

use strict;
use warnings;

use Test::More;
use POSIX ();
use JSON::PP ();

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my ($rootfs, $no_rootfs) = Hermes::Test::rootfs_trixie();

my $t = Hermes::Test->new;
my $p = $t->prefix;

# a venv with a module only it has
my $venv = "$p/venv";
system('/usr/bin/python3', '-m', 'venv', '--without-pip', $venv) == 0
    or BAIL_OUT("python3 -m venv failed");
my ($site) = glob("$venv/lib/python3*/site-packages");
mkdir "$site/only_in_venv";
open my $fh, '>', "$site/only_in_venv/__init__.py" or die;
print $fh "WHERE = 'venv'\n";
close $fh;

# a canary of the test's own, which no kernel may read
open $fh, '>', "$p/canary.txt" or die;
print $fh "secret\n";
close $fh;
chmod 0644, "$p/canary.txt";

my $trixie_env = $rootfs ? "hermes_environment trixie rootfs=$rootfs env=IMAGE=trixie warm=1;" : '';
my $trixie = $rootfs ? 'trixie' : '';

my $no_ssh = Hermes::Sshd->unavailable;
my ($s, $s2, $ssh_loc) = (undef, undef, '');
unless ($no_ssh) {
    $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
    $s->start;
    if ($rootfs) {
        # a second host that lacks the rootfs (hidden in its sshd's mounts)
        $s2 = Hermes::Sshd->new(dir => "$p/ssh2", port => $t->port(6),
                                hide => [$rootfs]);
        $s->share_with("$p/known_hosts_both", $s2);
        $s2->start;
    }
    mkdir "$p/kroot/ssh", 0711;
    my $backend = "hermes_backend ssh host=127.0.0.1:${\ $s->port } root=%%KROOT%%/ssh "
        . "user=root identity=${\ $s->identity } known_hosts=${\ $s->known_hosts } "
        . "connect_timeout=3s;";
    $ssh_loc = <<"LOC";
        location = /ssh {
            hermes_execute;
            $backend
            hermes_environments hostpy $trixie;
        }
        ${\ ($s2 ? "location = /ssh-two {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:${\ $s2->port } host=127.0.0.1:${\ $s->port }
                user=root identity=${\ $s->identity } known_hosts=$p/known_hosts_both
                root=%%KROOT%%/ssh connect_timeout=3s;
            hermes_environments trixie;
        }" : '') }
        location = /ssh-missing {
            hermes_execute;
            $backend
            hermes_environments nowhere;
        }
LOC
}

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    hermes_environment hostpy python=/usr/bin/python3 env=GREETING=hello env=PAIR=a=b env=T111_SECRET=zq7-env-secret-91;
    hermes_environment venv python=$venv/bin/python3;
    hermes_environment nowhere rootfs=$p/no-such-rootfs;
    $trixie_env

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 30s;

        location = /x {
            hermes_execute;
            hermes_sandbox bwrap net=off;
            hermes_environments hostpy venv $trixie;
        }
        location = /plain { hermes_execute; }
        location /k { hermes_kernels; }
        location = /status { hermes_status; }
        location = /mcp {
            hermes_mcp;
            hermes_sandbox bwrap net=off;
            hermes_environments hostpy $trixie;
        }
$ssh_loc
    }
CONF

# the local location naming a missing rootfs is not here: nginx -t would
# refuse it (below), an ssh one may name paths of its hosts only
$t->run;

sub run_cell {
    my ($loc, $session, $code, %o) = @_;
    my %body = (session => $session, code => $code);
    $body{environment} = $o{env} if defined $o{env};
    $body{reset} = JSON::PP::true if $o{reset};
    return $t->execute($loc, \%body, json => 1, timeout => 60);
}

# the location's first environment is its default
my $r = run_cell('/x', 'd1', "import os, sys\nprint(os.environ.get('GREETING'), os.environ.get('PAIR'), sys.executable)");
is($r->{status}, 200, 'default environment: 200');
is($r->{json}{output}, "hello a=b /usr/bin/python3\n",
   'the first of hermes_environments, its env= settings set');
$r = run_cell('/x', 'd1', "import os\nprint(os.environ.get('T111_SECRET'))");
is($r->{json}{output}, "zq7-env-secret-91\n", 'a setting reaches the code');
# a process may exit between the glob and the open: not a match ("next"
# in a grep block dies)
my @argv_with = grep {
    my $c;
    open($c, '<', $_) && do { local $/; (<$c> // '') =~ /zq7-env-secret-91/ }
} glob('/proc/[0-9]*/cmdline');
is(scalar @argv_with, 0, '... and no command line of any process holds it');
$r = run_cell('/plain', 'p1', "import os\nprint(os.environ.get('GREETING'))");
is($r->{json}{output}, "None\n", 'a location without environments has none of them');

# a venv: its own packages, its prefix
$r = run_cell('/x', 'v1', "import sys, only_in_venv\nprint(sys.prefix, only_in_venv.WHERE)", env => 'venv');
is($r->{json}{output}, "$venv venv\n", 'venv: its prefix and its own package');
$r = run_cell('/x', 'd1', "import importlib.util\nprint(importlib.util.find_spec('only_in_venv'))");
is($r->{json}{output}, "None\n", "... which the host's python has not");

# names
$r = run_cell('/x', 'n1', '1', env => 'nope');
is($r->{status}, 400, 'an environment not allowed: 400');
is($r->{json}{error}{code}, 'invalid_environment', '... invalid_environment');
$r = run_cell('/plain', 'n2', '1', env => 'venv');
is($r->{json}{error}{code}, 'invalid_environment', 'none allowed where none are named');
$r = run_cell('/x', 'n3', '1', env => '');
is($r->{json}{error}{code}, 'invalid_environment', 'an empty name');

# a session keeps its environment
$r = run_cell('/x', 'd1', '1', env => 'venv');
is($r->{status}, 409, 'a session asked for in another environment: 409');
is($r->{json}{error}{code}, 'environment_mismatch', '... environment_mismatch');
$r = run_cell('/x', 'd1', "print('still')", env => 'hostpy');
is($r->{json}{output}, "still\n", '... its own environment named is fine');
my $l = $t->http('GET', '/k');
my %envs = map { $_->{session} => $_->{environment} } @{ $l->{json}{kernels} || [] };
is($envs{d1}, 'hostpy', 'the listing names a kernel\'s environment');
is($envs{v1}, 'venv', '... each');
ok(exists $envs{p1} && !defined $envs{p1}, '... none for a kernel of no environment');
is($t->http('DELETE', '/k/d1')->{status}, 204, 'the kernel ended');
$r = run_cell('/x', 'd1', "import sys\nprint(sys.prefix)", env => 'venv');
is($r->{json}{output}, "$venv\n", '... then the session starts in the other');
$r = run_cell('/x', 'd1', "y = 1", env => 'venv');
$r = run_cell('/x', 'd1', "import sys\nprint(sys.prefix, 'y' in dir())", env => 'hostpy', reset => 1);
is($r->{status}, 200, '"reset" with another environment: 200') or diag explain $r;
is($r->{json}{output}, "/usr False\n", '... a new kernel, in it, with nothing of the old');
$r = run_cell('/x', 'd1', "print(1)", env => 'venv');
is($r->{json}{error}{code}, 'environment_mismatch', '... and the session is of that one now');

# packages at run time: a wheel made in a cell, pip-installed into the
# kernel's own site-packages (no index, no network), imported by the next
$r = run_cell('/x', 'pip1', <<'PY', env => 'hostpy');
import os, subprocess, sys, zipfile
whl = "/tmp/hermes_probe_pkg-1.0-py3-none-any.whl"
info = "hermes_probe_pkg-1.0.dist-info/"
with zipfile.ZipFile(whl, "w") as z:
    z.writestr("hermes_probe_pkg/__init__.py", "ANSWER = 42\n")
    z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: hermes-probe-pkg\nVersion: 1.0\n")
    z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(info + "RECORD", "")
p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-cache-dir",
                    "--disable-pip-version-check", "--target", os.environ["HERMES_SITE_PACKAGES"], whl],
                   capture_output=True, text=True)
print("pip", p.returncode, p.stderr[-300:])
print(os.environ["HERMES_SITE_PACKAGES"].startswith(os.getcwd()))
PY
like($r->{json}{output} // '', qr/^pip 0 /m, 'pip install --target from a cell') or diag explain $r;
like($r->{json}{output} // '', qr/^True$/m, "... into the kernel's own directory");
$r = run_cell('/x', 'pip1', "import hermes_probe_pkg\nprint(hermes_probe_pkg.ANSWER, hermes_probe_pkg.__file__.startswith(__import__('os').getcwd()))", env => 'hostpy');
is($r->{json}{output}, "42 True\n", '... importable in the next cell, from there');
$r = run_cell('/x', 'pip2', "import importlib.util\nprint(importlib.util.find_spec('hermes_probe_pkg'))", env => 'hostpy');
is($r->{json}{output}, "None\n", "... and not in another kernel: the image is untouched");

SKIP: {
    skip "no trixie rootfs: $no_rootfs", 25 unless $rootfs;

    # the environment's own warm pool: a new session in it takes its kernel
    ok(Hermes::Test::wait_until(sub {
        ($t->http('GET', '/status')->{json}{warm_kernels} // 0) >= 1 }, 20),
       'trixie warm=1: warm kernels');
    my %pool = map { m{hermes_rkernel_(\w+)$} ? ($1 => 1) : () } $t->kroot_dirs;
    my $log0 = length $t->error_log;
    $r = run_cell('/x', 'w1', "import sys\nprint(sys.version_info[:2])", env => 'trixie');
    is($r->{json}{output}, "(3, 13)\n", "a new session in trixie runs trixie's python");
    ok($pool{$r->{json}{kernel}{kernel_id}}, '... on the pool\'s kernel');
    unlike(substr($t->error_log, $log0), qr/started for session "w1"/, '... no spawn for it');
    $r = run_cell('/x', 'w2', "import sys\nprint(sys.version_info[:2])", env => 'hostpy');
    ok(!$pool{$r->{json}{kernel}{kernel_id}}, "another environment's session does not take it");

    # figures by environment
    my $st = $t->http('GET', '/status')->{json}{environments} // {};
    ok(($st->{trixie}{kernels} // 0) >= 1 && ($st->{hostpy}{kernels} // 0) >= 1,
       'status: kernels by environment') or diag explain $st;
    ok(($st->{trixie}{spawns_total} // 0) >= 1 && defined $st->{trixie}{spawn_seconds_sum},
       'status: spawns and their time by environment');
    my $prom = $t->http('GET', '/status?format=prometheus')->{content};
    like($prom, qr/^hermes_environment_kernels\{zone="kernels",environment="trixie"\} [1-9]/m,
         'Prometheus: hermes_environment_kernels');
    like($prom, qr/^hermes_environment_spawn_seconds_sum\{zone="kernels",environment="trixie"\} \d+\.\d{3}$/m,
         'Prometheus: hermes_environment_spawn_seconds_sum');

    $r = run_cell('/x', 't1', "import sys, os\nprint(sys.version_info[:2], open('/etc/debian_version').read().strip()[:2], os.environ['IMAGE'])", env => 'trixie');
    is($r->{status}, 200, 'trixie: 200') or diag explain $r;
    like($r->{json}{output} // '', qr/^\(3, 13\) 13 trixie\n/,
         "trixie: Python 3.13 and the image's /etc");

    # the sandbox inside the image: its own dir alone, no root, no net,
    # not the host's files (the probe's targets set by the cell itself)
    $r = run_cell('/x', 't2', "import os\nos.environ['CANARY'] = '$p/canary.txt'\nos.environ['PORT'] = '${\ $t->port(0) }'\n" . <<'PY', env => 'trixie');
import os, socket
print("uid", os.getuid() != 0)
print("dir", sorted(os.listdir("..")) == [os.path.basename(os.getcwd())])
try:
    open(os.environ["CANARY"]).read()
    print("canary read")
except Exception as e:
    print("canary", type(e).__name__)
print("nginx", os.path.exists("/usr/sbin/nginx"))
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("127.0.0.1", int(os.environ["PORT"])))
    print("net on")
except OSError:
    print("net off")
PY
    my $out = $r->{json}{output} // '';
    like($out, qr/^uid True$/m, 'trixie: the kernel is not root');
    like($out, qr/^dir True$/m, 'trixie: of the kernels root, its own dir alone');
    like($out, qr/^canary FileNotFoundError$/m, "trixie: the host's files are not there");
    like($out, qr/^nginx False$/m, "trixie: /usr is the image's");
    like($out, qr/^net off$/m, 'trixie: no network');

    # interrupt and files inside the image
    my $a = $t->execute_async('/x', { session => 't3', environment => 'trixie',
        code => "import time\ntry:\n    time.sleep(20)\nexcept KeyboardInterrupt:\n    print('interrupted')" },
        json => 1, timeout => 60);
    ok(Hermes::Test::wait_until(sub {
        grep { $_->{session} eq 't3' && $_->{state} eq 'running' }
            @{ $t->http('GET', '/k')->{json}{kernels} || [] };
    }, 20), 'trixie: a long cell runs');
    is($t->http('POST', '/k/t3/interrupt')->{status}, 202, 'trixie: interrupt');
    my $ar = $a->wait(30);
    like($ar->{json}{output} // '', qr/interrupted/, 'trixie: the cell got KeyboardInterrupt');
    is($t->http('PUT', '/k/t3/files/in.txt', body => "from the host\n")->{status}, 204,
       'trixie: a file in');
    $r = run_cell('/x', 't3', "print(open('in.txt').read(), end='')\n_ = open('out.txt', 'w').write('from the image')", env => 'trixie');
    is($r->{json}{output}, "from the host\n", '... read by a cell');
    is($t->http('GET', '/k/t3/files/out.txt')->{content}, 'from the image', '... and one out');

    # over MCP
    my $init = $t->raw_request('POST', '/mcp', content_type => 'application/json',
        headers => { Accept => 'application/json, text/event-stream' },
        body => '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}');
    my $sid = $init->{headers}{'mcp-session-id'};
    my $call = $t->raw_request('POST', '/mcp', content_type => 'application/json',
        headers => { Accept => 'application/json, text/event-stream', 'Mcp-Session-Id' => $sid },
        body => '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_code","arguments":{"code":"import sys; print(sys.version_info[:2])","environment":"trixie"}}}');
    like($call->{raw}, qr/\(3, 13\)/, 'MCP execute_code: environment trixie');
}

SKIP: {
    skip "no sshd: $no_ssh", 8 if $no_ssh;

    $r = run_cell('/ssh', 's1', "import os\nprint(os.environ.get('GREETING'))");
    is($r->{json}{output}, "hello\n", 'ssh: the environment\'s settings');
    $r = run_cell('/ssh-missing', 's2', '1');
    is($r->{status}, 502, 'ssh: a host without the rootfs: 502');
    is($r->{json}{error}{code}, 'spawn_failed', '... spawn_failed');
    like($r->{json}{error}{message} // '', qr/^could not start a kernel in environment "nowhere": no rootfs \Q$p\E\/no-such-rootfs on this host$/,
         '... naming the missing path');
    SKIP: {
        skip "no trixie rootfs: $no_rootfs", 4 unless $rootfs;
        $r = run_cell('/ssh', 's3', "import sys\nprint(sys.version_info[:2])", env => 'trixie');
        is($r->{json}{output}, "(3, 13)\n", 'ssh: trixie on the host');

        # two hosts, the first without the rootfs: placement moves on
        my $log0 = length $t->error_log;
        my @out = map { run_cell('/ssh-two', "two$_", "import sys\nprint(sys.version_info[:2])")->{json}{output} // '' } 1 .. 3;
        is_deeply(\@out, [("(3, 13)\n") x 3], 'ssh: a host without the environment: the spawns go to the one with it');
        like(substr($t->error_log, $log0), qr/no rootfs \Q$rootfs\E on this host.*; trying another host/,
             '... error.log says why');
        my @hosts = map { $_->{host} } grep { $_->{session} =~ /^two/ } @{ $t->http('GET', '/k')->{json}{kernels} || [] };
        ok(@hosts == 3 && !grep({ $_ ne "127.0.0.1:${\ $s->port }" && $_ ne '127.0.0.1' } @hosts),
           '... all on the host that has it') or diag explain \@hosts;
    }
}

$t->check_error_log;
$t->stop;

# nginx -t: what an environment lacks, named
my @bad = (
    [ "hermes_environment e rootfs=$p/none;", 'hermes_environments e;',
      qr/environment "e": its rootfs "\Q$p\E\/none" is not a directory/, 'a rootfs not there' ],
    [ "hermes_environment e rootfs=$p python=/bin/nopython;", 'hermes_environments e;',
      qr/environment "e": its python "\Q$p\E\/bin\/nopython" is not there/, 'a python not in the rootfs' ],
    [ "hermes_environment e rootfs=$p;", 'hermes_environments e;',
      qr/environment "e": no "python3" in its rootfs/, 'no python3 in the rootfs' ],
    [ "hermes_environment e python=/nonexistent/python3;", 'hermes_environments e;',
      qr/environment "e": its python "\/nonexistent\/python3" is not there/, 'a host python not there' ],
    [ "hermes_environment e ro=$p;", 'hermes_environments e; hermes_sandbox off;',
      qr/environment "e" binds paths .* need "hermes_sandbox bwrap"/, 'binds without bwrap' ],
    [ 'hermes_environment e env=HERMES_RPC_TOKEN=x;', 'hermes_environments e;',
      qr/invalid "env=HERMES_RPC_TOKEN=x"/, 'a setting of ours' ],
    [ "hermes_environment e env=A=it's;", 'hermes_environments e;',
      qr/invalid "env=A=it's"/, 'a value with a quote' ],
    [ 'hermes_environment e;', 'hermes_environments f;',
      qr/unknown environment "f"/, 'an unknown name' ],
    [ 'hermes_environment e; hermes_environment e;', '',
      qr/"hermes_environment" directive is duplicate/, 'a name twice' ],
    [ 'hermes_environment "a b";', '',
      qr/invalid environment name "a b"/, 'a bad name' ],
);
for my $b (@bad) {
    my ($http, $loc, $re, $what) = @$b;
    my $u = Hermes::Test->new;
    $u->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;
    $http
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /x { hermes_execute; $loc }
    }
CONF
    my ($rc, $out) = $u->test_config;
    isnt($rc, 0, "nginx -t fails: $what");
    like($out, $re, "... saying so") or diag $out;
}

done_testing;
