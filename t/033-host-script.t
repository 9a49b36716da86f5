#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# src/remote/hermes_kernel.sh alone, run as the module runs it (sh -c
# SCRIPT hermes VERB ARG...), with hostile arguments and a hostile root:
# an id that is not exactly 32 lowercase hex is refused before any use,
# values are never shell text, the journal is trusted only when it is this
# user's 0700 dir, and recovery acts only on journal entries of this
# gateway under another zone instance, on the dir they name only while it
# has the journaled inode.  ship writes exactly the files it is given,
# never through a link or outside the kernel's dir; start runs a stand-in
# runner in the dir whatever its name, with kernel.env as fd 3, its
# limits, as the user it is given, sandboxed with the bwrap options it is
# given (or says bwrap is missing), and refuses links and bad values.
# Everything in this test's own temp dir (no cgroup is made: the starts
# here have no limits as root).

use strict;
use warnings;

use Test::More;
use File::Temp ();
use POSIX ();
use Time::HiRes qw(time sleep);
use JSON::PP ();

use Hermes::Test;

my $script = do {
    local $/;
    open my $f, '<', Hermes::Test::repo_root() . '/src/remote/hermes_kernel.sh' or die $!;
    <$f>;
};

my $tmp = File::Temp->newdir('hermes-t033-XXXXXX', TMPDIR => 1);
# a root whose name a shell would act on, were it ever shell text
# (the scripts run in $tmp: "pwned" would appear there)
my $root = "$tmp/r o'o\$(touch pwned)`touch pwned`";
mkdir $root, 0711 or die "mkdir: $!";
my $canary = "$tmp/canary";
mkdir $canary, 0700 or die;
open my $cf, '>', "$canary/keep" or die;
print $cf "canary\n";
close $cf;

my $gw = '0123456789abcdef';
my $inst = 'fedcba9876543210';
my $j = "$root/hermes_journal_$<";

# run_script(ARG...) or run_script({stdin => BYTES, path => PATH}, ARG...)
sub run_script {
    my %o = ref $_[0] eq 'HASH' ? %{ shift @_ } : ();
    my @args = @_;
    my $in = "$tmp/stdin";
    open my $ih, '>:raw', $in or die "$in: $!";
    print $ih $o{stdin} // '';
    close $ih;
    my $pid = open(my $out, '-|') // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', $in or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT;
        chdir $tmp or POSIX::_exit(127);
        # the module's environment for commands (backend_local.c)
        %ENV = (PATH => $o{path} // '/usr/local/bin:/usr/bin:/bin', LANG => 'C.UTF-8');
        exec '/bin/sh', '-c', $script, 'hermes', @args or POSIX::_exit(127);
    }
    local $/;
    my $text = <$out> // '';
    close $out;
    unlink $in;
    return ($? >> 8, $text);
}

sub id { my ($n) = @_; return sprintf('%032x', $n) }

sub canary_intact {
    return -d $canary && -f "$canary/keep" && !-e "$tmp/pwned";
}

# bad ids and numbers: refused, nothing made or removed
for my $bad ('..', '*', '../canary', uc(id(0xabc)), substr(id(1), 1), id(1) . '0',
             "$gw\n", '') {
    (my $show = "\"$bad\"") =~ s/\n/\\n/g;
    my ($rc, $text) = run_script('dir', $root, $bad, $gw, $inst);
    is($rc, 2, "dir refuses the id $show") or diag($text);
    ($rc) = run_script('kill', $root, $bad, 0, 0, 0);
    is($rc, 2, "kill refuses the id $show");
}
my ($rc) = run_script('kill', $root, id(1), "1;touch $tmp/pwned", 0, 0);
is($rc, 2, 'kill refuses a pid that is not a number');
($rc) = run_script('kill', $root, id(1), 0, '-1', 0);
is($rc, 2, 'and a start time that is not one');
($rc) = run_script('dir', $root, id(1), 'ab;cd', $inst);
is($rc, 2, 'dir refuses a gateway id that is not hex');
($rc) = run_script('nonsense', $root);
is($rc, 2, 'an unknown verb is refused');
my @left = do { opendir my $d, $root or die; grep { !/^\.\.?$/ } readdir $d };
is("@left", '', 'nothing was made in the root');
ok(canary_intact(), 'the canary is untouched, and no argument ran as shell text');

