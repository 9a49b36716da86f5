package Hermes::Sshd;

# SPDX-License-Identifier: BSD-2-Clause
# A real OpenSSH sshd on 127.0.0.1 for the ssh backend's tests.
#
#   use Hermes::Sshd;
#   my $why = Hermes::Sshd->unavailable;   # undef, or why sshd can't be used
#   plan skip_all => $why if $why;
#   my $sshd = Hermes::Sshd->new(dir => $t->prefix . '/ssh', port => $t->port(5));
#   $sshd->start;
#   $sshd->identity;          # client private key (0600), in authorized_keys
#   $sshd->known_hosts;       # "[127.0.0.1]:PORT ssh-ed25519 ..." (the right key)
#   $sshd->bad_known_hosts;   # the same host with a WRONG key
#   $sshd->empty_known_hosts; # an empty file: the host is unknown
#   $sshd->authorize($other->identity_pub);   # one client key for two hosts
#   my ($rc, $out, $err) = $sshd->ssh_cmd('id -u', stdin => '...');
#   $sshd->stop;              # TERM the listener, KILL its connection processes
#   $sshd->freeze; $sshd->thaw;   # SIGSTOP/SIGCONT listener and connections: a hung host
#   $sshd->commands;          # with record => 1: every command clients ran, in order
#   $sshd->log;               # what sshd logged (LogLevel VERBOSE)
#
# Options of new: dir (made 0700; default a temp dir), port (required),
# real_home => 1: keep the user's own HOME.  By default sessions get
# HOME=<dir>/home (empty, via SetEnv), so the login shell sources no
# ~/.bashrc: on a machine whose root .bashrc runs `pyenv init` that costs
# ~0.5 s per command and puts a pyenv shim first on PATH; with the empty
# HOME, sessions see sshd's default PATH and /usr/bin/python3, as on a
# plain Debian kernel host.
# record => 1: a ForceCommand wrapper appends every command a client asks
# for (SSH_ORIGINAL_COMMAND) as one JSON string a line to $sshd->commands_file,
# then execs `bash -c COMMAND`: the commands a client sends become checkable
# (what the module runs over ssh) while behaving as without the wrapper.
# The module's kernel-host agent (a command naming hermes_agent.py) runs
# the commands it is sent (EXEC frames) through the same recording, one
# line each after the agent's own: a shim between sshd and the agent swaps
# the agent's /bin/sh for a wrapper that records and runs the hook, and
# runs the wrapper first for the script's steps the agent does itself
# (KERNEL frames: "dir", "ship"), recorded as the script's command.
# With script_steps => 1 those steps run as the script instead, through
# the same wrapper: a test's fake programs on the session's PATH then
# take part in them, as they do in the steps the agent never does itself.
# With record => 1, an executable $sshd->hook_file (absent by default) runs
# before each command, with SSH_ORIGINAL_COMMAND set: a co-tenant acting at
# exactly the moment the module's command is about to run.
#
# Perl core modules only.  Stopped in DESTROY and END by the process that
# made it (forked children never stop it).

use strict;
use warnings;
no warnings 'exec';

use File::Temp ();
use File::Path qw(make_path);
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use POSIX qw(:sys_wait_h);
use JSON::PP ();
use Scalar::Util qw(weaken refaddr);
use Time::HiRes qw(time sleep);

our $SSHD   = '/usr/sbin/sshd';
our $KEYGEN = '/usr/bin/ssh-keygen';
our $SSH    = '/usr/bin/ssh';

my %LIVE;

# undef if sshd can be used here, else the reason (for skip_all)
sub unavailable {
    return "$SSHD not found (install openssh-server; `make deps` does)" unless -x $SSHD;
    return "$KEYGEN not found (install openssh-client)" unless -x $KEYGEN;
    return "$SSH not found (install openssh-client)" unless -x $SSH;
    return undef;
}

