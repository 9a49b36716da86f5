#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The release tarball: `make dist` in a throwaway clone tagged vVERSION at
# this checkout's HEAD gives the same bytes twice (the work tree changed
# in between: it archives the tag), holds every file of the tag under
# ngx_hermes-VERSION/ but CI's and nothing of build/, and refuses a
# missing tag or one whose VERSION is another; unpacked where no .git is,
# it builds the module, which says the tag's version and commit in the
# status JSON, hermes_build_info and error.log, and runs a few tests of
# its own suite. And the license: LICENSE is BSD-2-Clause, and every
# source file of the tree names it (SPDX) in its first comment. Needs git
# and a git checkout (skipped in a tarball).

use strict;
use warnings;

use Test::More;
use File::Temp ();
use Cwd qw(abs_path);

use Hermes::Test;

my $root = Hermes::Test::repo_root();

sub have { my ($c) = @_; return !system("command -v $c >/dev/null 2>&1") }

plan skip_all => 'git missing' unless have('git');
plan skip_all => 'not a git checkout (a release tarball?)'
    unless `git -C '$root' rev-parse --show-toplevel 2>/dev/null` =~ /^\Q$root\E$/m;

# a make or an ASan run above us is not the tarball's
delete @ENV{qw(MAKEFLAGS MFLAGS MAKELEVEL HERMES_MODULE HERMES_NGINX_PRELOAD
               HERMES_NO_MODULE)};

# --- the license, in LICENSE and in every source file's first comment

like(slurp("$root/LICENSE") // '',
     qr/^Redistribution and use in source and binary forms, with or without$/m,
     'LICENSE: BSD-2-Clause');

