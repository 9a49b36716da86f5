#!/usr/bin/perl
# The spawn commands of docs/protocol.md ("Spawn"), which the module sends
# to the kernel host's shell (over ssh: the login shell's `-c`), replayed
# through real shells under a temp root, payloads on stdin.  No nginx.
#
# The command strings are copied here from docs/protocol.md AND read out
# of the C source (ngx_slprintf format strings): the test fails when either
# drifts from what is tested, and the replay runs the C strings themselves.

use strict;
use warnings;
no warnings 'exec';

use Test::More;
use File::Temp ();
use File::Path qw(make_path);
use POSIX qw(:sys_wait_h);
use IO::Select;
use JSON::PP ();
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $ROOT = Hermes::Test::repo_root();
my $C_KERNEL = "$ROOT/src/ngx_hermes_kernel.c";
my $DOCS = "$ROOT/docs/protocol.md";
my $PY = -x '/usr/bin/python3' ? '/usr/bin/python3' : undef;
plan skip_all => '/usr/bin/python3 not found' unless $PY;

###############################################################################
# the commands as documented (copied from docs/protocol.md, section Spawn)

my %DOC = (
    dirs  => 'umask 077; r=ROOT; if [ -n "$(find "$r/" -maxdepth 0 -perm /022 ! -perm -1000)" ]; then echo "the kernels root $r is writable by others without the sticky bit"; exit 3; fi; if ! mkdir -m 700 -- DIR 2>/dev/null; then if [ -e DIR ] || [ -L DIR ]; then echo EEXIST; exit 4; fi; mkdir -m 700 -- DIR; exit 5; fi; echo made; mkdir -m 700 -- DIR/cells DIR/rpc && stat -c %F:%u:%a:%i -- DIR DIR/cells DIR/rpc && id -u',
    ship  => 'umask 077 && cat > DIR/NAME.tmp && chmod 600 DIR/NAME.tmp && mv -f DIR/NAME.tmp DIR/NAME',
    start => 'umask 077 && cd DIR && { ( set -a; . ./kernel.env; set +a; rm -f ./kernel.env; exec setsid python3 -I kernel_runner.py ) >runner.log 2>&1 </dev/null & } && echo $!',
    kill  => 'if s=$(cat /proc/PID/stat 2>/dev/null); then s=${s##*) }; set -- $s; [ "${20}" = START ] && kill -9 -PID; else kill -9 -PID; fi 2>/dev/null; [ INO = 0 ] || [ "$(stat -c %i -- DIR 2>/dev/null)" = INO ] && rm -rf -- DIR; exit 0',
);

my $docs = slurp($DOCS) // '';
for my $k (qw(dirs ship start kill)) {
    ok(index($docs, "`$DOC{$k}`") >= 0, "docs/protocol.md still documents the $k step as tested")
        or diag "expected in $DOCS:\n  `$DOC{$k}`";
}
like($docs, qr/HERMES_RPC_TOKEN.*HERMES_KERNEL_ID.*HERMES_IDLE_TIMEOUT/s,
    'docs: kernel.env holds HERMES_RPC_TOKEN, HERMES_KERNEL_ID, HERMES_IDLE_TIMEOUT');

###############################################################################
# the commands as the C code builds them