sub new {
    my ($class, %opt) = @_;
    my $why = unavailable();
    die "Hermes::Sshd: $why\n" if $why;
    die "Hermes::Sshd: port required\n" unless $opt{port};

    my $dir = $opt{dir};
    if (defined $dir) {
        make_path($dir) unless -d $dir;
    } else {
        $dir = File::Temp::tempdir('hermes-sshd-XXXXXXXX', TMPDIR => 1,
            CLEANUP => !$ENV{HERMES_KEEP});
    }
    $dir = abs_path($dir);
    chmod 0700, $dir or die "chmod $dir: $!";

    my $self = bless {
        %opt,
        dir       => $dir,
        port      => $opt{port},
        owner_pid => $$,
        pid       => undef,
    }, $class;

    $self->_keygen("$dir/host_ed25519", 'hermes-test-host');
    $self->_keygen("$dir/wrong_host_ed25519", 'hermes-test-wrong-host');
    $self->_keygen("$dir/id_ed25519", 'hermes-test-client');
    chmod 0600, "$dir/id_ed25519";

    _write("$dir/authorized_keys", _slurp("$dir/id_ed25519.pub"), 0600);

    my $hostpat = $self->host_pattern;
    _write("$dir/known_hosts", "$hostpat " . _pubkey("$dir/host_ed25519.pub") . "\n", 0600);
    _write("$dir/bad_known_hosts", "$hostpat " . _pubkey("$dir/wrong_host_ed25519.pub") . "\n", 0600);
    _write("$dir/empty_known_hosts", '', 0600);
    unless ($self->{real_home}) {
        make_path("$dir/home");
        chmod 0700, "$dir/home";
    }

    if ($self->{record}) {
        my $rec = "$dir/record-command";
        my $cf = "$dir/commands.log";
        _write($cf, '', 0600);
        # one JSON string a line (commands may hold newlines)
        _write($rec, <<"SH", 0700);
#!/bin/bash
/usr/bin/perl -MJSON::PP -e 'print JSON::PP->new->allow_nonref->ascii->encode(\$ENV{SSH_ORIGINAL_COMMAND} // ""), "\\n"' >>'$cf'
[ -x '$dir/hook' ] && '$dir/hook' </dev/null >/dev/null 2>&1
case "\${SSH_ORIGINAL_COMMAND-}" in
    sftp|internal-sftp) exec /usr/lib/openssh/sftp-server ;;
    '') exec /bin/bash -l ;;
    *hermes_agent.py*) exec /usr/bin/perl '$dir/agent-shim' ;;
esac
exec /bin/bash -c "\$SSH_ORIGINAL_COMMAND"
SH
        # the module's agent runs each command it is sent (EXEC) as
        # /bin/sh -c: the shim hands it a copy whose shell is exec-hook,
        # which records the command and runs the hook as sshd would have
        _write("$dir/agent-shim", <<"PL", 0600);
