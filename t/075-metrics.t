#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Metrics: hermes_status in Prometheus text and in JSON after known
# traffic (successes, an error cell, a timeout, a 415, a 429 queue_full,
# failed spawns on local and ssh backends): exact counter deltas,
# histograms (cumulative buckets, _count = the cells, queue wait apart
# from the cell's duration), the queue-depth gauge, per-host kernels and
# spawn failures, answers by HTTP status and error code; every line parses
# as Prometheus text (a strict parser below); both formats carry the same
# figures; a bad ?format= is a 400; the access-log variables; the module's
# version and commit (hermes_build_info, the JSON's, error.log's).

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use Hermes::Test;

my $t = Hermes::Test->new;
my $p = $t->prefix;

# two ssh hosts where nothing listens: the spawn fails on one, then on the
# other
system("ssh-keygen -q -t ed25519 -N '' -f $p/id >/dev/null") == 0 or die;
open my $kh, '>', "$p/known_hosts" or die; close $kh;

# /broken: a kernel root that does not exist, its spawns fail
mkdir $t->prefix . '/no-such-dir', 0711 or die;
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;
    log_format metrics 'o=[$hermes_owner] s=[$hermes_session] k=[$hermes_kernel_id] '
                       'st=[$hermes_cell_status] ms=[$hermes_cell_ms] q=[$hermes_queue_ms] '
                       'lost=[$hermes_lost_reason] $status';

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /x {
            hermes_execute;
            hermes_owner $http_x_owner;
            hermes_queue 1;
            hermes_cell_timeout 30s grace=1s;
            access_log %%PREFIX%%/logs/metrics.log metrics;
        }

        location = /broken {
            hermes_execute;
            hermes_backend local root=%%PREFIX%%/no-such-dir;
            hermes_sandbox off;
        }

        location = /ssh {
            hermes_execute;
            hermes_backend ssh host=127.0.0.1:%%PORT_3%% host=127.0.0.2:%%PORT_4%%
                           user=root identity=%%PREFIX%%/id
                           known_hosts=%%PREFIX%%/known_hosts connect_timeout=3s;
        }

        location = /status {
            hermes_status;
        }
    }
CONF
$t->run;
# the root nginx -t checked goes away: its spawns fail
rmdir $t->prefix . '/no-such-dir' or die "rmdir: $!";

my %alice = (headers => { 'X-Owner' => 'alice' });

sub cell {
    my ($s, $code, %o) = @_;
    my $timeout = delete $o{cell_timeout};
    $t->execute('/x', { session => $s, code => $code,
        defined $timeout ? (timeout => $timeout) : () }, %alice, %o);
}

# every scrape is a 200 of a hermes location, counted too
my $scrapes = 0;
sub json_status { $scrapes++; $t->http(GET => '/status')->{json} }
sub prom_status { $scrapes++; $t->http(GET => '/status?format=prometheus') }

###############################################################################
# a strict parser of the Prometheus text format (0.0.4): dies on any line
# that is not one; checks HELP and TYPE come first, once, and the naming
# conventions

my $NAME = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
my $LNAME = qr/[a-zA-Z_][a-zA-Z0-9_]*/;
my $VALUE = qr/(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)/;