# every run of adjacent C string literals in a file: [text, line]
sub c_strings {
    my ($file) = @_;
    my $src = slurp($file) // return ();
    my (@runs, $cur, $line);
    my $ln = 1;
    while ($src =~ m{\G(?:
            ("(?:[^"\\\n]|\\.)*")            # 1 string literal
          | ('(?:[^'\\\n]|\\.)*')            # 2 char literal
          | (/\*.*?\*/)                      # 3 block comment
          | (//[^\n]*)                       # 4 line comment
          | (\s+)                            # 5 blanks
          | ([^"'/\s]+|/)                    # 6 anything else
        )}gsx)
    {
        my ($str, $blank, $com) = ($1, $5, $3 // $4);
        my $tok = $&;
        if (defined $str) {
            my $s = substr($str, 1, -1);
            $s =~ s/\\(n|t|"|\\|')/{ n => "\n", t => "\t", '"' => '"', '\\' => '\\', "'" => "'" }->{$1}/ge;
            if (defined $cur) { $cur .= $s } else { $cur = $s; $line = $ln }
        } elsif (defined $blank || defined $com) {
            # adjacent literals may be split by blanks and comments
        } else {
            push @runs, [$cur, $line] if defined $cur;
            undef $cur;
        }
        $ln += ($tok =~ tr/\n//);
    }
    push @runs, [$cur, $line] if defined $cur;
    return @runs;
}

my @kernel_c = c_strings($C_KERNEL);
ok(scalar @kernel_c, "read the string literals of $C_KERNEL") or BAIL_OUT("no $C_KERNEL");

my %C;
for my $r (@kernel_c) {
    my $s = $r->[0];
    if ($s =~ /^umask 077; r=/)                            { push @{ $C{dirs} }, $s }
    elsif ($s =~ /^umask 077 && cat > '?%s\/%V\.tmp/)      { push @{ $C{ship} }, $s }
    elsif ($s =~ /^umask 077 && cat > '?%s\/kernel\.env/)  { push @{ $C{env} }, $s }
    elsif ($s =~ /^umask 077 && cd .*kernel_runner\.py/)   { push @{ $C{start} }, $s }
    elsif ($s =~ /^HERMES_RPC_TOKEN=/)                     { push @{ $C{envfmt} }, $s }
    elsif ($s =~ /^kill -9 -%P\b.*rm -rf/)                 { push @{ $C{kill} }, $s }
    elsif ($s =~ /^if s=\$\(cat \/proc\/%P\/stat/)           { push @{ $C{killpid} }, $s }
    elsif ($s =~ /^\[ '%uL' = 0 \]/)                       { push @{ $C{killdir} }, $s }
}
# the kill command (kernel kill and failed-spawn cleanup) may be built in
# more than one place, but always the same way
{
    my %k = map { $_ => 1 } @{ $C{kill} || [] };
    $C{kill} = [ keys %k ];
}
for my $k (qw(dirs ship env start envfmt kill killpid killdir)) {
    is(scalar @{ $C{$k} || [] }, 1, "exactly one $k format string in ngx_hermes_kernel.c")
        or diag explain $C{$k};
    $C{$k} = $C{$k}[0] // '';
}

# C format -> documented form: quotes dropped, %s -> DIR, %V -> NAME
sub c_to_doc {
    my ($f, $name) = @_;
    $name //= 'NAME';
    (my $s = $f) =~ s/'//g;
    $s =~ s{%(%|s|V)}{$1 eq '%' ? '%' : $1 eq 's' ? 'DIR' : $name}ge;
    return $s;
}

# C format -> the command sent, for a directory and a file name (for the
# directory step: the root)
sub c_cmd {
    my ($f, $dir, $name) = @_;
    $name //= $dir =~ s{/[^/]*$}{}r;
    my @bad = grep { !/^%[%sV]$/ } $f =~ /(%.)/gs;
    die "unexpected conversion(s) @bad in C format: $f\n" if @bad;
    die "directory holds a single quote: $dir\n" if $dir =~ /'/;
    (my $s = $f) =~ s{%(%|s|V)}{$1 eq '%' ? '%' : $1 eq 's' ? $dir : $name}ge;
    return $s;
}

is(c_to_doc($C{dirs}, 'ROOT'), $DOC{dirs}, 'C directory step = docs');
{
    (my $k = $C{killpid} . $C{killdir}) =~ s/%P/PID/g;
    my $n = 0;
    $k =~ s/%uL/$n++ ? 'INO' : 'START'/ge;
    is(c_to_doc($k), $DOC{kill}, 'C kill command = docs');
}
is(c_to_doc($C{ship}), $DOC{ship}, 'C ship step = docs');
is(c_to_doc($C{env}), $DOC{ship} =~ s/NAME/kernel.env/gr,
    'C kernel.env step = docs ("the same for kernel.env")');
is(c_to_doc($C{start}), $DOC{start}, 'C start step = docs');
for my $k (qw(dirs ship env start)) {
    my @conv = $C{$k} =~ /(%.)/gs;
    ok(!grep({ !/^%[%sV]$/ } @conv), "C $k step: only %s/%V conversions")
        or diag "@conv";
    unlike($C{$k}, qr/TOKEN/, "C $k step: no token on the command line");
}
like($C{envfmt}, qr/^HERMES_RPC_TOKEN='%s'\nHERMES_KERNEL_ID='%\*s'\nHERMES_IDLE_TIMEOUT='%ui'\n$/,
    'C kernel.env: single-quoted KEY=value lines');

# any other file of the module that builds a command of this protocol must
# build it the same way (say, an ssh backend with its own copies)
{
    my %known = map { $_ => 1 } grep { length } @C{qw(dirs ship env start)};
    for my $f (sort glob("$ROOT/src/*.c"), "$ROOT/ngx_hermes_module.c") {
        next if $f eq $C_KERNEL || !-f $f;
        for my $r (c_strings($f)) {
            my $s = $r->[0];
            next unless $s =~ /^umask 077 && (?:mkdir|cat >|cd )/;
            ok($known{$s}, "$f:$r->[1]: spawn command identical to the tested ones")
                or diag "untested spawn command: $s";
        }
    }
}

###############################################################################
# replay

my $tmp = File::Temp->newdir('hermes-replay-XXXXXXXX', TMPDIR => 1, CLEANUP => !$ENV{HERMES_KEEP});
chmod 0755, "$tmp";
my $CLEAN_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

# run_sh($shell, $cmd, stdin => $bytes, timeout => 10)
# -> {rc, out, err, elapsed (until stdout EOF and exit)}
# The shell starts with umask 022 and a clean environment, stdout a pipe:
# the command must close it (a detached child holding it would hang a
# remote channel) and exit.
sub run_sh {
    my ($shell, $cmd, %o) = @_;
    my $timeout = $o{timeout} // 10;
    my $in = "$tmp/stdin." . $$ . '.' . int(rand 1e9);
    open my $ifh, '>:raw', $in or die; print $ifh $o{stdin} // ''; close $ifh;
    my $errf = "$in.err";
    pipe my $rd, my $wr or die "pipe: $!";
    my $t0 = time;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        close $rd;
        open STDIN, '<', $in or POSIX::_exit(127);
        open STDOUT, '>&', $wr or POSIX::_exit(127);
        open STDERR, '>', $errf or POSIX::_exit(127);
        close $wr;
        umask 022;
        %ENV = (PATH => $CLEAN_PATH, LANG => 'C', HOME => '/root');
        chdir '/';
        exec { $shell } $shell, '-c', $cmd;
        POSIX::_exit(127);
    }
    close $wr;
    my $out = '';
    my $sel = IO::Select->new($rd);
    my $deadline = $t0 + $timeout;
    my $eof = 0;
    while (!$eof && time < $deadline) {
        next unless $sel->can_read($deadline - time);
        my $n = sysread($rd, my $buf, 65536);
        if (!$n) { $eof = 1; last }
        $out .= $buf;
    }
    my $rc;
    my $exited = wait_until(sub {
        my $w = waitpid($pid, WNOHANG);
        $rc = $? >> 8 if $w == $pid;
        $w == $pid || $w == -1;
    }, $deadline - time > 0 ? $deadline - time : 0.01);
    my $elapsed = time - $t0;
    unless ($eof && $exited) {
        kill 'KILL', $pid;
        waitpid $pid, 0;
        $rc = -1;
    }
    close $rd;
    my $err = slurp($errf) // '';
    unlink $in, $errf;
    return { rc => $rc, out => $out, err => $err, elapsed => $elapsed,
             timed_out => !($eof && $exited) };
}

sub mode { my @s = lstat $_[0]; return @s ? sprintf('%o', $s[2] & 07777) : 'missing' }

sub standin_runner {
    my (%o) = @_;
    my $sleep = $o{sleep} // 0;
    my $exit = $o{exit} // 0;
    my $child = $o{child} ? "import subprocess\nsubprocess.Popen(['sleep', '$o{child}'])" : '';
    return <<"PY";
# stand-in kernel_runner.py (t/091-ssh-replay.t): reports what it was given
import json, os, sys, time
old = os.umask(0)
os.umask(old)
info = {
    "token": os.environ.get("HERMES_RPC_TOKEN"),
    "token_len": len(os.environ.get("HERMES_RPC_TOKEN", "")),
    "kernel_id": os.environ.get("HERMES_KERNEL_ID"),
    "idle": os.environ.get("HERMES_IDLE_TIMEOUT"),
    "env_file_present": os.path.exists("kernel.env"),
    "cwd": os.getcwd(),
    "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
    "umask": old,
    "argv": sys.argv,
    "stdin_devnull": os.path.samestat(os.fstat(0), os.stat("/dev/null")),
}
with open("standin.json.tmp", "w") as f:
    json.dump(info, f)
os.rename("standin.json.tmp", "standin.json")
print("runner stdout line", flush=True)
sys.stderr.write("runner stderr line\\n")
sys.stderr.flush()
# the ready file the way docs/protocol.md says: {"pid": N}, NAME.tmp renamed
fd = os.open("ready.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
os.write(fd, ('{"pid":%d}' % os.getpid()).encode())
os.close(fd)
os.rename("ready.tmp", "ready")
$child
time.sleep($sleep)
sys.exit($exit)
PY
}

sub env_payload {
    my ($token, $kid, $idle) = @_;
    my $f = $C{envfmt};
    $f =~ s/%\*s/$kid/g;
    $f =~ s/%ui/$idle/g;
    $f =~ s/%s/$token/g;
    return $f;
}

# the kernel kill command for a pid, its start time and the dir's inode
sub kill_cmd {
    my ($pid, $start, $ino, $dir) = @_;
    my $k = $C{killpid} . $C{killdir};
    my $n = 0;
    $k =~ s/%uL/$n++ ? $ino : $start/ge;
    $k =~ s/%P/$pid/g;
    return c_cmd($k, $dir);
}

sub proc_start {
    my $s = slurp("/proc/$_[0]/stat") // return 0;
    $s =~ s/.*\) //s;
    return (split ' ', $s)[19];
}

sub dirs_out {
    my ($dir) = @_;
    my $uid = $>;
    my $l = join '', map { my @s = lstat $_; "directory:$uid:700:$s[1]\n" } $dir, "$dir/cells", "$dir/rpc";
    return "made\n$l$uid\n";
}

sub new_token { join '', map { sprintf '%02x', int rand 256 } 1 .. 32 }
sub new_kid   { join '', map { sprintf '%02x', int rand 256 } 1 .. 16 }

sub read_json { my $c = slurp($_[0]); defined $c ? eval { JSON::PP->new->decode($c) } : undef }

sub ready_pid {
    my ($dir) = @_;
    my $r = read_json("$dir/ready") or return undef;
    return $r->{pid};
}

sub cmdlines_with {
    my ($needle) = @_;
    my $all = all_cmdlines();
    return grep { index($all->{$_}, $needle) >= 0 } keys %$all;
}

for my $shell ('/bin/sh', '/bin/bash') {
    next unless -x $shell;
    my $sh = $shell =~ s{.*/}{}r;
    my $root = "$tmp/root-$sh";
    make_path($root);
    chmod 0755, $root;
    my $kid = new_kid();
    my $token = new_token();
    my $dir = "$root/hermes_rkernel_$kid";

    # 1. directories
    my $r = run_sh($shell, c_cmd($C{dirs}, $dir));
    is($r->{rc}, 0, "$sh: directory step exits 0") or diag $r->{err};
    is($r->{out}, dirs_out($dir), "$sh: directory step: made, three owner-only directories and the uid");
    is(mode($dir), '700', "$sh: DIR 0700 under an outer umask 022");
    is(mode("$dir/cells"), '700', "$sh: DIR/cells 0700");
    is(mode("$dir/rpc"), '700', "$sh: DIR/rpc 0700");

    # 2. the runner (a stand-in) and hermes_tools.py; a hostile payload
    #    travels byte for byte and is never interpreted
    my $runner = standin_runner(sleep => 1.5, exit => 7);
    $r = run_sh($shell, c_cmd($C{ship}, $dir, 'kernel_runner.py'), stdin => $runner);
    is($r->{rc}, 0, "$sh: ship kernel_runner.py exits 0") or diag $r->{err};
    my $tools = "# tools\n'\$(touch $root/pwned)'\"`touch $root/pwned2`\"\0\xff\n";
    $r = run_sh($shell, c_cmd($C{ship}, $dir, 'hermes_tools.py'), stdin => $tools);
    is($r->{rc}, 0, "$sh: ship hermes_tools.py exits 0");
    is(slurp("$dir/kernel_runner.py"), $runner, "$sh: runner shipped byte for byte");
    is(slurp("$dir/hermes_tools.py"), $tools, "$sh: a payload with quotes, \$(), NUL shipped byte for byte");
    ok(!-e "$root/pwned" && !-e "$root/pwned2", "$sh: the payload was not interpreted");
    is(mode("$dir/kernel_runner.py"), '600', "$sh: kernel_runner.py 0600");
    is(mode("$dir/hermes_tools.py"), '600', "$sh: hermes_tools.py 0600");

    # 3. kernel.env
    my $env = env_payload($token, $kid, 1830);
    $r = run_sh($shell, c_cmd($C{env}, $dir), stdin => $env);
    is($r->{rc}, 0, "$sh: ship kernel.env exits 0");
    is(mode("$dir/kernel.env"), '600', "$sh: kernel.env 0600");
    my @left = glob("$dir/*.tmp");
    is("@left", '', "$sh: no NAME.tmp left behind");

    # 4. start: returns at once with the pid, the runner detached
    $r = run_sh($shell, c_cmd($C{start}, $dir), timeout => 10);
    is($r->{rc}, 0, "$sh: start exits 0") or diag $r->{err};
    like($r->{out}, qr/^\d+\n$/, "$sh: start prints the pid");
    ok($r->{elapsed} < 1.0, sprintf("$sh: start returns (stdout closed, shell gone) while the runner runs (%.2fs)",
        $r->{elapsed}));
    my ($pid) = $r->{out} =~ /^(\d+)/;
    $pid //= 0;

    # 5. ready with that pid
    ok(wait_until(sub { defined ready_pid($dir) }, 10), "$sh: ready written");
    is(ready_pid($dir), $pid, "$sh: ready holds the pid the start step printed");
    my $info = read_json("$dir/standin.json") // {};
    is($info->{pid}, $pid, "$sh: the printed pid is the runner itself (exec, no wrapper)");
    ok(pid_alive($pid), "$sh: the runner is alive after the start command returned");
    is($info->{token_len}, 64, "$sh: kernel.env reached the child: HERMES_RPC_TOKEN of 64 hex");
    is($info->{token}, $token, "$sh: the token is the one shipped");
    is($info->{kernel_id}, $kid, "$sh: HERMES_KERNEL_ID reached the child");
    is($info->{idle}, '1830', "$sh: HERMES_IDLE_TIMEOUT reached the child");
    ok(!$info->{env_file_present}, "$sh: kernel.env removed before the runner started");
    ok(!-e "$dir/kernel.env", "$sh: kernel.env gone");
    is($info->{cwd}, $dir, "$sh: the runner runs in DIR");
    is($info->{umask}, 077, "$sh: the runner inherits umask 077");
    is($info->{pgid}, $pid, "$sh: the runner leads its own process group");
    is($info->{sid}, $pid, "$sh: and its own session (setsid)");
    ok($info->{stdin_devnull}, "$sh: the runner's stdin is /dev/null");
    is(mode("$dir/ready"), '600', "$sh: ready (written by the runner with 0666) is 0600");
    is(mode("$dir/runner.log"), '600', "$sh: runner.log 0600");
    is(mode("$dir/standin.json"), '600', "$sh: a file the runner makes is 0600");
    is(join(',', cmdlines_with($token)), '', "$sh: the token is in no process's argv");

    ok(wait_until(sub { !pid_alive($pid) }, 10), "$sh: the stand-in runner ended");
    like(slurp("$dir/runner.log") // '', qr/runner stdout line\n.*runner stderr line/s,
        "$sh: the runner's stdout and stderr go to runner.log");

    # the same start, waited for: the command's status is the runner's
    # exit code, and nothing of kernel.env reached the outer shell
    my $dir2 = "$root/hermes_rkernel_" . new_kid();
    my $token2 = new_token();
    $r = run_sh($shell, c_cmd($C{dirs}, $dir2));
    is($r->{rc}, 0, "$sh: a second directory");

    # a path that exists, whatever it is, is never taken over or changed
    for my $plant (qw(dir file symlink)) {
        my $d = "$root/hermes_rkernel_" . new_kid();
        if ($plant eq 'dir') { mkdir $d, 0755 or die }
        elsif ($plant eq 'file') { open my $f, '>', $d or die; close $f }
        else { mkdir "$d.target", 0755 or die; symlink "$d.target", $d or die }
        $r = run_sh($shell, c_cmd($C{dirs}, $d));
        is($r->{rc}, 4, "$sh: an existing $plant: exit 4");
        is($r->{out}, "EEXIST\n", "$sh: an existing $plant: EEXIST, nothing else");
        if ($plant eq 'symlink') {
            is(mode("$d.target"), '755', "$sh: the symlink's target untouched");
            ok(!-e "$d.target/cells", "$sh: nothing made through the symlink");
        } elsif ($plant eq 'dir') {
            is(mode($d), '755', "$sh: the existing dir untouched");
            ok(!-e "$d/cells", "$sh: nothing made in it");
        }
    }

    # a root others may write without the sticky bit: refused, nothing made
    for my $m (0777, 0775, 01777) {
        my $open = sprintf("$root/open-%o", $m);
        mkdir $open or die;
        chmod $m, $open;
        my $d = "$open/hermes_rkernel_" . new_kid();
        $r = run_sh($shell, c_cmd($C{dirs}, $d));
        if ($m == 01777) {
            is($r->{rc}, 0, "$sh: a sticky world-writable root (as /tmp) is fine");
        } else {
            is($r->{rc}, 3, sprintf("$sh: a %o root: exit 3", $m));
            like($r->{out}, qr/writable by others without the sticky bit/, "$sh: ... and why");
            ok(!-e $d, "$sh: ... nothing made");
        }
    }

    run_sh($shell, c_cmd($C{ship}, $dir2, 'kernel_runner.py'),
        stdin => standin_runner(sleep => 0, exit => 7));
    run_sh($shell, c_cmd($C{env}, $dir2), stdin => env_payload($token2, new_kid(), 0));
    $r = run_sh($shell, c_cmd($C{start}, $dir2)
        . '; wait $!; echo "rc=$?"; echo "--- env"; env; echo "--- set"; set');
    like($r->{out}, qr/^\d+\nrc=7\n/, "$sh: the child's exit code (7) is the command's (wait \$!)")
        or diag $r->{out};
    ok(index($r->{out}, $token2) < 0, "$sh: the token is not in the outer shell's env or variables");
    unlike($r->{out}, qr/HERMES_/, "$sh: no HERMES_ variable in the outer shell");
    like($r->{out}, qr/--- env\n.*PATH=/s, "$sh: (env and set did print)");
    is((read_json("$dir2/standin.json") // {})->{token}, $token2,
        "$sh: while the subshell's child had it");

    # the kill command: the runner's whole process group goes (a child it
    # started too), and the directory
    {
        my $dir3 = "$root/hermes_rkernel_" . new_kid();
        my $child = 3000 + int(rand 900);
        run_sh($shell, c_cmd($C{dirs}, $dir3));
        run_sh($shell, c_cmd($C{ship}, $dir3, 'kernel_runner.py'),
            stdin => standin_runner(sleep => 30, child => $child));
        run_sh($shell, c_cmd($C{env}, $dir3), stdin => env_payload(new_token(), new_kid(), 0));
        $r = run_sh($shell, c_cmd($C{start}, $dir3));
        my ($pid3) = $r->{out} =~ /^(\d+)/;
        $pid3 //= 0;
        ok(wait_until(sub { defined ready_pid($dir3) && procs_matching(qr/^sleep $child$/) }, 10),
            "$sh: a runner with a child is up");
        my $start3 = proc_start($pid3);
        my $ino3 = (lstat $dir3)[1];

        # a pid that names a process started at another time, a directory
        # with another inode: a stranger's, left alone
        $r = run_sh($shell, kill_cmd($pid3, $start3 + 1, $ino3 + 1, $dir3));
        is($r->{rc}, 0, "$sh: the kill command exits 0") or diag $r->{err};
        sleep 0.2;
        ok(pid_alive($pid3), "$sh: kill: a pid started at another time is not signalled");
        ok(procs_matching(qr/^sleep $child$/), "$sh: kill: nor its group");
        ok(-d $dir3, "$sh: kill: a directory with another inode is not removed");

        $r = run_sh($shell, kill_cmd($pid3, $start3, $ino3, $dir3));
        is($r->{rc}, 0, "$sh: the kill command exits 0") or diag $r->{err};
        ok(wait_until(sub { !pid_alive($pid3) }, 5), "$sh: kill: the runner is gone");
        ok(wait_until(sub { !procs_matching(qr/^sleep $child$/) }, 5), "$sh: kill: its child is gone (process group)");
        ok(!-e $dir3, "$sh: kill: the directory is removed");
    }

    # fail-closed steps: a non-zero status, nothing made, nothing started
    my $nope = "/proc/hermes-nope-$$/hermes_rkernel_$kid";
    $r = run_sh($shell, c_cmd($C{dirs}, $nope));
    isnt($r->{rc}, 0, "$sh: directory step under an unusable root fails");
    unlike($r->{out}, qr/^made/, "$sh: and does not say it made it");
    ok(!-e "/proc/hermes-nope-$$", "$sh: nothing created");

    my $gone = "$root/hermes_rkernel_" . new_kid();
    $r = run_sh($shell, c_cmd($C{ship}, $gone, 'kernel_runner.py'), stdin => "x\n");
    isnt($r->{rc}, 0, "$sh: shipping into a missing DIR fails");
    $r = run_sh($shell, c_cmd($C{start}, $gone));
    isnt($r->{rc}, 0, "$sh: start in a missing DIR fails");
    is($r->{out}, '', "$sh: and prints no pid");
    ok(!-e $gone, "$sh: nothing made by failed steps");
}

# the real runner, started by the replayed commands, comes up: ready with
# the printed pid, the wake FIFO, the token gone from its environment
{
    my $shell = '/bin/bash';
    my $root = "$tmp/root-real";
    make_path($root);
    my $kid = new_kid();
    my $token = new_token();
    my $dir = "$root/hermes_rkernel_$kid";
    my $r = run_sh($shell, c_cmd($C{dirs}, $dir));
    is($r->{out}, dirs_out($dir), 'real runner: dirs');
    for my $name ('kernel_runner.py', 'hermes_tools.py') {
        my $payload = slurp("$ROOT/src/remote/$name") // die "read $name";
        $r = run_sh($shell, c_cmd($C{ship}, $dir, $name), stdin => $payload);
        is($r->{rc}, 0, "real runner: shipped $name");
    }
    run_sh($shell, c_cmd($C{env}, $dir), stdin => env_payload($token, $kid, 60));
    $r = run_sh($shell, c_cmd($C{start}, $dir));
    my ($pid) = $r->{out} =~ /^(\d+)\n$/;
    ok($pid, 'real runner: start printed a pid') or diag "$r->{out} $r->{err}";
    $pid //= 0;
    ok(wait_until(sub { defined ready_pid($dir) }, 10), 'real runner: ready')
        or diag slurp("$dir/runner.log");
    is(ready_pid($dir), $pid, 'real runner: ready holds the printed pid');
    ok(-p "$dir/wake", 'real runner: wake FIFO');
    is(mode("$dir/wake"), '600', 'real runner: wake 0600');
    ok(!-e "$dir/kernel.env", 'real runner: kernel.env gone');
    my $environ = slurp("/proc/$pid/environ") // '';
    ok(index($environ, $token) < 0, 'real runner: token blanked in /proc/PID/environ');
    is(join(',', cmdlines_with($token)), '', 'real runner: token in no argv');
    kill 'KILL', -$pid if $pid > 1;
    ok(wait_until(sub { !pid_alive($pid) }, 5), 'real runner: killed by its process group');
}

sub slurp {
    my ($f) = @_;
    open my $fh, '<:raw', $f or return undef;
    local $/;
    my $c = <$fh>;
    return $c // '';
}

done_testing;