use strict;
my (\$len, \$c, \$text, \$buf) = ('', '', '', '');
while (sysread(STDIN, \$c, 1) == 1 && \$c ne "\\n") { \$len .= \$c }
while (length(\$text) < \$len) {
    sysread(STDIN, \$buf, \$len - length \$text) > 0 or exit 1;
    \$text .= \$buf;
}
\$text =~ s{\\["/bin/sh", "-c"}{["$dir/exec-hook", "-c"}g;
# the script's steps the agent does itself (KERNEL frames) go through
# exec-hook too, first (agent-prelude.py)
\$text =~ s{(\\n        try:\\n            if self\\.verb == "dir":)}{\\n        if step_hook(self):\\n            return\$1} or exit 1;
open(my \$pre, '<', '$dir/agent-prelude.py') or exit 1;
\$text = do { local \$/; <\$pre> } . \$text;
\$SIG{PIPE} = 'IGNORE';
open(my \$p, '|-', '/bin/bash', '-c', \$ENV{SSH_ORIGINAL_COMMAND}) or exit 1;
binmode \$p;
# the agent alone holds the channel's stdout: its exit is the channel's EOF
open STDOUT, '>', '/dev/null';
open STDERR, '>', '/dev/null';
\$buf = length(\$text) . "\\n" . \$text;
while (1) {
    while (length \$buf) {
        my \$n = syswrite(\$p, \$buf);
        defined \$n or exit 1;
        substr(\$buf, 0, \$n, '');
    }
    last unless sysread(STDIN, \$buf, 65536);
}
close \$p;
exit(\$? >> 8);
PL
        # before a KERNEL step: exec-hook with the step's argv, which
        # records it and runs the hook; with script_steps => 1, the step
        # is the script's, run through exec-hook (and so through the
        # programs on the session's PATH), not the agent's own
        my $script = $self->{script_steps}
            ? abs_path(dirname(__FILE__) . '/../../../src/remote/hermes_kernel.sh')
            : '';
        _write("$dir/agent-prelude.py", <<"PY", 0600);
def step_hook(step):
    import subprocess
    argv = ["$dir/exec-hook", "-c", "exit 0", "hermes", step.verb] + step.args
    if not "$script":
        subprocess.run(argv)
        return False
    with open("$script") as f:
        argv[2] = "exec 2>&1\\n" + f.read()
    p = subprocess.run(argv, input=step.data, stdout=subprocess.PIPE)
    rc = p.returncode
    step.agent.streams.pop(step.sid, None)
    step.agent.send(step.sid, b"x", jb({"status": rc if rc >= 0 else 128 - rc},
                                       p.stdout))
    return True
PY
        # a script run with arguments (sh -c SCRIPT hermes ARG...) is
        # recorded as the logs show it: "sh -c SCRIPT hermes ARG...", an
        # empty argument as ''
        _write("$dir/exec-hook", <<"SH", 0700);
#!/bin/bash
c=\$2
shift 2
if [ \$# -gt 1 ]; then
    shown="sh -c SCRIPT"
    for a in "\$@"; do shown="\$shown \${a:-"''"}"; done
else
    shown=\$c
fi
/usr/bin/perl -MJSON::PP -e 'print JSON::PP->new->allow_nonref->ascii->encode(\$ARGV[0]), "\\n"' -- "\$shown" >>'$cf'
[ -x '$dir/hook' ] && SSH_ORIGINAL_COMMAND="\$shown" '$dir/hook' </dev/null >/dev/null 2>&1
exec /bin/bash -c "\$c" "\$@"
SH
    }

    make_path('/run/sshd');    # sshd -t wants its privilege separation dir
    chmod 0755, '/run/sshd';
    $self->_write_config;

    $LIVE{refaddr $self} = $self;
    weaken $LIVE{refaddr $self};
    return $self;
}

sub dir               { $_[0]{dir} }
sub hook_file         { "$_[0]{dir}/hook" }
sub port              { $_[0]{port} }
sub pid               { $_[0]{pid} }
sub identity          { "$_[0]{dir}/id_ed25519" }
sub identity_pub      { "$_[0]{dir}/id_ed25519.pub" }
sub host_key_pub      { "$_[0]{dir}/host_ed25519.pub" }
sub known_hosts       { "$_[0]{dir}/known_hosts" }
sub bad_known_hosts   { "$_[0]{dir}/bad_known_hosts" }
sub empty_known_hosts { "$_[0]{dir}/empty_known_hosts" }
sub config_file       { "$_[0]{dir}/sshd_config" }
sub log_file          { "$_[0]{dir}/sshd.log" }
sub pid_file          { "$_[0]{dir}/sshd.pid" }
sub commands_file     { "$_[0]{dir}/commands.log" }
sub home              { $_[0]{real_home} ? undef : "$_[0]{dir}/home" }
sub log               { _slurp($_[0]->log_file) // '' }

# also accept the client key whose public half is in $pubfile (another
# Sshd's identity_pub): one identity for several hosts
sub authorize {
    my ($self, $pubfile) = @_;
    my $pub = _slurp($pubfile) // die "read $pubfile: $!";
    $pub .= "\n" unless $pub =~ /\n\z/;
    open my $fh, '>>', "$self->{dir}/authorized_keys" or die "append authorized_keys: $!";
    print $fh $pub;
    close $fh or die "close authorized_keys: $!";
    return $self;
}

# several hosts, one client: $self's identity is accepted by each of
# @others, and FILE (0600) holds all their host keys; returns FILE
sub share_with {
    my ($self, $file, @others) = @_;
    $_->authorize($self->identity_pub) for @others;
    open my $kh, '>', $file or die "write $file: $!";
    for my $s ($self, @others) {
        print {$kh} _slurp($s->known_hosts) // die "read " . $s->known_hosts . ": $!";
    }
    close $kh or die "close $file: $!";
    chmod 0600, $file;
    return $file;
}

# how known_hosts names this host: "[127.0.0.1]:PORT", or plain for port 22
sub host_pattern {
    my ($self) = @_;
    return $self->{port} == 22 ? '127.0.0.1' : "[127.0.0.1]:$self->{port}";
}

# every command a client asked for (with record => 1), in order
sub commands {
    my ($self) = @_;
    my $c = _slurp($self->commands_file) // return ();
    my $j = JSON::PP->new->allow_nonref;
    return map { my $v = eval { $j->decode($_) }; defined $v ? $v : "UNDECODABLE: $_" }
        grep { length } split /\n/, $c;
}

sub _keygen {
    my ($self, $file, $comment) = @_;
    unlink $file, "$file.pub";
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', '/dev/null';
        exec $KEYGEN, '-q', '-t', 'ed25519', '-N', '', '-C', $comment, '-f', $file;
        POSIX::_exit(127);
    }
    waitpid $pid, 0;
    die "ssh-keygen -f $file failed: $?\n" if $? || !-s $file || !-s "$file.pub";
}

sub _pubkey {
    my ($file) = @_;
    my $p = _slurp($file) // die "read $file: $!";
    my ($type, $b64) = split ' ', $p;
    die "bad public key in $file\n" unless $type && $b64;
    return "$type $b64";
}

sub _config_text {
    my ($self, $extra) = @_;
    my $d = $self->{dir};
    my $c = <<"CONF";
# written by t/lib/Hermes/Sshd.pm
ListenAddress 127.0.0.1
Port $self->{port}
HostKey $d/host_ed25519
AuthorizedKeysFile $d/authorized_keys
PidFile $d/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin yes
AllowAgentForwarding no
X11Forwarding no
PermitUserEnvironment no
PrintMotd no
PrintLastLog no
UseDNS no
LogLevel VERBOSE
MaxStartups 100
MaxSessions 100
LoginGraceTime 30
CONF
    $c .= "SetEnv HOME=$d/home\n" unless $self->{real_home};
    $c .= "ForceCommand $d/record-command\n" if $self->{record};
    $c .= $extra if defined $extra;
    return $c;
}

sub _write_config {
    my ($self) = @_;
    my $f = $self->config_file;
    # OpenSSH >= 9.8 penalizes addresses that fail (a test that presents a
    # wrong host key makes the client hang up): off, where it exists
    _write($f, $self->_config_text("PerSourcePenalties no\n"), 0600);
    return if _run_quiet($SSHD, '-t', '-f', $f) == 0;
    _write($f, $self->_config_text, 0600);
    my $rc = _run_quiet($SSHD, '-t', '-f', $f);
    die "sshd -t -f $f failed ($rc): " . `$SSHD -t -f '$f' 2>&1` if $rc;
}

sub _run_quiet {
    my @cmd = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', '/dev/null';
        open STDERR, '>', '/dev/null';
        exec { $cmd[0] } @cmd;
        POSIX::_exit(127);
    }
    waitpid $pid, 0;
    return $? >> 8;
}

