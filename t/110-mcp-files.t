#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# hermes_mcp's upload_file and download_file: files into and out of the
# session's kernel as PUT and GET <kernels>/SESSION/files/PATH move them,
# on the local and the ssh backend.  From an attacker's side first: paths
# out of the kernel dir (.., absolute, a symlink a cell planted; canaries
# in this test's own prefix only), another owner's kernel, files over the
# bounds, a client gone mid-transfer; then a client's: text, binary and
# image round trips, a cell's file out, an uploaded one read by the next
# cell, the metrics.

use strict;
use warnings;

use Test::More;
use JSON::PP;
use MIME::Base64 qw(encode_base64 decode_base64);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

use Hermes::Test;
use Hermes::Sshd;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $JSON = JSON::PP->new->utf8->canonical;

my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;

my $s;
my $ssh_loc = '';
unless (Hermes::Sshd->unavailable) {
    $s = Hermes::Sshd->new(dir => "$p/ssh", port => $t->port(5));
    $s->start;
    mkdir "$p/kroot/ssh", 0711;
    my $ssh = "host=127.0.0.1:" . $s->port . " known_hosts=" . $s->known_hosts
        . " user=root identity=" . $s->identity . " connect_timeout=3s";
    $ssh_loc = <<"LOC";
        location = /mcp-ssh {
            hermes_mcp zone=kernels;
            hermes_owner \$http_x_owner;
            hermes_backend ssh $ssh root=%%KROOT%%/ssh;
            hermes_max_file 1m;
        }

        location = /mcp-ssh-big {
            hermes_mcp zone=kernels;
            hermes_owner \$http_x_owner;
            hermes_backend ssh $ssh root=%%KROOT%%/ssh;
            hermes_max_file 100m;
        }
LOC
}

$t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;
        client_max_body_size 8m;
        hermes_cell_timeout 30s;

        location = /mcp {
            hermes_mcp zone=kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 1m;
        }

        location = /mcp-big {
            hermes_mcp zone=kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 100m;
        }
$ssh_loc
        location /v1/kernels {
            hermes_kernels zone=kernels;
            hermes_owner \$http_x_owner;
            hermes_max_file 100m;
        }

        location = /status {
            hermes_status zone=kernels;
        }
    }
CONF
$t->run;

