#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# A local kernel holds nothing of the worker's: no listening or client
# socket, no epoll, eventfd or inotify fd, no log file.  The runner's fds
# are only what it opened itself: 0 on /dev/null, 1 and 2 on pipes it
# reads itself (a cell's output from anywhere) and an epoll of them,
# runner.log, the wake FIFO and files in its own directory.  The spawn steps' shells
# hand the runner every fd they hold (the start step's subshell becomes
# it), so a leak into them shows here too; and so does one into the
# processes a cell starts.

use strict;
use warnings;

use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $t = Hermes::Test->new(workers => 1);
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        listen 127.0.0.1:%%PORT_1%%;

        location = /x {
            hermes_execute;
        }
    }
CONF
$t->run;

# a keep-alive client connection open in the worker while kernels spawn
my $held = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(1))
    or die "connect: $!";
print $held "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n";
sleep 0.2;

my ($worker) = $t->worker_pids;
my %wfd = fds($worker);
ok(scalar(grep { /^socket:/ } values %wfd) >= 3, 'the worker holds sockets (two listening, one client)')
    or diag explain \%wfd;
ok(scalar(grep { /^anon_inode:/ } values %wfd), 'the worker holds epoll/eventfd/inotify fds');

my $r = $t->execute('/x', {session => 'fds', code => 'x = 1'});
is(($r->{result} // {})->{status}, 'success', 'a kernel runs');
my $kid = ($r->{result} // {})->{kernel}{kernel_id} // '';
my $dir = $t->kroot . "/hermes_rkernel_$kid";
my $pid = runner_pid($kid);
ok($pid, "runner $pid");

check(fds($pid), 'idle runner');
my %idle = fds($pid);
my %own = own_pipes($pid);
is($idle{0}, '/dev/null', 'fd 0: /dev/null');
ok($own{$idle{1}}, "fd 1: a pipe the runner reads itself ($idle{1})");
ok($own{$idle{2}}, "fd 2: a pipe the runner reads itself ($idle{2})");
isnt($idle{1}, $idle{2}, 'fds 1 and 2: two pipes');
ok(scalar(grep { $_ eq "$dir/runner.log" } values %idle), 'runner.log, for bytes between cells');
ok(scalar(grep { $_ eq "$dir/wake" } values %idle), 'the wake FIFO');

# while a cell runs, and in what a cell starts (inheritable fds only)
my $bg = $t->execute_async('/x', {session => 'fds', code => <<'PY'});
import os, subprocess, sys, time
ls = 'import os\nfor f in os.listdir("/proc/self/fd"):\n    print(f, os.readlink("/proc/self/fd/" + f))'
out = subprocess.run([sys.executable, '-c', ls],
                     capture_output=True, text=True, close_fds=False).stdout
print(out, end='', flush=True)
time.sleep(1.5)
PY
ok(wait_until(sub { -e "$dir/cells/cell_out_000002" }, 5), 'the cell runs');
sleep 0.5;
check(fds($pid), 'runner during a cell');
$r = $bg->wait(15);
is(($r->{result} // {})->{status}, 'success', 'the cell ran');
my %child = map { split / /, $_, 2 } split /\n/, ($r->{result} // {})->{output} // '';
ok(scalar keys %child >= 3, 'a process the cell started lists its fds');
# its own 0-2 are subprocess's pipes; the fd that lists them is its own
delete @child{0, 1, 2};
delete $child{$_} for grep { $child{$_} =~ m{^/proc/} } keys %child;
check(%child, 'a process the cell started');

close $held;
$t->stop;
done_testing;

###############################################################################

sub fds {
    my ($pid) = @_;
    my %fd;
    for my $f (glob "/proc/$pid/fd/*") {
        my ($n) = $f =~ m{/(\d+)$} or next;
        my $l = readlink $f;
        $fd{$n} = $l if defined $l;
    }
    return %fd;
}

# the pipes of which the process holds both the read and the write end
sub own_pipes {
    my ($pid) = @_;
    my (%fd, %ends) = fds($pid);
    for my $n (grep { $fd{$_} =~ /^pipe:/ } keys %fd) {
        open my $fh, '<', "/proc/$pid/fdinfo/$n" or next;
        my ($flags) = join('', <$fh>) =~ /^flags:\s*(\d+)/m or next;
        $ends{$fd{$n}}{oct($flags) & 3} = 1;
    }
    return map { $_ => 1 } grep { $ends{$_}{0} && $ends{$_}{1} } keys %ends;
}

# the epoll fds among %$fd that watch the process's own pipes (%$own)
# and nothing else (the runner's check whether fds 1 and 2 hold bytes):
# fd => 1.  By inode, not fd number: an epoll made elsewhere names the
# fds of its maker.
sub own_epolls {
    my ($pid, $fd, $own) = @_;
    my %pipe = map { /^pipe:\[(\d+)\]$/ ? ($1 => 1) : () } keys %$own;
    my %ok;
    for my $n (grep { $fd->{$_} eq 'anon_inode:[eventpoll]' } keys %$fd) {
        open my $fh, '<', "/proc/$pid/fdinfo/$n" or next;
        my @ino = map { hex } join('', <$fh>) =~ /^tfd:.*\bino:([0-9a-f]+)/mg;
        $ok{$n} = 1 if @ino && !grep { !$pipe{$_} } @ino;
    }
    return %ok;
}

sub check {
    my $name = pop;
    my %fd = @_;
    # the runner's own pipes and its epoll of them; not in its children
    my %own = $name =~ /runner/ ? own_pipes($pid) : ();
    my %epoll = $name =~ /runner/ ? own_epolls($pid, \%fd, \%own) : ();
    my @theirs = grep { !$own{$fd{$_}} && !$epoll{$_} } sort { $a <=> $b } keys %fd;
    my @bad = map { "$_ -> $fd{$_}" }
              grep { $fd{$_} ne '/dev/null' && index($fd{$_}, "$dir/") != 0 } @theirs;
    is(join(', ', @bad), '', "$name: every fd is /dev/null, in its own dir, its own pipe or its epoll of them");
    my @leak = grep { /^(?:socket|anon_inode|pipe):/ } map { $fd{$_} } @theirs;
    is("@leak", '', "$name: no socket, anon_inode or pipe of the worker's");
}