###############################################################################

sub running { my ($self) = @_; return $self->{pid} && _alive($self->{pid}) }

sub start {
    my ($self, %o) = @_;
    return $self if $self->running;
    my $timeout = $o{timeout} // 10;
    make_path('/run/sshd');
    chmod 0755, '/run/sshd';
    die "port $self->{port} is already in use\n" if _listening($self->{port});

    my $log = $self->log_file;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        POSIX::setsid();
        _die_with_parent();
        open STDIN, '<', '/dev/null';
        open STDOUT, '>>', $log or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        if ($self->{hide}) {
            # a host without these paths: an empty tmpfs over each, in a
            # mount namespace of this sshd's own
            exec 'unshare', '--mount', '--propagation', 'private', '/bin/sh', '-c',
                'c=$1; shift; for d in "$@"; do mount -t tmpfs hermes-hidden "$d" || exit 1; done; '
                . "exec $SSHD -D -e -f \"\$c\"",
                'sh', $self->config_file, @{ $self->{hide} };
            POSIX::_exit(127);
        }
        exec { $SSHD } $SSHD, '-D', '-e', '-f', $self->config_file;
        POSIX::_exit(127);
    }
    $self->{pid} = $pid;
    my $ok = _wait_until(sub { _listening($self->{port}) || !_reap_ok($pid) }, $timeout);
    unless ($ok && _listening($self->{port}) && $self->running) {
        my $l = $self->log;
        $self->stop;
        die "sshd on port $self->{port} did not come up within $timeout s\n--- sshd.log ---\n$l";
    }
    return $self;
}