sub parse_prom {
    my ($text) = @_;
    my (%fam, @order, %series, $current);

    die "does not end in a newline\n" unless $text =~ /\n\z/;

    my $n = 0;
    for my $line (split /\n/, $text) {
        $n++;
        die "line $n is empty\n" if $line eq '';

        if ($line =~ /^# HELP ($NAME) (.*)$/) {
            my ($name, $help) = ($1, $2);
            push @order, $name unless $fam{$name};
            die "line $n: a second HELP of $name\n" if $fam{$name}{help};
            die "line $n: HELP of $name after its samples\n" if $fam{$name}{samples};
            die "line $n: HELP of $name is empty\n" if $help !~ /\S/;
            die "line $n: bad escape in HELP\n" if $help =~ /\\(?![\\n])/;
            $fam{$name}{help} = $help;
            $current = $name;
            next;
        }

        if ($line =~ /^# TYPE ($NAME) (counter|gauge|histogram|summary|untyped)$/) {
            my ($name, $type) = ($1, $2);
            push @order, $name unless $fam{$name};
            die "line $n: a second TYPE of $name\n" if $fam{$name}{type};
            die "line $n: TYPE of $name after its samples\n" if $fam{$name}{samples};
            $fam{$name}{type} = $type;
            $current = $name;
            next;
        }

        die "line $n: a comment that is neither HELP nor TYPE: $line\n" if $line =~ /^#/;

        $line =~ /^($NAME)(?:\{(.*)\})? ($VALUE)(?: -?\d+)?$/
            or die "line $n: not a sample: $line\n";
        my ($sname, $ltext, $value) = ($1, $2 // '', $3);

        my %labels;
        my $rest = $ltext;
        while (length $rest) {
            $rest =~ s/^($LNAME)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)//
                or die "line $n: bad labels {$ltext}\n";
            my ($k, $v) = ($1, $2);
            die "line $n: label $k twice\n" if exists $labels{$k};
            die "line $n: reserved label name $k\n" if $k =~ /^__/;
            $v =~ s/\\(.)/$1 eq 'n' ? "\n" : $1/ge;
            $labels{$k} = $v;
        }

        # the family: the name itself, or a histogram's _bucket/_sum/_count
        my $family = $sname;
        if (!$fam{$sname}) {
            ($family = $sname) =~ s/_(?:bucket|sum|count)$//;
            die "line $n: $sname has no HELP/TYPE before it\n"
                unless $fam{$family} && ($fam{$family}{type} // '') eq 'histogram';
        }
        die "line $n: $sname has no TYPE before it\n" unless $fam{$family}{type};
        die "line $n: $sname has no HELP before it\n" unless $fam{$family}{help};
        die "line $n: $sname is not in the family being read ($current)\n"
            if $family ne ($current // '');

        my $type = $fam{$family}{type};
        if ($type eq 'histogram') {
            die "line $n: histogram sample $sname\n"
                unless $sname =~ /^\Q$family\E_(bucket|sum|count)$/;
            die "line $n: a bucket without le\n" if $1 eq 'bucket' && !exists $labels{le};
            die "line $n: le outside a bucket\n" if $1 ne 'bucket' && exists $labels{le};
        }

        my $key = $sname . '{' . join(',', map { "$_=$labels{$_}" } sort keys %labels) . '}';
        die "line $n: duplicate series $key\n" if $series{$key}++;

        $fam{$family}{samples}++;
        push @{ $fam{$family}{list} }, { name => $sname, labels => \%labels, value => $value };
    }

    for my $name (@order) {
        my $f = $fam{$name};
        die "$name: no TYPE\n" unless $f->{type};
        die "$name: no HELP\n" unless $f->{help};
        die "$name: no samples\n" unless $f->{samples};
        die "$name: a counter not named _total\n"
            if $f->{type} eq 'counter' && $name !~ /_total$/;
        die "$name: a $f->{type} named _total\n"
            if $f->{type} ne 'counter' && $name =~ /_total$/;
        die "$name: a histogram's unit is seconds\n"
            if $f->{type} eq 'histogram' && $name !~ /_seconds$/;
        check_histogram($name, $f->{list}) if $f->{type} eq 'histogram';
    }

    return \%fam;
}

# per label set (le aside): le ascending, counts cumulative, +Inf = _count
sub check_histogram {
    my ($name, $list) = @_;
    my %by;
    for my $s (@$list) {
        my %l = %{ $s->{labels} };
        delete $l{le};
        my $k = join ',', map { "$_=$l{$_}" } sort keys %l;
        push @{ $by{$k}{ $s->{name} =~ /_(bucket|sum|count)$/ && $1 } }, $s;
    }
    for my $k (keys %by) {
        my $b = $by{$k}{bucket} or die "$name\{$k}: no buckets\n";
        die "$name\{$k}: one _sum and one _count expected\n"
            unless @{ $by{$k}{sum} || [] } == 1 && @{ $by{$k}{count} || [] } == 1;
        my ($le, $c) = (-1e300, -1);
        for my $s (@$b) {
            my $l = $s->{labels}{le} eq '+Inf' ? 9**9**9 : $s->{labels}{le};
            die "$name\{$k}: le=$s->{labels}{le} is not a number\n"
                unless $s->{labels}{le} =~ /^(?:\+Inf|\d+(?:\.\d+)?)$/;
            die "$name\{$k}: le not ascending at $s->{labels}{le}\n" unless $l > $le;
            die "$name\{$k}: buckets not cumulative at le=$s->{labels}{le}\n"
                unless $s->{value} >= $c;
            ($le, $c) = ($l, $s->{value});
        }
        die "$name\{$k}: no +Inf bucket last\n" unless $b->[-1]{labels}{le} eq '+Inf';
        die "$name\{$k}: +Inf bucket != _count\n"
            unless $b->[-1]{value} == $by{$k}{count}[0]{value};
    }
}

# one sample's value: name, then label => value pairs (zone aside)
sub pv {
    my ($fam, $name, %l) = @_;
    my $family = $name;
    $family =~ s/_(?:bucket|sum|count)$// unless $fam->{$name};
    $l{zone} //= 'kernels';
    for my $s (@{ $fam->{$family}{list} || [] }) {
        next unless $s->{name} eq $name;
        my $sl = $s->{labels};
        next unless keys %$sl == keys %l;
        next if grep { !exists $sl->{$_} || $sl->{$_} ne $l{$_} } keys %l;
        return $s->{value};
    }
    return undef;
}

###############################################################################
# the parser itself refuses what it must

for my $bad (
    [ "# TYPE a_total counter\na_total 1\n", 'no HELP' ],
    [ "# HELP a x\n# TYPE a counter\na 1\n", 'a counter without _total' ],
    [ "# HELP a_total x\n# TYPE a_total gauge\na_total 1\n", 'a gauge with _total' ],
    [ "a 1\n# HELP a x\n# TYPE a gauge\n", 'samples before HELP/TYPE' ],
    [ "# HELP a x\n# TYPE a gauge\na{b=\"1} 1\n", 'a broken label' ],
    [ "# HELP a x\n# TYPE a gauge\na 1 2 3\n", 'a broken value' ],
    [ "# HELP 1a x\n# TYPE 1a gauge\n1a 1\n", 'a bad name' ],
    [ "# HELP h_seconds x\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 2\n"
      . "h_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 1\nh_seconds_count 1\n", 'buckets not cumulative' ],
    [ "# HELP h_seconds x\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"+Inf\"} 2\n"
      . "h_seconds_sum 1\nh_seconds_count 1\n", '+Inf bucket != count' ],
    [ "# HELP a x\n# TYPE a gauge\na 1", 'no final newline' ],
    )
{
    ok(!eval { parse_prom($bad->[0]); 1 }, "the parser refuses $bad->[1]");
}

###############################################################################
# ?format=

my $r = $t->http(GET => '/status?format=xml');
is($r->{status}, 400, '?format=xml: 400');
is($r->{json}{error}{code}, 'invalid_format', '... invalid_format');
like($r->{headers}{'content-type'}, qr{^application/json}, '... a JSON error');
$r = $t->http(GET => '/status?format=');
is($r->{status}, 400, '?format= (empty): 400');
$r = $t->http(GET => '/status?format=json');
is($r->{status}, 200, '?format=json: 200');
ok(defined $r->{json}{kernels}, '... JSON');

###############################################################################
# what answers: the module's name, VERSION's version and the commit, in
# both forms and in error.log's line at the start

my $version = do {
    open my $fh, '<', Hermes::Test::repo_root() . '/VERSION' or die "VERSION: $!";
    local $/;
    my $v = <$fh>;
    $v =~ s/\s+\z//;
    $v;
};
my $jb = json_status();
is($jb->{module}, 'ngx_http_hermes_module', 'JSON module: the name');
is($jb->{version}, $version, "JSON version: VERSION's ($version)");
like($jb->{commit}, qr/^(?:[0-9a-f]{40}(?:-dirty)?|unknown)$/,
     "JSON commit: a commit or unknown ($jb->{commit})");
my $fb = eval { parse_prom(prom_status()->{content}) };
my @bi = @{ $fb->{hermes_build_info}{list} || [] };
is(scalar @bi, 1, 'one hermes_build_info sample');
is_deeply($bi[0]{labels}, { version => $version, commit => $jb->{commit} },
          'hermes_build_info{version,commit}: as the JSON says');
is($bi[0]{value}, 1, 'hermes_build_info is 1');
is($fb->{hermes_build_info}{type}, 'gauge', 'hermes_build_info is a gauge');
like($t->error_log,
     qr/\[notice\] \d+#\d+: hermes: ngx_http_hermes_module\/\Q$version\E \(commit \Q$jb->{commit}\E\)$/m,
     'error.log names the module, its version and commit at the start');

###############################################################################
# known traffic between two scrapes of each format

my $n1 = $scrapes;
my $p1 = prom_status();
my $f1 = eval { parse_prom($p1->{content}) };
ok($f1, 'the first scrape parses as Prometheus text') or diag $@;
my $j1 = json_status();

$r = cell('a', 'print(1)');
is($r->{result}{status}, 'success', 'a success');
ok(defined $r->{result}{queue_seconds}, 'the result has queue_seconds');
$r = cell('a', 'raise ValueError("boom")');
is($r->{result}{status}, 'error', 'an error cell');
$r = cell('a', "import time\ntime.sleep(0.6)");
is($r->{result}{status}, 'success', 'a 0.6 s cell');
ok($r->{result}{duration_seconds} >= 0.6, '... its duration_seconds >= 0.6');

$r = $t->raw_request(POST => '/x', body => '{"code":"1"}', content_type => 'text/plain',
    headers => { 'X-Owner' => 'alice' });
is($r->{status}, 415, 'a 415');

$r = $t->execute('/broken', { session => 'b', code => '1' });
is($r->{status}, 502, 'a failed spawn: 502');
is($r->{json}{error}{code}, 'spawn_failed', '... spawn_failed');

$r = $t->execute('/ssh', { session => 's', code => '1' });
is($r->{status}, 502, 'no ssh host answers: 502');
is($r->{json}{error}{code}, 'backend_unavailable', '... backend_unavailable');

# two cells on one kernel: the second waits its turn, a third is refused

my $qa = $t->execute_async('/x', { session => 'q', code => "import time\ntime.sleep(2)" }, %alice);
ok(wait_until(sub { (json_status()->{running} // 0) == 1 }, 10), 'the first cell of q runs');
my $qb = $t->execute_async('/x', { session => 'q', code => 'print("b")' }, %alice);
sleep 0.5;
my $mid = json_status();
is($mid->{queue_depth}, 1, 'queue_depth: one cell waits');
my $mid_prom = prom_status();
is(pv(eval { parse_prom($mid_prom->{content}) } || {}, 'hermes_queue_depth'), 1,
    '... hermes_queue_depth 1');
$r = cell('q', '1');
is($r->{status}, 429, 'a third cell on q: 429');
is($r->{json}{error}{code}, 'queue_full', '... queue_full');
my $ra = $qa->wait;
my $rb = $qb->wait;
is($ra->{result}{status}, 'success', 'the first cell of q');
is($rb->{result}{status}, 'success', 'the queued cell of q');
ok($rb->{result}{queue_seconds} >= 0.8, "the queued cell waited ($rb->{result}{queue_seconds} s)");
ok($rb->{result}{duration_seconds} < 0.8,
    "... and its duration_seconds ($rb->{result}{duration_seconds}) leaves the wait out");
ok($ra->{result}{queue_seconds} < 0.5, 'the first cell hardly waited');

# a timeout the cell does not stop for kills the kernel; the next cell
# finds its state lost
$r = cell('t', "import time\nwhile True:\n    try:\n        time.sleep(30)\n"
    . "    except KeyboardInterrupt:\n        pass", cell_timeout => 1);
is($r->{result}{status}, 'timeout', 'a timeout');
$r = cell('t', 'print(2)');
ok($r->{result}{kernel}{state_lost}, 'the next cell: state_lost');

my $n2 = $scrapes;
my $p2 = prom_status();
my $f2 = eval { parse_prom($p2->{content}) };
ok($f2, 'the second scrape parses as Prometheus text') or diag $@;
$f2 //= {};
my $j2 = json_status();
like($p2->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4}, 'Prometheus content type');

# --- exact deltas, Prometheus

sub pd { my ($name, %l) = @_; (pv($f2, $name, %l) // -1e9) - (pv($f1, $name, %l) // 0) }

is(pd('hermes_cells_total', status => 'success'), 5, 'cells_total{success} +5');
is(pd('hermes_cells_total', status => 'error'), 1, 'cells_total{error} +1');
is(pd('hermes_cells_total', status => 'timeout'), 1, 'cells_total{timeout} +1');
is(pd('hermes_cells_total', status => 'interrupted'), 0, 'cells_total{interrupted} +0');
is(pd('hermes_spawned_total'), 4, 'spawned_total +4 (a, q, t, t again)');
is(pd('hermes_spawn_failures_total', host => 'localhost'), 1,
    'spawn_failures_total{host="localhost"} +1');
is(pd('hermes_spawn_failures_total', host => '127.0.0.1'), 1,
    'spawn_failures_total of the first ssh host +1');
is(pd('hermes_spawn_failures_total', host => '127.0.0.2'), 1,
    'spawn_failures_total of the second ssh host +1 (the spawn moved on to it)');
is(pv($f2, 'hermes_host_kernels', host => '127.0.0.1'), 0,
    'host_kernels of an ssh host without kernels: 0');
is(pd('hermes_evictions_total', reason => 'timeout'), 1, 'evictions_total{reason="timeout"} +1');
is(pd('hermes_evictions_total', reason => 'idle'), 0, 'evictions_total{reason="idle"} +0');
is(pd('hermes_evictions_total', reason => 'cap'), 0, 'evictions_total{reason="cap"} +0');
is(pv($f2, 'hermes_host_kernels', host => 'localhost'), 3, 'host_kernels{host="localhost"} 3');
is(pv($f2, 'hermes_kernels'), 3, 'kernels 3');
is(pv($f2, 'hermes_queue_depth'), 0, 'queue_depth 0 at the end');
is(pd('hermes_responses_total', code => '429', error => 'queue_full'), 1,
    'responses_total{code="429",error="queue_full"} +1');
is(pd('hermes_responses_total', code => '415', error => 'unsupported_media_type'), 1,
    'responses_total{code="415",error="unsupported_media_type"} +1');
is(pd('hermes_responses_total', code => '502', error => 'spawn_failed'), 1,
    'responses_total{code="502",error="spawn_failed"} +1');
is(pd('hermes_responses_total', code => '502', error => 'backend_unavailable'), 1,
    'responses_total{code="502",error="backend_unavailable"} +1');
# 200s: the 7 cells and the scrapes from p1 on (a scrape is counted once
# it answered, after its own figures)
is(pd('hermes_responses_total', code => '200', error => ''), 7 + $n2 - $n1,
    'responses_total{code="200",error=""}: the cells and the scrapes');

is(pd('hermes_cell_duration_seconds_count'), 7, 'cell_duration_seconds_count +7: the cells');
is(pv($f2, 'hermes_cell_duration_seconds_count'),
   (pv($f2, 'hermes_cells_total', status => 'success') + pv($f2, 'hermes_cells_total', status => 'error')
    + pv($f2, 'hermes_cells_total', status => 'timeout')
    + pv($f2, 'hermes_cells_total', status => 'interrupted')),
   'cell_duration_seconds_count = the sum of cells_total');
ok(pd('hermes_cell_duration_seconds_bucket', le => '1') - pd('hermes_cell_duration_seconds_bucket', le => '0.5') >= 1,
    'the 0.6 s cell is in the (0.5, 1] bucket');
ok(pd('hermes_cell_duration_seconds_sum') >= 0.6 + 1, 'cell_duration_seconds_sum: the 0.6 s cell and the 1 s timeout');
is(pd('hermes_spawn_duration_seconds_count'), 4, 'spawn_duration_seconds_count +4: the spawns');
ok(pd('hermes_spawn_duration_seconds_sum') > 0, 'spawn_duration_seconds_sum grew');
is(pd('hermes_queue_wait_seconds_count'), 9,
    'queue_wait_seconds_count +9: every turn (7 cells, 2 failed spawns)');
ok(pd('hermes_queue_wait_seconds_sum') >= 0.8, 'queue_wait_seconds_sum: the queued cell\'s wait');
ok(pd('hermes_queue_wait_seconds_bucket', le => '+Inf') - pd('hermes_queue_wait_seconds_bucket', le => '0.5') == 1,
    'one wait over 0.5 s');
ok(pv($f2, 'hermes_zone_used_bytes') > 0
   && pv($f2, 'hermes_zone_used_bytes') <= pv($f2, 'hermes_zone_size_bytes'),
   'zone_used_bytes <= zone_size_bytes');
is(pv($f2, 'hermes_zone_size_bytes'), 1048576, 'zone_size_bytes: 1m');
is(pv($f2, 'hermes_max_kernels'), 64, 'max_kernels 64');
ok(defined pv($f2, 'hermes_rpc_rejected_total', reason => 'token'), 'rpc_rejected_total{reason}');
ok(defined pv($f2, 'hermes_tool_calls_total'), 'tool_calls_total');

for my $name (qw(hermes_zone_used_bytes hermes_zone_size_bytes hermes_kernels hermes_running
                 hermes_queue_depth hermes_host_kernels hermes_max_kernels))
{
    is($f2->{$name}{type}, 'gauge', "$name is a gauge");
}
for my $name (qw(hermes_cell_duration_seconds hermes_queue_wait_seconds hermes_spawn_duration_seconds)) {
    is($f2->{$name}{type}, 'histogram', "$name is a histogram");
}
ok(!grep({ /bytes_used|bytes_total|evicted_|killed_timeout/ } keys %$f2),
    'no old names (zone_bytes_used, evicted_*_total, ...)');

# --- the JSON form: the same deltas, the same figures as the Prometheus
#     scrape just before it

sub jd {
    my (@path) = @_;
    my ($a, $b) = ($j2, $j1);
    for my $k (@path) { $a = ref $a ? $a->{$k} : undef; $b = ref $b ? $b->{$k} : undef }
    return (defined $a ? $a : -1e9) - ($b // 0);
}

is(jd('cells_total', 'success'), 5, 'JSON cells_total.success +5');
is(jd('cells_total', 'error'), 1, 'JSON cells_total.error +1');
is(jd('cells_total', 'timeout'), 1, 'JSON cells_total.timeout +1');
is(jd('spawned_total'), 4, 'JSON spawned_total +4');
is(jd('spawn_failures_total', 'localhost'), 1, 'JSON spawn_failures_total.localhost +1');
is(jd('evictions_total', 'timeout'), 1, 'JSON evictions_total.timeout +1');
is(jd('responses_total', '429', 'queue_full'), 1, 'JSON responses_total.429.queue_full +1');
is(jd('responses_total', '415', 'unsupported_media_type'), 1, 'JSON responses_total.415 +1');
is(jd('cell_duration_seconds', 'count'), 7, 'JSON cell_duration_seconds.count +7');
is(jd('queue_wait_seconds', 'count'), 9, 'JSON queue_wait_seconds.count +9');
is(jd('spawn_duration_seconds', 'count'), 4, 'JSON spawn_duration_seconds.count +4');
is($j2->{host_kernels}{localhost}, 3, 'JSON host_kernels.localhost 3');
is($j2->{queue_depth}, 0, 'JSON queue_depth 0');
is(jd('responses_total', '200', ''), 7 + $n2 - $n1, 'JSON responses_total.200."" +7 and the scrapes');

my ($same, @diff) = (0);
for my $family (sort keys %$f2) {
    (my $jname = $family) =~ s/^hermes_//;
    for my $s (@{ $f2->{$family}{list} }) {
        my %l = %{ $s->{labels} };
        delete $l{zone};
        my $v;
        if ($s->{name} =~ /_bucket$/) {
            $v = $j2->{$jname}{buckets}{ $l{le} };
        } elsif ($s->{name} =~ /_(sum|count)$/ && $f2->{$family}{type} eq 'histogram') {
            $v = $j2->{$jname}{$1};
        } elsif ($family eq 'hermes_build_info') {
            $v = 1 if ($j2->{version} // '') eq $l{version}
                      && ($j2->{commit} // '') eq $l{commit};
        } elsif ($family eq 'hermes_responses_total') {
            $v = $j2->{$jname}{ $l{code} }{ $l{error} };
            # the Prometheus scrape itself is a 200 the JSON one counts
            $v-- if defined $v && $l{code} eq '200' && $l{error} eq '';
        } elsif (keys %l == 1) {
            my ($k) = keys %l;
            $v = $j2->{$jname}{ $l{$k} };
        } elsif (!keys %l) {
            $v = $j2->{$jname};
        }
        if (defined $v && !ref $v && abs($v - $s->{value}) < 1e-9) {
            $same++;
        } else {
            push @diff, "$s->{name} {" . join(',', map { "$_=$l{$_}" } sort keys %l)
                . "} prometheus $s->{value}, JSON " . ($v // 'none');
        }
    }
}
ok($same > 50 && !@diff, "the JSON form has every Prometheus figure ($same)")
    or diag join "\n", @diff;

###############################################################################
# access-log variables

my @log = do { open my $fh, '<', "$p/logs/metrics.log" or die "metrics.log: $!"; <$fh> };
chomp @log;
my $kq = $rb->{result}{kernel}{kernel_id};
# the queued cell's line: of q's two successes, the one that waited longer
my ($lb) = sort { ($b =~ /q=\[(\d+)\]/)[0] <=> ($a =~ /q=\[(\d+)\]/)[0] }
           grep { /^o=\[alice\] s=\[q\] k=\[\Q$kq\E\] st=\[success\] ms=\[\d+\] q=\[\d+\]/ } @log;
ok($lb, 'the queued cell\'s line: owner, session, kernel, status, ms') or diag join "\n", @log;
if ($lb) {
    my ($ms, $qms) = $lb =~ /ms=\[(\d+)\] q=\[(\d+)\]/;
    ok($qms >= 800, "\$hermes_queue_ms is the wait ($qms)");
    ok($ms < 800, "\$hermes_cell_ms leaves it out ($ms)");
    like($lb, qr/lost=\[-\] 200$/, '$hermes_lost_reason empty: nothing was lost');
}
my ($lt) = grep { /s=\[t\] .* st=\[success\]/ } @log;
like($lt // '', qr/lost=\[timeout\] 200$/, '$hermes_lost_reason "timeout" after the timeout killed the kernel');
my ($l429) = grep { / 429$/ } @log;
like($l429 // '', qr/^o=\[alice\] s=\[q\] k=\[-\] st=\[-\] ms=\[-\] q=\[-\] lost=\[-\] 429$/,
    'the 429: owner and session, nothing else');
my ($l415) = grep { / 415$/ } @log;
like($l415 // '', qr/^o=\[-\] s=\[-\] .* 415$/, 'the 415: refused before the owner was asked');

$t->stop;
done_testing;
