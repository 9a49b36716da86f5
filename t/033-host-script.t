#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# src/remote/hermes_kernel.sh alone, run as the module runs it (sh -c
# SCRIPT hermes VERB ARG...), with hostile arguments and a hostile root:
# an id that is not exactly 32 lowercase hex is refused before any use,
# values are never shell text, the journal is trusted only when it is this
# user's 0700 dir, and recovery acts only on journal entries of this
# gateway under another zone instance, on the dir they name only while it
# has the journaled inode.  Everything in this test's own temp dir.

use strict;
use warnings;

use Test::More;
use File::Temp ();
use POSIX ();
use Time::HiRes qw(sleep);

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

sub run_script {
    my @args = @_;
    my $pid = open(my $out, '-|') // die "fork: $!";
    if (!$pid) {
        open STDERR, '>&', \*STDOUT;
        chdir $tmp or POSIX::_exit(127);
        exec '/bin/sh', '-c', $script, 'hermes', @args or POSIX::_exit(127);
    }
    local $/;
    my $text = <$out> // '';
    close $out;
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

sub slurp { my ($f) = @_; open my $h, '<', $f or return undef; local $/; return <$h> }

sub rewrite {
    my ($f, $text) = @_;
    open my $h, '>', $f or die "$f: $!";
    print $h $text;
    close $h;
}

done_testing;