# the life of one kernel: dir, journal entry, kill
my $k = id(0xa1);
my ($rc1, $out) = run_script('dir', $root, $k, $gw, $inst);
is($rc1, 0, 'dir makes a kernel dir') or diag($out);
like($out, qr/^made\ndirectory:$<:700:(\d+)\ndirectory:$<:700:\d+\ndirectory:$<:700:\d+\n$<\n$/,
    'and prints its dirs and the uid');
my ($ino) = $out =~ /^made\ndirectory:\d+:700:(\d+)/;
is((stat $j)[2] & 07777, 0700, 'the journal is 0700');
is(slurp("$j/$k"), "$gw $inst $ino\n", 'the entry names gateway, instance and inode');
($rc1, $out) = run_script('dir', $root, $k, $gw, $inst);
is($out, "EEXIST\n", 'an existing dir is never taken');
($rc1) = run_script('kill', $root, $k, 0, 0, $ino + 1);
ok(-d "$root/hermes_rkernel_$k", 'kill leaves a dir with another inode');
ok(!-e "$j/$k", 'but the entry goes');
system('rm', '-rf', "$root/hermes_rkernel_$k");
($rc1, $out) = run_script('dir', $root, $k, $gw, $inst);
($ino) = $out =~ /^made\ndirectory:\d+:700:(\d+)/;
($rc1) = run_script('kill', $root, $k, 0, 0, $ino);
ok(!-e "$root/hermes_rkernel_$k" && !-e "$j/$k", 'kill removes the dir and the entry');

# recovery: a leftover of this gateway (a process in it), one of this
# instance, one of another gateway, an entry whose dir was replaced by a
# link to the canary, and junk in the journal
my %made;
for my $n (1 .. 4) {
    my $kid = id($n);
    (undef, $out) = run_script('dir', $root, $kid, $gw, $inst);
    ($made{$kid}) = $out =~ /^made\ndirectory:\d+:700:(\d+)/;
}
my ($left, $ours, $other, $linked) = map { id($_) } 1 .. 4;
rewrite("$j/$left", "$gw 1111111111111111 $made{$left}\n");
rewrite("$j/$other", "aaaaaaaaaaaaaaaa 1111111111111111 $made{$other}\n");
rewrite("$j/$linked", "$gw 1111111111111111 $made{$linked}\n");
# (the link made first: it must not get the dir's inode number back)
symlink $canary, "$root/link" or die;
rmdir "$root/hermes_rkernel_$linked/$_" for qw(cells rpc);
rmdir "$root/hermes_rkernel_$linked" or die;
rename "$root/link", "$root/hermes_rkernel_$linked" or die;
rewrite("$j/*", "$gw 1111111111111111 1\n");
rewrite("$j/" . uc(id(0xab9)), "$gw 1111111111111111 1\n");