# pids of every process below the listener (the per-connection sshd
# processes and what they run, as long as they are still its descendants)
sub descendants {
    my ($self, $root) = @_;
    $root //= $self->{pid} or return ();
    my %kids;
    opendir my $dh, '/proc' or return ();
    for my $p (grep { /^\d+$/ } readdir $dh) {
        my $st = _slurp("/proc/$p/stat") // next;
        next unless $st =~ /^\d+ \(.*\) \S (\d+)/s;
        push @{ $kids{$1} }, $p;
    }
    closedir $dh;
    my @out;
    my @q = ($root);
    while (@q) {
        my $p = shift @q;
        for my $c (@{ $kids{$p} || [] }) { push @out, $c; push @q, $c }
    }
    return @out;
}

# stop(keep_sessions => 1) leaves established connections alone (like
# `systemctl stop ssh`); by default they are killed too, as when the host
# goes away
sub stop {
    my ($self, %o) = @_;
    return $self unless $$ == $self->{owner_pid};
    my $pid = $self->{pid} or return $self;
    my @kids = $o{keep_sessions} ? () : $self->descendants($pid);
    kill 'TERM', $pid;
    kill 'KILL', $_ for @kids;
    unless (_wait_until(sub { !_reap_ok($pid) }, 5)) {
        kill 'KILL', $pid;
        _wait_until(sub { !_reap_ok($pid) }, 5);
    }
    $self->{pid} = undef;
    _wait_until(sub { !_listening($self->{port}) }, 5);
    return $self;
}

# SIGSTOP / SIGCONT the listener and its connections: a host that hangs
sub freeze {
    my ($self) = @_;
    my $pid = $self->{pid} or return;
    kill 'STOP', $pid, $self->descendants($pid);
}

sub thaw {
    my ($self) = @_;
    my $pid = $self->{pid} or return;
    kill 'CONT', $pid, $self->descendants($pid);
}

sub restart { my ($self) = @_; $self->stop; $self->start }

###############################################################################

