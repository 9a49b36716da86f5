#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A spawn that fails at any step leaves nothing behind and says why in one
# honest error.log line.  The kernel host is the test sshd, whose sessions
# find fake mkdir, head and python3 first on PATH; each fake does its real
# job until its switch file says otherwise:
#
# - mkdir leaves the kernel dir 0755, or cells/ 0755, or gives it to
#   another uid, or makes a symlink to a directory elsewhere: the
#   directory step's type/owner/mode check refuses it, so 502
#   spawn_failed, nothing shipped, nothing started, and the path removed
#   (it is ours), but never what a symlink points to;
# - head fails halfway through kernel.env (part of the token on disk), or
#   python3 is missing: 502 spawn_failed, and no kernel dir, no
#   kernel.env and no process left;
# - mkdir prints 10 kB of junk with newlines, control bytes and a forged
#   "[alert]" line: error.log gets exactly one line for the failure, the
#   junk escaped in it, cut to its buffer, and nothing past the buffer.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);
use File::Find ();

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $why = Hermes::Sshd->unavailable;
plan skip_all => $why if $why;

# the junk's forged "[alert]" is in error.log, escaped, inside the one
# line of that failure (checked below): not an alert of nginx's
my $t = Hermes::Test->new(workers => 1,
    allow_log_re => qr/^\S+ \S+ \[error\] .*session "junk" failed: directory setup: exit code 5: "JUNK\\x0a/);
my $p = $t->prefix;
my $root = $t->kroot;

# the agent does the directory and ship steps itself; here they run as
# the script, so that the fakes below take part in them as well
my $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5), record => 1,
    script_steps => 1);

# the fakes, and their switches in $p/fake/TOOL
my $bin = "$p/fakebin";
my $sw = "$p/fake";
mkdir $_, 0755 or die "mkdir $_: $!" for $bin, $sw;

my $elsewhere = "$p/elsewhere";
mkdir $elsewhere, 0700 or die;
write_file("$elsewhere/keep", "keep\n");

my $junk = "JUNK\n\x01\x07\x1b[2J\r\n"
    . "2026/01/01 00:00:00 [alert] 1#1: forged by the kernel host\n"
    . "\xff\"\\ " . ('z' x 10000) . "\x00\nJUNK-END\n";
write_file("$p/junk", $junk);

write_file("$bin/mkdir", <<"SH", 0755);
#!/bin/bash
how=\$(cat '$sw/mkdir' 2>/dev/null)
[ -z "\$how" ] && exec /usr/bin/mkdir "\$@"
# kernel dirs only (not the journal beside them)
case "\$*" in *hermes_rkernel_*) ;; *) exec /usr/bin/mkdir "\$@" ;; esac
paths=()
while [ \$# -gt 0 ]; do
    case "\$1" in
        -m) shift 2 ;;
        --) shift ;;
        *) paths+=("\$1"); shift ;;
    esac
done
case "\$how" in
    junk)
        cat '$p/junk'; exit 1 ;;
    mode755)
        exec /usr/bin/mkdir -m 755 -- "\${paths[@]}" ;;
    cells755)
        for d in "\${paths[@]}"; do
            case "\$d" in
                */cells) /usr/bin/mkdir -m 755 -- "\$d" ;;
                *) /usr/bin/mkdir -m 700 -- "\$d" ;;
            esac || exit 1
        done ;;
    nobody)
        /usr/bin/mkdir -m 700 -- "\${paths[@]}" || exit 1
        chown nobody -- "\${paths[@]}" ;;
    symlink)
        for d in "\${paths[@]}"; do
            case "\$d" in
                */hermes_rkernel_*/*) /usr/bin/mkdir -m 700 -- "\$d" ;;
                *) [ -e "\$d" ] && exit 1; ln -s '$elsewhere' "\$d" ;;
            esac || exit 1
        done ;;
esac
SH

# the ship step writes each file with "head -c LEN >FILE": the file is
# what its stdout is
write_file("$bin/head", <<"SH", 0755);
#!/bin/bash
if [ "\$(cat '$sw/head' 2>/dev/null)" = envfail ]; then
    case "\$(readlink /proc/\$\$/fd/1)" in
        */kernel.env)
            /usr/bin/head -c 20
            echo "head: error writing 'standard output': Input/output error" >&2
            exit 1 ;;
    esac
fi
exec /usr/bin/head "\$@"
SH

