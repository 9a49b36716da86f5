#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# The Debian package: `make deb` builds libnginx-mod-http-hermes; unpacked
# into a throwaway root it has the module, its load snippet, the docs and
# the kernel-host Python, depends on the nginx ABI this nginx provides, and
# the installed .so, loaded by the installed snippet, runs a cell with the
# installed example configuration.

use strict;
use warnings;

use Test::More;
use File::Temp ();
use File::Compare qw(compare);

use Hermes::Test;

my $root = Hermes::Test::repo_root();

sub have { my ($c) = @_; return !system("command -v $c >/dev/null 2>&1") }

plan skip_all => 'dpkg-buildpackage missing (Debian package dpkg-dev)'
    unless have('dpkg-buildpackage');
plan skip_all => 'debhelper missing (Debian package debhelper)'
    unless have('dh');
plan skip_all => 'dh-sequence-nginx missing (Debian package nginx-dev)'
    unless -e '/usr/share/perl5/Debian/Debhelper/Sequence/nginx.pm';

# the version: VERSION's, in debian/changelog made from CHANGELOG.md
my $version = slurp("$root/VERSION") // '';
$version =~ s/\s+\z//;
like($version, qr/^\d+\.\d+\.\d+$/, "VERSION: $version");
my $made = `cd '$root' && debian/gen-changelog CHANGELOG.md VERSION debian/control`;
is($?, 0, 'debian/gen-changelog runs');
ok($made eq (slurp("$root/debian/changelog") // ''),
   'debian/changelog is what CHANGELOG.md makes (make debian/changelog)');
chomp(my $dv = `cd '$root' && dpkg-parsechangelog -S Version`);
is($dv, $version, "debian/changelog's version is VERSION's");
chomp(my $arch = `dpkg --print-architecture`);
my $deb = "$root/build/libnginx-mod-http-hermes_${version}_$arch.deb";

# build it (a no-op when build/ is up to date); a make above us is not ours
{
    local $ENV{MAKEFLAGS};
    local $ENV{MFLAGS};
    local $ENV{MAKELEVEL};
    delete @ENV{qw(MAKEFLAGS MFLAGS MAKELEVEL)};
    my $out = `make -s -C '$root' deb 2>&1`;
    is($?, 0, 'make deb') or diag($out);
}
ok(-f $deb, "build/libnginx-mod-http-hermes_${version}_$arch.deb")
    or do { done_testing; exit 1 };

# unpack into a throwaway root, as dpkg would install it
my $tmp = File::Temp::tempdir('hermes-deb-XXXXXXXX', TMPDIR => 1,
    CLEANUP => !$ENV{HERMES_KEEP});
my $dest = "$tmp/root";
is(system('dpkg-deb', '-x', $deb, $dest), 0, 'dpkg-deb -x');

my $so = "$dest/usr/lib/nginx/modules/ngx_http_hermes_module.so";
my $doc = "$dest/usr/share/doc/libnginx-mod-http-hermes";
my $data = "$dest/usr/share/libnginx-mod-http-hermes";
my $snippet = "$dest/usr/share/nginx/modules-available/mod-http-hermes.conf";

ok(-f $so, 'the module in /usr/lib/nginx/modules');
is(slurp($snippet), "load_module modules/ngx_http_hermes_module.so;\n",
   'the load snippet in /usr/share/nginx/modules-available');
for my $f (qw(README.md directives.md operations.md protocol.md internals.md security.md)) {
    ok(-f "$doc/$f" || -f "$doc/$f.gz", "doc $f");
}
my $copyright = slurp("$doc/copyright") // '';
like($copyright, qr/^Files: \*\n(?:.+\n)*License: BSD-2-Clause\n/m,
     'copyright: every file is BSD-2-Clause');
like($copyright, qr/^License: BSD-2-Clause\n Redistribution and use/m,
     'copyright: with its text');
ok(-f "$doc/changelog.gz", 'changelog');
like(scalar `gzip -dc '$doc/changelog.gz'`,
     qr/\Alibnginx-mod-http-hermes \(\Q$version\E\) /,
     "changelog: its newest entry is $version");
chomp(my $debv = `dpkg-deb -f '$deb' Version`);
is($debv, $version, "the package's version: $version");
ok(-f "$doc/examples/hermes.conf", 'example configuration');

# the runtime Python as data, the same bytes as the tree's; no tests
for my $f (qw(kernel_runner.py kernel_start.py hermes_tools.py hermes_agent.py)) {
    ok(-f "$data/$f" && compare("$data/$f", "$root/src/remote/$f") == 0,
       "$f in /usr/share/libnginx-mod-http-hermes, as in src/remote");
}
opendir my $dh, $data or die "$data: $!";
is_deeply([ sort grep { !/^\./ } readdir $dh ],
          [ qw(hermes_agent.py hermes_tools.py kernel_runner.py kernel_start.py) ],
          'nothing else there');
closedir $dh;

# depends on the ABI of the nginx built against, which this nginx provides
chomp(my $depends = `dpkg-deb -f '$deb' Depends`);
my %dep = map { /^\s*([^\s(]+)/ ? ($1 => 1) : () } split /,/, $depends;
my ($abi) = grep { /^nginx-abi-/ } keys %dep;
ok($abi, "Depends names an nginx ABI: $depends");
my $sv = slurp('/usr/share/nginx/src/debian/libnginx-mod.abisubstvars') // '';
my ($built) = $sv =~ /^nginx:abi=(\S+)$/m;
is($abi, $built, 'the ABI of nginx-dev');
chomp(my $provides = `dpkg-query -W -f='\${Provides}' nginx 2>/dev/null`);
like($provides, qr/(?:^|,\s*)\Q$built\E(?:\s|,|$)/,
     "the installed nginx provides $built");
ok($dep{$_}, "Depends: $_")
    for qw(bubblewrap python3 util-linux adduser libssh-4 libyajl2
           libsodium23);

my $ctrl = "$tmp/DEBIAN";
is(system('dpkg-deb', '-e', $deb, $ctrl), 0, 'dpkg-deb -e');
is(system('sh', '-n', "$ctrl/$_"), 0, "$_ is sh") for qw(postinst prerm postrm);
my $postinst = slurp("$ctrl/postinst") // '';
like($postinst, qr/adduser --system\b.*\n?.*hermes-kernel/,
     'postinst creates the user hermes-kernel');
like($postinst, qr{ln -sf /usr/share/nginx/modules-available/\$from},
     'postinst enables the module (dh_nginx)');

# lintian, where installed: no errors; warnings only those operations.md
# lists as accepted
SKIP: {
    skip 'lintian not installed', 2 unless have('lintian');
    my $out = `lintian --tag-display-limit 0 '$deb' 2>&1`;
    my @tags = $out =~ /^[EW]: \S+: (\S+)/mg;
    is_deeply([ grep { $out =~ /^E: \S+: \Q$_\E/m } @tags ], [],
              'lintian: no errors') or diag($out);
    my $ops = slurp("$root/docs/operations.md") // '';
    my ($pk) = $ops =~ /^## Packages\n(.*?)(?=^## |\z)/ms;
    $pk //= '';
    is_deeply([ grep { index($pk, "`$_`") < 0 } @tags ], [],
              'lintian: every warning is listed in operations.md')
        or diag($out);
}

# the installed .so, loaded by the installed snippet (its path is relative
# to nginx's prefix, where Debian's /usr/share/nginx/modules links to
# /usr/lib/nginx/modules), runs a cell with the installed example
my $t = Hermes::Test->new(no_module => 1);
symlink("$dest/usr/lib/nginx/modules", $t->prefix . '/modules')
    or die "symlink: $!";
my $conf = slurp("$doc/examples/hermes.conf");
ok($conf =~ s{root=/var/lib/hermes/kernels}{root=%%KROOT%%}
   && $conf =~ s{listen 127\.0\.0\.1:8088;}{listen 127.0.0.1:%%PORT_0%%;},
   'the example has the root and listen line the docs tell of');
$t->write_conf($conf, main => slurp($snippet));
$t->run;

my $r = $t->execute('/v1/execute',
                    { session => 'deb', code => "x = 6 * 7\nprint(x)" });
is($r->{status}, 200, 'cell: 200');
is($r->{result}{status}, 'success', 'cell: success');
is($r->{result}{output}, "42\n", 'cell: output');

$r = $t->http(GET => '/v1/status');
is($r->{json}{kernels}, 1, 'the status location counts the kernel');

$t->stop;
done_testing;

sub slurp {
    my ($f) = @_;
    open my $fh, '<', $f or return undef;
    local $/;
    return scalar <$fh>;
}
