#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The lockdown invariants (docs/security.md) on the local backend: modes on
# disk, kernel.env gone, the token in no argv, no outer environment and no
# log line, code never on a command line, a failed directory step ships
# nothing and starts nothing.

use strict;
use warnings;

use Test::More;
use POSIX ();
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new(error_log_level => 'debug');
mkdir $t->prefix . '/notadir-parent';
# a root that goes bad after nginx -t checked it: "afile" becomes a file
mkdir $t->prefix . '/afile', 0711;
mkdir $t->prefix . '/afile/kernels', 0711;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /v1/execute {
            hermes_execute;
        }

        location = /v1/broken {
            hermes_execute;
            hermes_backend local root=%%PREFIX%%/afile/kernels;
        }
    }
CONF
$t->run;
system('rm', '-rf', $t->prefix . '/afile') == 0 or die;
open my $fh, '>', $t->prefix . '/afile' or die; close $fh;

# Watch every process's argv while kernels spawn and cells run: nothing
# that looks like the token or the code may ever be on a command line.
my $marker = 'MARKER' . int(rand(1e9)) . 'CODE';
my $watch_file = $t->prefix . '/argv-watch';
my $watcher = fork // die;
if ($watcher == 0) {
    my %seen;
    my $end = time + 30;
    while (time < $end && !-e "$watch_file.stop") {
        my $all = all_cmdlines();
        for my $pid (keys %$all) {
            my $cmd = $all->{$pid};
            next unless $cmd =~ /HERMES_RPC_TOKEN|[0-9a-f]{64}|\Q$marker\E/;
            (my $shown = $cmd) =~ s/\0/ /g;
            $seen{"pid $pid: $shown"}++;
        }
    }
    open my $out, '>', $watch_file or die;
    print $out "$_\n" for keys %seen;
    close $out;
    POSIX::_exit(0);
}

my @kernels;
for my $s (1 .. 3) {
    my $r = $t->execute('/v1/execute', { session => "lock$s",
        code => "secret_code = '$marker'\nprint('ok')" });
    is($r->{result}{status}, 'success', "session lock$s spawned and ran");
    push @kernels, $r->{result}{kernel}{kernel_id};
}

# modes while a cell runs
# (a request too large for the wake FIFO, so it is a file: its mode too)
my $bg = $t->execute_async('/v1/execute', { session => 'lock1',
    code => "import time\nprint('x' * 10, flush=True)\ntime.sleep(1.5)\n#"
        . ('p' x 5000) });

my $dir = $t->kroot . "/hermes_rkernel_$kernels[0]";
ok(wait_until(sub { -e "$dir/cells/cell_out_000002" }, 5), 'cell running');

sub mode { (stat $_[0])[2] & 07777 }

is(sprintf('%o', mode($dir)), '700', 'kernel dir 0700');
is(sprintf('%o', mode("$dir/cells")), '700', 'cells/ 0700');
is(sprintf('%o', mode("$dir/rpc")), '700', 'rpc/ 0700');
ok(!-e "$dir/kernel.env", 'kernel.env removed after it was sourced');

my @files;
for my $d ($dir, "$dir/cells", "$dir/rpc") {
    opendir my $dh, $d or die;
    push @files, map { "$d/$_" } grep { !/^\.\.?$/ && !-d "$d/$_" } readdir $dh;
}
ok(scalar(grep { m{/kernel_runner\.py$} } @files), 'runner shipped');
ok(scalar(grep { m{/cell_req_000002\.json$} } @files), 'cell request present');
for my $f (sort @files) {
    my $rel = substr $f, length($dir) + 1;
    is(sprintf('%o', mode($f)), '600', "$rel is 0600");
}

$bg->wait;

# the token: 32 random bytes, hex; the kernel's own code can read it
my %token;
for my $s (1 .. 3) {
    my $r = $t->execute('/v1/execute', { session => "lock$s",
        code => "import hermes_tools, os\nprint(hermes_tools._token, os.getpid())" });
    my ($tok, $pid) = split ' ', $r->{result}{output};
    $token{$tok} = $pid;
}
is(scalar keys %token, 3, 'three kernels, three tokens');
ok(!grep({ !/^[0-9a-f]{64}$/ } keys %token), 'each token is 32 bytes (64 hex)');

my $envs = all_environs();
my $cmds = all_cmdlines();
for my $tok (keys %token) {
    my @in_env = grep { index($envs->{$_}, $tok) >= 0 } keys %$envs;
    is("@in_env", '', 'token in no process environment (nginx, shells, the runner itself)');
    my @in_argv = grep { index($cmds->{$_}, $tok) >= 0 } keys %$cmds;
    is("@in_argv", '', 'token in no argv now');
    ok(index($t->error_log, $tok) < 0, 'token in no error.log line');
}

# the cells did not leak the token into what they run
my $r = $t->execute('/v1/execute', { session => 'lock2',
    code => "import os, subprocess\nprint(os.environ.get('HERMES_RPC_TOKEN'))\n"
          . "print('HERMES_RPC' in subprocess.run(['env'], capture_output=True, text=True).stdout)" });
is($r->{result}{output}, "None\nFalse\n", 'token not in the environment cells and their children see');

open my $stop, '>', "$watch_file.stop"; close $stop;
waitpid $watcher, 0;
open my $in, '<', $watch_file or die;
my @leaks = <$in>;
is(scalar @leaks, 0, 'no argv ever held the token or the code while spawning and running')
    or diag "argv: @leaks";

# a failed directory step: 502 spawn_failed, nothing shipped, nothing started
my $before = scalar runners_under($t->prefix);
$r = $t->execute('/v1/broken', { session => 'nowhere', code => 'print(1)' });
is($r->{status}, 502, 'failed directory setup: 502');
is($r->{json}{error}{code}, 'spawn_failed', 'spawn_failed');
is(scalar runners_under($t->prefix), $before, 'no kernel started');
ok(!-e $t->prefix . '/afile/kernels', 'nothing made under the bad root');
like($t->error_log, qr/spawning a kernel for session "nowhere" failed: directory setup/,
    'error.log names the failed step');

$t->stop;
done_testing;