write_file("$bin/python3", <<"SH", 0755);
#!/bin/bash
if [ "\$(cat '$sw/python3' 2>/dev/null)" = missing ]; then
    echo "bash: python3: command not found" >&2; exit 127
fi
exec /usr/bin/python3 "\$@"
SH

# sessions find the fakes first (sshd honours only the first SetEnv line)
{
    my $cf = $s->config_file;
    my $c = read_file($cf);
    $c =~ s{^SetEnv (.*)$}{SetEnv $1 PATH=$bin:/usr/bin:/bin}m
        or die "no SetEnv line in $cf";
    write_file($cf, $c, 0600);
}

$s->start;

is(scalar $s->ssh_cmd('command -v mkdir head python3'),
    "$bin/mkdir\n$bin/head\n$bin/python3\n", 'the fakes come first on PATH');

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        hermes_cell_timeout 20s;

        location = /x {
            hermes_execute;
            # python3 from the login's PATH (the fake's), not the sandbox's
            hermes_sandbox off;
            hermes_backend ssh host=127.0.0.1:${\ $s->port } root=$root
                user=root identity=${\ $s->identity }
                known_hosts=${\ $s->known_hosts } connect_timeout=3s;
        }
    }
CONF
$t->run;

# the fakes pass through when off: a kernel starts and runs
{
    my $r = $t->execute('/x', {session => 'plain', code => 'print(6 * 7)'});
    is(($r->{result} // {})->{output}, "42\n", 'no fake on: a kernel runs')
        or diag explain $r;
    my @d = $t->kroot_dirs;
    is(scalar @d, 1, '... in one kernel dir');
}

my %before = map { $_ => 1 } $t->kroot_dirs;

###############################################################################
# the directory step's check: a kernel dir that is not an owner-only
# directory of ours is refused, nothing shipped or started, and removed

my @cases = (
    ['mode755',  qr/not an owner-only directory of uid \d+: "directory:\d+:755"/],
    ['cells755', qr/not an owner-only directory of uid \d+: "directory:\d+:755"/],
    ['symlink',  qr/not an owner-only directory of uid \d+: "symbolic link:/],
);
push @cases, ['nobody', qr/not an owner-only directory of uid 0: "directory:65534:700"/]
    if $> == 0;

for my $case (@cases) {
    my ($how, $says) = @$case;
    my $n0 = () = $s->commands;
    my $off = length $t->error_log;
    fake(mkdir => $how);
    my $r = $t->execute('/x', {session => "dir-$how", code => 'print(1)'});
    fake(mkdir => '');

    is($r->{status}, 502, "$how: 502");
    is(($r->{json} // {})->{error}{code}, 'spawn_failed', "$how: spawn_failed");

    my @sent = ($s->commands)[$n0 .. (() = $s->commands) - 1];
    my ($dir, $kid) = map { m{^sh -c SCRIPT hermes dir (\S+) ([0-9a-f]{32}) } ? ("$1/hermes_rkernel_$2", $2) : () } @sent;
    ok($dir, "$how: the directory step ran") or diag explain \@sent;
    is(join("\n", grep { /^sh -c SCRIPT hermes (?:ship|start) |kernel_runner\.py|kernel\.env|setsid/ } @sent), '',
        "$how: nothing shipped, nothing started");
    ok(scalar(grep { /^sh -c SCRIPT hermes kill \S+ \Q$kid\E / } @sent), "$how: the path made is removed")
        if $dir;
    ok(!-e $dir && !-l $dir, "$how: ... and gone") if $dir;
    is(join(' ', new_dirs()), '', "$how: no kernel dir left under the root");
    is(join(' ', procs_in($root)), '', "$how: no process started in the root");
    like(substr($t->error_log, $off),
        qr/spawning a kernel for session "dir-\Q$how\E" failed: directory setup: $says/,
        "$how: error.log says why");
}

# a symlink's target is not ours: left alone, nothing shipped into it
{
    ok(-e "$elsewhere/keep", 'symlink: its target is left alone');
    opendir my $dh, $elsewhere or die;
    my @in = sort grep { !/^\.\.?$/ && !/^(?:keep|cells|rpc)$/ } readdir $dh;
    is("@in", '', 'symlink: nothing shipped into its target');
}

###############################################################################
# a later step fails: the directory goes, with the token's file

for my $case (['head', 'envfail', qr/ship: exit code 1: "head: error writing/],
              ['python3', 'missing', qr/the kernel did not start/])
{
    my ($tool, $how, $says) = @$case;
    my $off = length $t->error_log;
    fake($tool => $how);
    my $r = $t->execute('/x', {session => "late-$how", code => 'print(1)'});
    fake($tool => '');

    is($r->{status}, 502, "$tool $how: 502");
    is(($r->{json} // {})->{error}{code}, 'spawn_failed', "$tool $how: spawn_failed");
    like(substr($t->error_log, $off),
        qr/spawning a kernel for session "late-\Q$how\E" failed: $says/,
        "$tool $how: error.log names the step");
    is(join(' ', new_dirs()), '', "$tool $how: no kernel dir left under the root");
    my @env;
    File::Find::find({ no_chdir => 1,
        wanted => sub { push @env, $_ if m{/kernel\.env[^/]*$} } }, $root);
    is("@env", '', "$tool $how: no kernel.env left");
    ok(wait_until(sub { !procs_in($root) }, 3), "$tool $how: no process left in the root")
        or diag 'left: ' . join(' ', procs_in($root));
}

###############################################################################
# junk from the kernel host: one escaped line, nothing forged, nothing
# past the buffer

{
    my $off = length $t->error_log;
    fake(mkdir => 'junk');
    my $r = $t->execute('/x', {session => 'junk', code => 'print(1)'});
    fake(mkdir => '');

    is($r->{status}, 502, 'junk: 502');
    is(($r->{json} // {})->{error}{code}, 'spawn_failed', 'junk: spawn_failed');
    unlike($r->{content} // '', qr/JUNK|forged/, 'junk: none of it reaches the client');

    my $log = substr($t->error_log, $off);
    my @lines = split /\n/, $log;
    my @mine = grep { /session "junk"/ } @lines;
    is(scalar @mine, 1, 'junk: one error.log line for the failure')
        or diag explain \@lines;
    my @ctl = $log =~ /([^\n\x20-\x7e])/g;
    is(join('', map { sprintf '\\x%02x', ord } @ctl), '',
        'junk: no raw control or non-ASCII byte in error.log');
    is(join("\n", grep { /^2026\/01\/01 / || (/forged/ && !/session "junk"/) } @lines), '',
        'junk: no forged line');

    my ($said) = ($mine[0] // '') =~
        /failed: directory setup: exit code 5: "([^"]*)", owner: "anonymous", session: "junk", kernel: [0-9a-f]{32}$/;
    ok(defined $said, 'junk: the quoted output ends where it should (nothing past the buffer)')
        or diag $mine[0];
    $said //= '';
    my $esc = escape($junk);
    my $body = $said =~ s/\.\.\.$//r;
    ok(length $body > 100 && substr($esc, 0, length $body) eq $body,
        'junk: what is logged is the escaped output, cut')
        or diag "logged: $said\nexpect: " . substr($esc, 0, 400);
    like($said, qr/^JUNK\\x0a\\x01\\x07\\x1b\[2J\\x0d\\x0a2026\/01\/01 00:00:00 \[alert\] 1#1: forged by the kernel host\\x0a\\xff\\x22\\x5c z/,
        'junk: newlines, control bytes, quotes and backslashes as \\xNN');
    like($said, qr/z\.\.\.$/, 'junk: the cut is marked');
}

$t->stop;
$s->stop;
done_testing;

###############################################################################

# what error.log should show of kernel host text
sub escape {
    my ($s) = @_;
    $s =~ s/([^\x20-\x7e]|["\\])/sprintf '\\x%02x', ord $1/ge;
    return $s;
}

sub fake {
    my ($tool, $how) = @_;
    write_file("$sw/$tool", $how);
}

# kernel dirs made since the first, passing case
sub new_dirs { grep { !$before{$_} } $t->kroot_dirs }

# processes whose cwd is under $dir
sub procs_in {
    my ($dir) = @_;
    my @r;
    opendir my $dh, '/proc' or return ();
    for my $pid (grep { /^\d+$/ } readdir $dh) {
        my $cwd = readlink("/proc/$pid/cwd") // next;
        push @r, $pid if index($cwd, "$dir/") == 0 && !$before{$cwd};
    }
    return @r;
}

sub read_file {
    my ($f) = @_;
    open my $fh, '<:raw', $f or die "read $f: $!";
    local $/;
    return scalar <$fh>;
}

sub write_file {
    my ($f, $content, $mode) = @_;
    open my $fh, '>:raw', $f or die "write $f: $!";
    print $fh $content;
    close $fh or die "close $f: $!";
    chmod $mode, $f if defined $mode;
}