my $sleeper = fork // die;
if (!$sleeper) {
    POSIX::setsid();
    chdir "$root/hermes_rkernel_$left" or POSIX::_exit(1);
    exec 'sleep', '300' or POSIX::_exit(1);
}
my $stranger = fork // die;
if (!$stranger) {
    POSIX::setsid();
    chdir $canary or POSIX::_exit(1);
    exec 'sleep', '300' or POSIX::_exit(1);
}
sleep 0.3 until (readlink("/proc/$sleeper/cwd") // '') eq "$root/hermes_rkernel_$left"
    || !kill 0, $sleeper;

my $rc2;
($rc2, $out) = run_script('recover', $root, $gw, $inst);
is($rc2, 0, 'recover runs');
is($out, "$left\n$linked\n", 'it names the leftovers of this gateway only');
ok(!-e "$root/hermes_rkernel_$left" && !-e "$j/$left", 'a leftover: dir and entry gone');
is(waitpid($sleeper, POSIX::WNOHANG()) == $sleeper || waitpid($sleeper, 0) == $sleeper, 1,
    'its process killed');
ok(-d "$root/hermes_rkernel_$ours" && -e "$j/$ours", "this instance's kernel kept");
ok(-d "$root/hermes_rkernel_$other" && -e "$j/$other", "another gateway's kernel kept");
ok(-l "$root/hermes_rkernel_$linked", 'a link in place of a dir is left');
ok(canary_intact(), 'and the canary it points to untouched');
ok(-e "$j/*" && -e "$j/" . uc(id(0xab9)), 'names that are not ids are not read');
ok(kill(0, $stranger), 'a process elsewhere lives on');
kill 'KILL', $stranger;
waitpid $stranger, 0;

# a journal that is not this user's 0700 dir: nothing is trusted
chmod 0777, $j;
rewrite("$j/$ours", "$gw 1111111111111111 $made{$ours}\n");
($rc2, $out) = run_script('recover', $root, $gw, $inst);
is($rc2, 3, 'recover refuses a journal open to others');
like($out, qr/^!the journal .* is not a directory of uid $< with mode 0700$/, 'and says why');
ok(-d "$root/hermes_rkernel_$ours", 'and removes nothing');
($rc2, $out) = run_script('dir', $root, id(7), $gw, $inst);
is($rc2, 6, 'no kernel dir is made beside it either');
chmod 0700, $j;
ok(canary_intact(), 'the canary is untouched at the end');

###############################################################################
# ship: the files it is given, from stdin, nowhere else

my $odd = "n a'm\"e \$(touch pwned) `touch pwned`\nx";
{
    my $sk = id(0xb1);
    (my $rc1, $out) = run_script('dir', $root, $sk, $gw, $inst);
    is($rc1, 0, 'ship: a kernel dir for it') or diag $out;
    my $sd = "$root/hermes_rkernel_$sk";
    my @files = (['kernel_runner.py', "print('x')\n"], [$odd, "'\$(touch pwned)'\0\xff\n"],
                 ['kernel.env', "A='1'\n"]);
    my $payload = join '', map { $_->[1] } @files;
    ($rc1, $out) = run_script({ stdin => $payload . 'rest' }, 'ship', $root, $sk,
        map { ($_->[0], length $_->[1]) } @files);
    is($rc1, 0, 'ship writes three files') or diag $out;
    for my $f (@files) {
        (my $show = $f->[0]) =~ s/\n/\\n/g;
        is(slurp("$sd/$f->[0]"), $f->[1], "ship: \"$show\" byte for byte, its length's worth");
        is((lstat "$sd/$f->[0]")[2] & 07777, 0600, "ship: \"$show\" 0600");
    }
    ok(canary_intact(), 'ship: no name or byte ran as shell text');

    # refused before anything is written
    my @bad = (
        [[$root, 'x' x 32, 'a', 1], 'an id that is not one'],
        [[$root, $sk, '../canary/keep2', 1], 'a name with a slash'],
        [[$root, $sk, '..', 1], 'the name ..'],
        [[$root, $sk, '', 1], 'an empty name'],
        [[$root, $sk, 'ok', 1, 'bad', '-1'], 'a negative length (after a good file)'],
        [[$root, $sk, 'ok', "1;touch $tmp/pwned"], 'a length that is not a number'],
        [[$root, $sk, 'ok'], 'a name without a length'],
    );
    for my $b (@bad) {
        ($rc1) = run_script({ stdin => 'xxxx' }, 'ship', @{ $b->[0] });
        is($rc1, 2, "ship refuses $b->[1]");
    }
    ok(!-e "$sd/ok" && !-e "$canary/keep2", 'and wrote nothing');

    # a path there already, a link too: never written, nor through
    symlink "$canary/keep", "$sd/linked" or die;
    ($rc1) = run_script({ stdin => "evil\n" }, 'ship', $root, $sk, 'linked', 5);
    isnt($rc1, 0, 'ship fails on a link in place of a file');
    ($rc1) = run_script({ stdin => "evil\n" }, 'ship', $root, $sk, 'kernel.env', 5);
    isnt($rc1, 0, 'and on a file there already');
    is(slurp("$sd/kernel.env"), "A='1'\n", 'which keeps its bytes');

    # a link in place of the kernel dir: nothing written through it
    my $lk = id(0xb2);
    symlink $canary, "$root/hermes_rkernel_$lk" or die;
    ($rc1, $out) = run_script({ stdin => "evil\n" }, 'ship', $root, $lk, 'evil', 5);
    is($rc1, 1, 'ship refuses a link in place of the kernel dir') or diag $out;
    ok(!-e "$canary/evil", 'and writes nothing through it');
    ($rc1) = run_script({ stdin => "evil\n" }, 'ship', $root, id(0xb3), 'evil', 5);
    is($rc1, 1, 'and a kernel dir that is not there');
    ok(canary_intact(), 'the canary is untouched');
    unlink "$root/hermes_rkernel_$lk";
    system('rm', '-rf', $sd);
    unlink "$j/$sk";
}

###############################################################################
# start: a stand-in runner, in its dir, with kernel.env as fd 3

SKIP: {
    my $py = -x '/usr/bin/python3' ? '/usr/bin/python3' : undef;
    skip '/usr/bin/python3 not found', 1 unless $py;

    # the kernel user must reach its dir (as root the start hands it over)
    chmod 0711, "$tmp";

    # the stand-in says what it was given and exits
    # behind the real kernel_start.py, which runs it from source (no .pyc)
    my $start = do {
        open my $f, '<', Hermes::Test::repo_root() . '/src/remote/kernel_start.py' or die $!;
        local $/;
        <$f>;
    };
    my $runner = <<'PY';
import json, os, sys
fd = os.environ.get("HERMES_ENV_FD")
info = {"fd": fd, "env": os.read(int(fd), 4096).decode() if fd else None,
        "cwd": os.getcwd(), "uid": os.getuid(), "pid": os.getpid(),
        "pgid": os.getpgid(0), "sid": os.getsid(0), "argv": sys.argv,
        "as": [l.split()[3] for l in open("/proc/self/limits")
               if l.startswith("Max address space")][0],
        "groups": os.getgroups(),
        "nnp": "NoNewPrivs:\t1" in open("/proc/self/status").read()}
with open("out.json.tmp", "w") as f:
    json.dump(info, f)
os.rename("out.json.tmp", "out.json")
if os.path.exists("hold"):
    import time
    time.sleep(3)
PY

    # a kernel dir with the stand-in and kernel.env; its dir and id
    my $n = 0xc0;
    my $prepare = sub {
        my ($r) = @_;
        $r //= $root;
        my $k = id($n++);
        my ($rc, $text) = run_script('dir', $r, $k, $gw, $inst);
        die "dir: $text" unless $rc == 0;
        my $env = "HERMES_KERNEL_ID='$k'\n";
        ($rc, $text) = run_script({ stdin => $runner . $start . $env }, 'ship', $r, $k,
            'kernel_runner.py', length $runner, 'kernel_start.py', length $start,
            'kernel.env', length $env);
        die "ship: $text" unless $rc == 0;
        return ("$r/hermes_rkernel_$k", $k);
    };
    my $wait_out = sub {
        my ($d) = @_;
        my $until = time + 10;
        sleep 0.05 until -e "$d/out.json" || time > $until;
        my $c = slurp("$d/out.json") // return {};
        return eval { JSON::PP->new->decode($c) } // {};
    };

    # not root's: no user, no sandbox; a root whose name holds a newline
    my $nlroot = "$tmp/n\nl \$(touch pwned) '\"";
    mkdir $nlroot, 0711 or die "mkdir: $!";
    my ($d, $k) = $prepare->($nlroot);
    my ($rc, $text) = run_script('start', $nlroot, $k, '', '', 1073741824, 64, 0, 'off', 'python3', '');
    is($rc, 0, 'start: exits 0') or diag $text;
    # the runner starts as the step unlinks it: gone once the step returns,
    # before any cell can come
    ok(!-e "$d/kernel.env" && !-l "$d/kernel.env",
        'kernel.env unlinked when the start returns');
    like($text, qr/^(\d+)\n$<\n$/, 'start: prints the pid, then our uid');
    my ($pid) = $text =~ /^(\d+)/;
    my $info = $wait_out->($d);
    is($info->{cwd}, $d, 'the runner runs in the kernel dir, whatever its name');
    is($info->{pid}, $pid, 'the printed pid is the runner (exec all the way)');
    is("$info->{pgid} $info->{sid}", "$pid $pid", 'leading its own process group and session');
    is($info->{fd}, '3', 'HERMES_ENV_FD=3');
    is($info->{env}, "HERMES_KERNEL_ID='$k'\n", 'kernel.env is its fd 3');
    is_deeply($info->{argv}, ['kernel_start.py'], 'python3 -I kernel_start.py');
    is($info->{as}, 'unlimited', 'without a sandbox, no limit');
    like(slurp("$d/runner.log") // '', qr/^$/, 'runner.log: nothing said');
    is((lstat "$d/runner.log")[2] & 07777, 0600, 'runner.log 0600');
    ok(canary_intact(), 'the canary is untouched');

    # the limit with a sandbox; "auto" without bwrap on PATH says so and
    # runs the kernel unsandboxed
    my $bin = "$tmp/bin";
    mkdir $bin or die;
    for my $tool (qw(sh id rm chown setsid setpriv python3 cat)) {
        my ($p) = grep { -x } map { "$_/$tool" } qw(/usr/bin /bin);
        symlink $p, "$bin/$tool" or die "$tool: $!" if $p;
    }
    ($d, $k) = $prepare->();
    ($rc, $text) = run_script({ path => $bin }, 'start', $root, $k, '', '', 1073741824, 64, 0, 'auto', 'python3', '',
        '--unshare-all', "\$(touch $tmp/pwned)");
    is($rc, 0, 'start auto without bwrap: exits 0') or diag $text;
    $info = $wait_out->($d);
    is($info->{cwd}, $d, 'the kernel runs');
    is($info->{as}, 1073741824, 'its RLIMIT_AS is MEMORY');
    is(slurp("$d/runner.log"), "hermes: bwrap is not installed, the kernel runs without a sandbox\n",
        'runner.log says bwrap is not installed');
    ok(canary_intact(), 'no bwrap option ran as shell text');

    # bad values: refused, nothing started, nothing said but why
    ($d, $k) = $prepare->();
    for my $b ([[$root, 'x' x 32, '', '', 0, 0, 0, 'off', 'python3', ''], 'an id that is not one'],
               [[$root, $k, '', '', "1;touch $tmp/pwned", 0, 0, 'off', 'python3', ''], 'a memory that is no number'],
               [[$root, $k, '', '', '010', 0, 0, 'off', 'python3', ''], 'a number with a leading zero'],
               [[$root, $k, '', '', '1' x 19, 0, 0, 'off', 'python3', ''], 'a number past 64 bits'],
               [[$root, $k, '', '', 0, '-1', 0, 'off', 'python3', ''], 'a negative pid count'],
               [[$root, $k, '', '', 0, 0, 0, 'on', 'python3', ''], 'a sandbox that is none of off, bwrap, auto'],
               [[$root, $k, '', '', 0, 0, 0, 'off', '-c', ''], 'a python that is an option'],
               [[$root, $k, '', '', 0, 0, 0, 'off', 'python3'], 'too few arguments'])
    {
        ($rc, $text) = run_script('start', @{ $b->[0] });
        is($rc, 2, "start refuses $b->[1]");
        unlike($text, qr/^\d+$/m, '... and prints no pid');
    }
    ok(!-e "$d/runner.log" && -e "$d/kernel.env", 'nothing was started');

    # links: in place of the kernel dir, of kernel.env
    my $lk = id(0xcf);
    symlink $canary, "$root/hermes_rkernel_$lk" or die;
    ($rc, $text) = run_script('start', $root, $lk, '', '', 0, 0, 0, 'off', 'python3', '');
    is("$rc $text", "1 no kernel directory\n", 'start refuses a link in place of the kernel dir');
    unlink "$root/hermes_rkernel_$lk";
    unlink "$d/kernel.env";
    symlink "$canary/keep", "$d/kernel.env" or die;
    ($rc, $text) = run_script('start', $root, $k, '', '', 0, 0, 0, 'off', 'python3', '');
    is("$rc $text", "1 no kernel.env\n", 'start refuses a link in place of kernel.env');
    ok(!-e "$d/runner.log", 'nothing started');
    ok(canary_intact(), 'the canary is untouched');

    # as root: the dir and the kernel go to the user (or OR_USER where it
    # does not exist); a user that is odd shell text is only a name
    SKIP: {
        skip 'not root: no user to drop to', 1 unless $> == 0;
        my $nobody = getpwnam('nobody');
        skip 'no user nobody', 1 unless defined $nobody;

        ($d, $k) = $prepare->();
        my $bogus = "no-such \$(touch $tmp/pwned)";
        ($rc, $text) = run_script('start', $root, $k, $bogus, 'nobody', 0, 0, 0, 'off', 'python3', '');
        is($rc, 0, 'start as root: exits 0') or diag $text;
        like($text, qr/^\d+\n$nobody\n$/, 'prints the uid of OR_USER, the user it fell back to');
        $info = $wait_out->($d);
        is($info->{uid}, $nobody, 'the kernel runs as that user');
        is_deeply($info->{groups}, [], 'with no supplementary groups');
        ok($info->{nnp}, 'and no new privileges');
        is((lstat $d)[4], $nobody, 'its dir handed to it');
        is($info->{env}, "HERMES_KERNEL_ID='$k'\n", 'kernel.env its fd 3 (opened before the drop)');

        ($d, $k) = $prepare->();
        ($rc, $text) = run_script('start', $root, $k, $bogus, '', 0, 0, 0, 'off', 'python3', '');
        isnt($rc, 0, 'a user that does not exist, and no OR_USER: the start fails');
        sleep 0.3;
        ok(!-e "$d/out.json", 'the kernel never ran');
        isnt((lstat $d)[4], $nobody, 'its dir is nobody\'s');
        ok(canary_intact(), 'no user name ran as shell text');
    }

    # bwrap, with the options it is given: the dir's odd name bound
    SKIP: {
        skip 'bwrap not installed', 1 unless -x '/usr/bin/bwrap';
        ($d, $k) = $prepare->();
        my @opt = ('--unshare-all', '--die-with-parent', '--new-session',
                   '--ro-bind', '/usr', '/usr', '--symlink', 'usr/lib', '/lib',
                   '--symlink', 'usr/lib64', '/lib64', '--symlink', 'usr/bin', '/bin',
                   '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp',
                   '--bind', $d, $d, '--chdir', $d);
        open my $hold, '>', "$d/hold" or die;
        close $hold;
        ($rc, $text) = run_script('start', $root, $k, '', '', 0, 0, 0, 'bwrap', 'python3', '', @opt);
        is($rc, 0, 'start bwrap: exits 0') or diag $text;
        ($pid) = $text =~ /^(\d+)/;
        $info = $wait_out->($d);
        is($info->{cwd}, $d, 'the runner runs sandboxed in its dir, bound by its odd name')
            or diag slurp("$d/runner.log");
        isnt($info->{pid}, $pid, 'in a pid namespace of its own');
        like(slurp("/proc/$pid/cmdline") // '', qr/^sh\0-c\0"\$\@"; exit \$\?\0hermes-kernel\0bwrap\0/,
            'the printed pid is the shell that waits for bwrap');
        kill_group($pid);
        ok(canary_intact(), 'the canary is untouched');
    }
}

sub slurp { my ($f) = @_; open my $h, '<', $f or return undef; local $/; return <$h> }

sub rewrite {
    my ($f, $text) = @_;
    open my $h, '>', $f or die "$f: $!";
    print $h $text;
    close $h;
}

done_testing;