# one JSON-RPC message; the answer's JSON, or its SSE events' messages
sub rpc {
    my ($path, $sid, $msg, %opt) = @_;
    my %h = (
        'Accept' => 'application/json, text/event-stream',
        'X-Owner' => $opt{owner} // 'alice',
        %{ $opt{headers} || {} },
    );
    $h{'Mcp-Session-Id'} = $sid if defined $sid;
    my $r = $t->raw_request($opt{method} // 'POST', $path,
        body => ref $msg ? $JSON->encode($msg) : $msg,
        content_type => 'application/json', headers => \%h,
        timeout => $opt{timeout} // 60);
    my $ct = $r->{headers}{'content-type'} // '';
    $r->{messages} = [];
    if ($ct =~ m{^text/event-stream}) {
        for my $ev (split /\n\n/, $r->{raw}) {
            my ($data) = $ev =~ /^data: (.*)$/m or next;
            push @{ $r->{messages} }, eval { $JSON->decode($data) };
        }
        $r->{json} = $r->{messages}[-1];
    } else {
        $r->{json} = eval { $JSON->decode($r->{raw}) };
    }
    return $r;
}

sub initialize {
    my ($path, %opt) = @_;
    my $r = rpc($path, undef, { jsonrpc => '2.0', id => 0,
        method => 'initialize',
        params => { protocolVersion => '2025-11-25', capabilities => {},
                    clientInfo => { name => 't', version => '1' } } },
        %opt);
    my $sid = $r->{headers}{'mcp-session-id'};
    rpc($path, $sid, { jsonrpc => '2.0',
        method => 'notifications/initialized' }, %opt) if $sid;
    return $sid;
}

my $n = 0;
sub call {
    my ($path, $sid, $tool, $args, %opt) = @_;
    return rpc($path, $sid, { jsonrpc => '2.0', id => ++$n,
        method => 'tools/call',
        params => { name => $tool, arguments => $args } }, %opt);
}

sub text_of {
    my ($r) = @_;
    return join '', map { $_->{text} // '' }
        grep { $_->{type} eq 'text' } @{ $r->{json}{result}{content} || [] };
}

sub is_error { ($_[0]{json}{result}{isError} // 0) ? 1 : 0 }

# "code: message" of a tool error ('' if it is none)
sub code_of {
    my ($r) = @_;
    return '' unless is_error($r);
    my ($code) = text_of($r) =~ /^([a-z_]+):/;
    return $code // '?';
}

sub upload {
    my ($loc, $sid, $path, $content, %opt) = @_;
    my %a = (path => $path, content => $content);
    $a{encoding} = $opt{encoding} if $opt{encoding};
    $a{session} = $opt{session} if $opt{session};
    return call($loc, $sid, 'upload_file', \%a, %opt);
}

sub download {
    my ($loc, $sid, $path, %opt) = @_;
    my %a = (path => $path);
    $a{session} = $opt{session} if $opt{session};
    return call($loc, $sid, 'download_file', \%a, %opt);
}

sub run_cell {
    my ($loc, $sid, $code, %opt) = @_;
    my %a = (code => $code);
    $a{session} = $opt{session} if $opt{session};
    return text_of(call($loc, $sid, 'execute_code', \%a, %opt));
}

sub slurp { local $/; open my $f, '<', $_[0] or return undef; binmode $f; <$f> }

# a canary in this test's own prefix: were a guard gone, it takes the
# write, never a file of the host's
my $canary = "$p/canary";
mkdir $canary, 0755 or die "mkdir $canary: $!";
open my $cf, '>', "$canary/secret" or die;
print $cf "canary\n";
close $cf;

my @backends = (['local', '/mcp', '/mcp-big', $t->kroot]);
push @backends, ['ssh', '/mcp-ssh', '/mcp-ssh-big', $t->kroot . '/ssh'] if $s;

for my $b (@backends) {
    my ($name, $loc, $big, $root) = @$b;

    my $sid = initialize($loc);
    ok($sid, "$name: an MCP session");

    # before any cell: no kernel to put a file in
    my $r = upload($loc, $sid, 'early.txt', 'x');
    is(code_of($r), 'not_found', "$name: upload before a kernel: not_found");

    like(run_cell($loc, $sid, "import os\nprint(os.getcwd())"),
         qr{/hermes_rkernel_}, "$name: a kernel");
    my $dir = run_cell($loc, $sid, "import os\nprint(os.getcwd(), end='')");
    $dir = "$root/" . ($dir =~ m{/(hermes_rkernel_[^/]+)$})[0];
    ok(-d $dir, "$name: the kernel dir is $dir");

    # ---- an attacker's side ----

    # paths out of the kernel dir, refused before anything runs
    for my $bad ('../x', 'a/../../x', '/abs', "$canary/secret", '..', '.',
                 'a//b', './x', "a'b", "a\\b", 'cells/x', 'kernel_runner.py',
                 'rpc', '')
    {
        $r = upload($loc, $sid, $bad, 'pwned');
        is(code_of($r), 'invalid_path', "$name: upload to '$bad': invalid_path");
        $r = download($loc, $sid, $bad);
        is(code_of($r), 'invalid_path', "$name: download of '$bad': invalid_path");
    }
    ok(!-e "$p/x" && !-e "$root/x" && !-e '/abs', "$name: nothing written outside");

    # a symlink a cell planted, to the canary, and a FIFO
    is(run_cell($loc, $sid, "import os\nos.symlink('$canary', 'ldir')\n"
                . "os.symlink('$canary/secret', 'lfile')\nos.mkfifo('fifo')\n"
                . "print('planted')"),
       "planted\n", "$name: a cell planted symlinks and a FIFO");
    for my $c (['ldir/secret', 'a symlinked directory'], ['lfile', 'a symlink'],
               ['ldir/new', 'a symlinked directory (a new file)'])
    {
        my ($path, $what) = @$c;
        $r = upload($loc, $sid, $path, 'pwned');
        is(code_of($r), 'invalid_path', "$name: upload through $what: invalid_path");
        $r = download($loc, $sid, $path);
        unlike(text_of($r), qr/canary/, "$name: download through $what: not the canary");
        like(code_of($r), qr/^(invalid_path|not_found)$/,
             "$name: download through $what: refused (" . code_of($r) . ")");
    }
    my $t0 = time;
    $r = download($loc, $sid, 'fifo');
    is(code_of($r), 'invalid_path', "$name: download of a FIFO: invalid_path");
    ok(time - $t0 < 5, "$name: ... without hanging");
    is(slurp("$canary/secret"), "canary\n", "$name: the canary untouched");
    is(join(' ', do { opendir(my $d, $canary); sort grep { !/^\.\.?$/ } readdir $d }),
       'secret', "$name: no file made through the link");

    # another owner: not even told the kernel is there
    is(upload($loc, $sid, 'mine.txt', "alice's\n")->{json}{result}{isError},
       JSON::PP::false, "$name: alice uploads mine.txt");
    my $msid = initialize($loc, owner => 'mallory');
    ok($msid, "$name: mallory's MCP session");
    $r = download($loc, $msid, 'mine.txt', session => "mcp-$sid", owner => 'mallory');
    is(code_of($r), 'not_found', "$name: mallory downloads from alice's kernel: not_found");
    $r = upload($loc, $msid, 'mine.txt', 'pwned', session => "mcp-$sid", owner => 'mallory');
    is(code_of($r), 'not_found', "$name: mallory uploads to alice's kernel: not_found");
    $r = download($loc, $sid, 'mine.txt', owner => 'mallory');
    is($r->{status}, 404, "$name: alice's Mcp-Session-Id as mallory: 404");
    is(slurp("$dir/mine.txt"), "alice's\n", "$name: alice's file untouched");

    # bad arguments
    $r = call($loc, $sid, 'upload_file', { path => 'x.txt' });
    is(code_of($r), 'invalid_request', "$name: upload without content: invalid_request");
    $r = call($loc, $sid, 'download_file', {});
    is(code_of($r), 'invalid_request', "$name: download without path: invalid_request");
    $r = upload($loc, $sid, 'x.txt', 'x', encoding => 'rot13');
    is(code_of($r), 'invalid_request', "$name: an unknown encoding: invalid_request");
    $r = upload($loc, $sid, 'x.txt', '!!not base64!!', encoding => 'base64');
    is(code_of($r), 'invalid_request', "$name: bad base64: invalid_request");
    $r = upload($loc, $sid, 'x.txt', 'x', session => 'bad session!');
    is(code_of($r), 'invalid_session', "$name: a bad session name: invalid_session");
    ok(!-e "$dir/x.txt", "$name: nothing written by them");

    # too large: over hermes_max_file (1m) an upload, nothing left of it
    $r = upload($loc, $sid, 'big.bin', encode_base64('z' x (1024 * 1024 + 1), ''),
                encoding => 'base64');
    is(code_of($r), 'file_too_large', "$name: upload over hermes_max_file: file_too_large");
    ok(!-e "$dir/big.bin" && !glob("$dir/big.bin.*"), "$name: nothing left of it");

    # over hermes_max_file a download
    run_cell($loc, $sid, "open('big.out', 'wb').write(b'y' * (1024 * 1024 + 1))");
    $r = download($loc, $sid, 'big.out');
    is(code_of($r), 'file_too_large', "$name: download over hermes_max_file: file_too_large");

    # over the MCP answer's cap (4 MiB) with hermes_max_file 100m: the
    # HTTP route is named
    run_cell($loc, $sid, "open('huge.out', 'wb').write(b'h' * (4 * 1024 * 1024 + 1))");
    $r = download($big, $sid, 'huge.out');
    is(code_of($r), 'file_too_large', "$name: download over the MCP cap: file_too_large");
    like(text_of($r), qr/4194304.*files/s, "$name: ... naming the cap and the files route");
    $r = download($big, $sid, 'nothing.here');
    is(code_of($r), 'not_found', "$name: a missing file: not_found");

    # a client gone mid-download: nothing breaks
    run_cell($loc, $sid, "open('mid.bin', 'wb').write(bytes(range(256)) * 3000)");
    for (1 .. 3) {
        my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                         PeerPort => $t->port(0)) or die;
        my $body = $JSON->encode({ jsonrpc => '2.0', id => 99, method => 'tools/call',
            params => { name => 'download_file', arguments => { path => 'mid.bin' } } });
        print $sock "POST $loc HTTP/1.1\r\nHost: localhost\r\nX-Owner: alice\r\n"
            . "Mcp-Session-Id: $sid\r\nAccept: application/json, text/event-stream\r\n"
            . "Content-Type: application/json\r\nContent-Length: " . length($body)
            . "\r\nConnection: close\r\n\r\n$body";
        sleep 0.05 * $_;
        close $sock;
    }
    sleep 1;
    $r = download($loc, $sid, 'mid.bin');
    is(length(decode_base64($r->{json}{result}{content}[0]{resource}{blob} // '')),
       256 * 3000, "$name: after clients left mid-download, a download works");

    # ---- a client's side ----

    # text: UTF-8 both ways
    my $text = "h\x{e9}llo, w\x{f6}rld\n" x 3;
    $r = upload($loc, $sid, 'notes/hello.txt', $text);
    is(is_error($r), 0, "$name: upload of text") or diag explain $r->{json};
    like(text_of($r), qr/\d+ bytes/, "$name: ... the answer says how much");
    is(slurp("$dir/notes/hello.txt"), do { my $x = $text; utf8::encode($x); $x },
       "$name: ... written as UTF-8 into the kernel dir");
    is((stat "$dir/notes/hello.txt")[2] & 07777, 0600, "$name: ... 0600");
    is(run_cell($loc, $sid, "print(open('notes/hello.txt', encoding='utf-8').read().count('\\u00e9'))"),
       "3\n", "$name: the next cell reads what was uploaded");
    $r = download($loc, $sid, 'notes/hello.txt');
    is(is_error($r), 0, "$name: download of text");
    is($r->{json}{result}{content}[0]{type}, 'text', "$name: ... as text content");
    is($r->{json}{result}{content}[0]{text}, $text, "$name: ... the same text");
    is_deeply($r->{json}{result}{structuredContent},
              { path => 'notes/hello.txt', size => length(do { my $x = $text; utf8::encode($x); $x }),
                encoding => 'utf-8' },
              "$name: ... structuredContent {path, size, encoding}");

    # binary, as base64
    my $bytes = join('', map { chr } 0 .. 255) x 64;
    $r = upload($loc, $sid, 'in/data.bin', encode_base64($bytes, ''), encoding => 'base64');
    is(is_error($r), 0, "$name: upload of binary (base64)");
    is(slurp("$dir/in/data.bin"), $bytes, "$name: ... the same bytes in the kernel dir");
    is(run_cell($loc, $sid, "d = open('in/data.bin', 'rb').read()\nprint(len(d), d[:3] == bytes([0, 1, 2]))"),
       length($bytes) . " True\n", "$name: ... read by the next cell");
    $r = download($loc, $sid, 'in/data.bin');
    my $c = $r->{json}{result}{content}[0] // {};
    is($c->{type}, 'resource', "$name: download of binary: an embedded resource");
    is($c->{resource}{mimeType}, 'application/octet-stream', "$name: ... octet-stream");
    is(decode_base64($c->{resource}{blob} // ''), $bytes, "$name: ... the same bytes");
    like($c->{resource}{uri} // '', qr{^hermes:///mcp-$sid/files/in/data\.bin$}, "$name: ... a uri naming it");
    is($r->{json}{result}{structuredContent}{encoding}, 'base64', "$name: ... encoding base64");
    is($r->{json}{result}{structuredContent}{size}, length($bytes), "$name: ... its size");

    # a file the cell wrote; an image by its magic bytes
    run_cell($loc, $sid, "import base64\nopen('plot.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + bytes(100))\n"
             . "open('photo.jpg', 'wb').write(b'\\xff\\xd8\\xff\\xe0' + bytes(50))\n"
             . "open('out.csv', 'w').write('a,b\\n1,2\\n')");
    $r = download($loc, $sid, 'out.csv');
    is($r->{json}{result}{content}[0]{text}, "a,b\n1,2\n", "$name: a file the cell wrote");
    $r = download($loc, $sid, 'plot.png');
    $c = $r->{json}{result}{content}[0] // {};
    is($c->{type}, 'image', "$name: a PNG: image content");
    is($c->{mimeType}, 'image/png', "$name: ... image/png");
    is(decode_base64($c->{data} // ''), "\x89PNG\r\n\x1a\n" . ("\0" x 100), "$name: ... its bytes");
    $r = download($loc, $sid, 'photo.jpg');
    is(($r->{json}{result}{content}[0] // {})->{mimeType}, 'image/jpeg', "$name: a JPEG: image/jpeg");

    # a path with a quote and a space: JSON and URI escaped, not broken
    $r = upload($loc, $sid, 'q"uote d.bin', encode_base64("\0\xff", ''), encoding => 'base64');
    is($r->{json}{result}{structuredContent}{path}, 'q"uote d.bin', "$name: upload: a path with a quote");
    $r = download($loc, $sid, 'q"uote d.bin');
    is($r->{json}{result}{structuredContent}{path}, 'q"uote d.bin', "$name: download: a path with a quote");
    like(($r->{json}{result}{content}[0] // {})->{resource}{uri} // '', qr{/files/q%22uote%20d\.bin$},
         "$name: ... its uri escaped");

    # an empty file; a replaced one; a kernel named by session
    $r = upload($loc, $sid, 'empty.txt', '');
    is(is_error($r), 0, "$name: upload of an empty file");
    $r = download($loc, $sid, 'empty.txt');
    is($r->{json}{result}{structuredContent}{size}, 0, "$name: ... downloaded, size 0");
    upload($loc, $sid, 'mine.txt', "replaced\n");
    is(download($loc, $sid, 'mine.txt')->{json}{result}{content}[0]{text}, "replaced\n",
       "$name: upload replaces");
    run_cell($loc, $sid, "open('named.txt', 'w').write('by name')", session => "named-$name");
    $r = download($loc, $sid, 'named.txt', session => "named-$name");
    is(text_of($r), 'by name', "$name: a kernel named by \"session\"");
    $r = download($loc, $sid, 'nothing.txt');
    is(code_of($r), 'not_found', "$name: a missing file: not_found");
    like(text_of($r), qr/^not_found: /, "$name: ... \"code: message\"");
    is_deeply([ sort keys %{ $r->{json}{result}{structuredContent}{error} || {} } ],
              [ qw(code message) ], "$name: ... and structuredContent.error");
}

# tools/list: the six tools, the new ones with their schemas
my $sid = initialize('/mcp');
my $r = rpc('/mcp', $sid, { jsonrpc => '2.0', id => 2, method => 'tools/list' });
my %tools = map { $_->{name} => $_ } @{ $r->{json}{result}{tools} || [] };
is_deeply([ sort keys %tools ],
          [ qw(download_file execute_code interrupt list_kernels reset_session upload_file) ],
          'tools/list: six tools');
for my $tool (qw(upload_file download_file)) {
    is($tools{$tool}{inputSchema}{'$schema'},
       'https://json-schema.org/draft/2020-12/schema', "$tool: \$schema 2020-12");
    is($tools{$tool}{inputSchema}{additionalProperties}, JSON::PP::false,
       "$tool: no other properties");
}
is_deeply([ sort @{ $tools{upload_file}{inputSchema}{required} } ], [qw(content path)],
          'upload_file requires path and content');
is_deeply($tools{download_file}{inputSchema}{required}, ['path'], 'download_file requires path');

# metrics: both tools counted
my $m = $t->http('GET', '/status?format=prometheus');
like($m->{content}, qr/hermes_mcp_tool_calls_total\{zone="kernels",tool="upload_file"\} [1-9]/,
     'metrics: upload_file calls');
like($m->{content}, qr/hermes_mcp_tool_calls_total\{zone="kernels",tool="download_file"\} [1-9]/,
     'metrics: download_file calls');

$t->stop;
done_testing;