# the argv of the openssh client for this server, ending before the command
sub ssh_argv {
    my ($self, %o) = @_;
    return ($SSH, '-F', '/dev/null',
        '-i', $self->identity,
        '-o', 'UserKnownHostsFile=' . ($o{known_hosts} // $self->known_hosts),
        '-o', 'GlobalKnownHostsFile=/dev/null',
        '-o', 'StrictHostKeyChecking=yes',
        '-o', 'IdentitiesOnly=yes',
        '-o', 'BatchMode=yes',
        '-o', 'ConnectTimeout=' . ($o{connect_timeout} // 5),
        '-o', 'LogLevel=ERROR',
        '-p', $self->{port}, 'root@127.0.0.1');
}

# ssh_cmd($cmd, stdin => $bytes, timeout => 20, known_hosts => $file)
# list context: ($exit_code, $stdout, $stderr); scalar: $stdout.
# Exit code 255 is ssh's own failure; -1 a timeout (the client is killed).
sub ssh_cmd {
    my ($self, $cmd, %o) = @_;
    my $timeout = $o{timeout} // 20;
    my $tmp = File::Temp->newdir('hermes-sshcmd-XXXXXXXX', TMPDIR => 1);
    my ($in, $out, $err) = map { "$tmp/$_" } qw(in out err);
    _write($in, $o{stdin} // '', 0600);
    my @argv = ($self->ssh_argv(%o), '--', $cmd);
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDIN, '<', $in or POSIX::_exit(127);
        open STDOUT, '>', $out or POSIX::_exit(127);
        open STDERR, '>', $err or POSIX::_exit(127);
        exec { $argv[0] } @argv;
        POSIX::_exit(127);
    }
    my $rc;
    my $done = _wait_until(sub {
        my $w = waitpid($pid, WNOHANG);
        if ($w == $pid) { $rc = $? & 127 ? 128 + ($? & 127) : $? >> 8; return 1 }
        return $w == -1;
    }, $timeout);
    unless ($done) {
        kill 'KILL', $pid;
        waitpid $pid, 0;
        $rc = -1;
    }
    my @r = ($rc // -1, _slurp($out) // '', _slurp($err) // '');
    return wantarray ? @r : $r[1];
}

###############################################################################

sub DESTROY {
    my ($self) = @_;
    local ($@, $!, $?);
    eval { $self->stop if $self->{owner_pid} && $$ == $self->{owner_pid} };
}

END {
    my $status = $?;
    for my $s (values %LIVE) {
        next unless defined $s;
        eval { $s->stop if $$ == $s->{owner_pid} };
    }
    $? = $status;
}

# prctl(PR_SET_PDEATHSIG, SIGTERM): a test killed hard (no END) does not
# leave its sshd listening; kept across exec (sshd is not setuid)
sub _die_with_parent {
    my %nr = (x86_64 => 157, aarch64 => 167, i686 => 172, i386 => 172);
    my $n = $nr{(POSIX::uname())[4]} or return;
    syscall($n, 1, 15);
}

# is something listening on 127.0.0.1:PORT (or 0.0.0.0), per /proc/net/tcp
sub _listening {
    my ($port) = @_;
    my $hex = sprintf '%04X', $port;
    my $t = _slurp('/proc/net/tcp') // return 0;
    for my $line (split /\n/, $t) {
        my @f = split ' ', $line;
        next unless @f > 3 && $f[3] eq '0A';
        return 1 if $f[1] eq "0100007F:$hex" || $f[1] eq "00000000:$hex";
    }
    return 0;
}

# true while our child $pid has not been reaped (and reaps it if it ended)
sub _reap_ok {
    my ($pid) = @_;
    my $w = waitpid($pid, WNOHANG);
    return 0 if $w == $pid || $w == -1;
    return 1;
}

sub _alive {
    my ($pid) = @_;
    return 0 unless $pid && kill 0, $pid;
    my $st = _slurp("/proc/$pid/stat") // return 0;
    return $st !~ /^\d+ \(.*\) [ZX] /s;
}

sub _wait_until {
    my ($cond, $timeout) = @_;
    my $deadline = time + $timeout;
    while (1) {
        my $v = $cond->();
        return $v if $v;
        return $v if time >= $deadline;
        sleep 0.02;
    }
}

sub _write {
    my ($file, $content, $mode) = @_;
    open my $fh, '>:raw', $file or die "write $file: $!";
    print $fh $content;
    close $fh or die "close $file: $!";
    chmod $mode, $file if defined $mode;
}

sub _slurp {
    my ($f) = @_;
    open my $fh, '<:raw', $f or return undef;
    local $/;
    my $c = <$fh>;
    return $c // '';
}

1;