my @sources = grep {
    my $f = $_;
    -f "$root/$f" && !-l "$root/$f"
    && ($f =~ /\.(?:c|h|py|sh|pl|pm|t|html)$/
        || $f =~ m{(?:^|/)(?:Makefile|config)$}
        || (slurp("$root/$f") // '') =~ /\A#!/)
} split /\n/, `git -C '$root' ls-files`;
my @unnamed = grep {
    my ($head) = (slurp("$root/$_") // '') =~ /\A((?:.*\n){0,6})/;
    ($head // '') !~ /^(?:#|<!--|\s\*) SPDX-License-Identifier: BSD-2-Clause(?: -->)?$/m
} @sources;
is_deeply(\@unnamed, [], 'every source file names BSD-2-Clause (SPDX) in its '
          . 'first comment (' . scalar(@sources) . ' files)');

my $version = slurp("$root/VERSION");
$version =~ s/\s+\z//;
my $tag = "v$version";
my $name = "ngx_hermes-$version";

chomp(my $head = `git -C '$root' rev-parse HEAD`);
diag('the tarball is of HEAD: uncommitted changes are not in it')
    if `git -C '$root' status --porcelain --untracked-files=no`;

my $tmp = File::Temp::tempdir('hermes-dist-XXXXXXXX', TMPDIR => 1,
    CLEANUP => !$ENV{HERMES_KEEP});
$tmp = abs_path($tmp);
chmod 0755, $tmp;

# --- a clone, tagged where this checkout is

my $clone = "$tmp/clone";
is(run("git clone -q --no-hardlinks '$root' '$clone'"
       . " && git -C '$clone' checkout -q --detach $head"
       . " && git -C '$clone' tag -f $tag >/dev/null"), '', "a clone tagged $tag");

my $out = run("make -s -C '$clone' dist");
like($out, qr/^build\/\Q$name\E\.tar\.gz \(\Q$tag\E, \Q$head\E\)$/m,
     "make dist: build/$name.tar.gz of $tag") or diag($out);

my $tgz = "$clone/build/$name.tar.gz";
my $first = slurp($tgz);
ok(length $first, 'the tarball');
my ($sum) = split ' ', slurp("$tgz.sha256") // '';
chomp(my $real = `sha256sum '$tgz'`);
is($sum, (split ' ', $real)[0], 'its .sha256');

# the work tree changed, a second later: the same bytes
open my $fh, '>>', "$clone/README.md" or die "README.md: $!";
print $fh "not released\n";
close $fh;
open $fh, '>', "$clone/untracked.txt" or die;
close $fh;
sleep 1;
run("make -s -C '$clone' dist");
ok(slurp($tgz) eq $first, 'make dist again: the same bytes (reproducible)');

# refused: a tag that is not there, a tag whose VERSION is another
$out = run("make -s -C '$clone' dist DIST_TAG=v0.0.0-none 2>&1; echo rc=\$?");
like($out, qr/no tag v0\.0\.0-none.*\n.*rc=2$/s, 'no tag: refused, saying so');
run("git -C '$clone' tag -f v9.9.9 >/dev/null");
$out = run("make -s -C '$clone' dist DIST_TAG=v9.9.9 2>&1; echo rc=\$?");
like($out, qr/v9\.9\.9's VERSION says \Q$version\E.*rc=2$/s,
     'a tag of another VERSION: refused');
ok(!-e "$clone/build/ngx_hermes-9.9.9.tar.gz", '... and nothing written');

# --- what is in it

my @files = sort grep { !m{/$} } split /\n/, run("tar tzf '$tgz'");
ok(!grep({ !m{^\Q$name\E/} } @files), "every file under $name/");
s{^\Q$name\E/}{} for @files;
my @tagged = sort grep { !m{^\.ci/} }
                 split /\n/, run("git -C '$clone' ls-tree -r --name-only $tag");
is_deeply(\@files, \@tagged, "the tag's files, CI's left out ("
          . scalar(@files) . ')');
ok(!grep({ m{^build/} } @files), 'nothing of build/');
for my $f (qw(VERSION LICENSE CHANGELOG.md debian/changelog config
              src/version.sh src/remote/embed.sh src/remote/kernel_runner.py
              src/remote/hermes_agent.py src/status/embed.pl
              src/status/hermes_status.html)) {
    ok((grep { $_ eq $f } @files), "has $f");
}

# --- unpacked where no .git is: it builds and runs

my $src = "$tmp/unpacked/$name";
mkdir "$tmp/unpacked" or die;
is(run("tar xzf '$tgz' -C '$tmp/unpacked'"), '', 'unpacked');
ok(!-e "$src/.git", 'no .git in it');
like(slurp("$src/src/version.sh"), qr/^archived='\Q$head\E'$/m,
     'src/version.sh carries the tag\'s commit (export-subst)');

$out = run("make -s -C '$src' module 2>&1");
ok(-f "$src/build/ngx_http_hermes_module.so", 'make module in the unpacked tree')
    or diag($out);
like(slurp("$src/build/gen/ngx_hermes_version.c") // '',
     qr/ngx_http_hermes_commit = ngx_string\("\Q$head\E"\)/,
     'built with the tag\'s commit');

{
    local $ENV{HERMES_MODULE} = "$src/build/ngx_http_hermes_module.so";
    my $t = Hermes::Test->new;
    $t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /status {
            hermes_status;
        }
    }
CONF
    $t->run;

    my $j = $t->http(GET => '/status')->{json};
    is_deeply([ @$j{qw(module version commit)} ],
              [ 'ngx_http_hermes_module', $version, $head ],
              'status JSON: the module, the tag\'s version and commit');
    my $p = $t->http(GET => '/status?format=prometheus')->{content};
    like($p, qr/^hermes_build_info\{version="\Q$version\E",commit="\Q$head\E"\} 1$/m,
         'hermes_build_info: the same');
    like($t->error_log,
         qr/hermes: ngx_http_hermes_module\/\Q$version\E \(commit \Q$head\E\)/,
         'error.log: the same');
    $t->stop;
}

# a few quick tests of its own suite, on its own module
$out = run("cd '$src' && prove -I t/lib t/000-harness.t t/010-execute.t"
           . " t/075-metrics.t 2>&1");
like($out, qr/^Result: PASS$/m, 'the unpacked tree passes t/000, t/010, t/075')
    or diag($out);

done_testing;


# a command's stdout, its failure a failed test
sub run {
    my ($cmd) = @_;
    my $o = `$cmd`;
    ok(0, "$cmd: exit " . ($? >> 8)) if $? && $cmd !~ /rc=\$\?$/;
    return $o;
}

sub slurp {
    my ($f) = @_;
    open my $fh, '<', $f or return undef;
    local $/;
    return scalar <$fh>;
}
