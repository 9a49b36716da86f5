#!/usr/bin/perl
# SPDX-License-Identifier: BSD-2-Clause
# Tool stubs an LLM can call: each tool a Python function in hermes_tools
# with the signature of its schema (an MCP server's tools/list, or
# hermes_tools_schema's file for a plain tool endpoint), its description
# as the docstring; positional arguments mapped to names, TypeError as a
# Python function raises; hermes_schema writes them as Python; nginx -t
# refuses a bad schema file, naming it.

use strict;
use warnings;

use Test::More;
use JSON::PP;

use Hermes::Test;

$SIG{$_} = sub { exit 1 } for qw(INT TERM HUP);

my $J = JSON::PP->new->canonical;
my $t = Hermes::Test->new(workers => 1);
my $p = $t->prefix;
my $hitlog = $t->mcp_server;            # port 1

# a plain tool endpoint
my $thits = $t->tool_server(2);

sub write_file {
    my ($name, $text) = @_;
    open my $fh, '>', "$p/$name" or die "$name: $!";
    print $fh $text;
    close $fh;
    return "$p/$name";
}

# the OpenAI form and the bare one, in one list
write_file('tools.json', <<'JSON');
[{"type": "function", "function": {
    "name": "echo", "description": "Echo the arguments back.",
    "parameters": {"type": "object",
        "properties": {"text": {"type": "string", "description": "what to echo"},
                       "times": {"type": "integer", "default": 1},
                       "max-len": {"type": "integer"},
                       "from": {"type": "string"}},
        "required": ["text"]}}},
 {"name": "fail", "description": "Always fails; says \"no\" \\ quotes.",
  "parameters": {"type": "object", "properties": {}}}]
JSON

my $conf = <<'CONF';
    hermes_zone kernels:1m;
    hermes_backend local root=%%KROOT%%;

    server {
        listen 127.0.0.1:%%PORT_0%%;

        location = /mcp-x { hermes_execute; hermes_tools auto; hermes_tools_pass /mcp protocol=mcp; }
        location = /mcp-schema { hermes_schema; hermes_tools auto; hermes_tools_pass /mcp protocol=mcp; }

        location = /http-x {
            hermes_execute;
            hermes_tools echo fail slow;
            hermes_tools_schema %%PREFIX%%/tools.json;
            hermes_tools_pass /tools;
        }
        location = /http-schema {
            hermes_schema;
            hermes_tools echo fail slow;
            hermes_tools_schema %%PREFIX%%/tools.json;
        }

        location /mcp {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_1%%/mcp;
            proxy_read_timeout 5s;
        }
        location /tools {
            internal;
            proxy_pass http://127.0.0.1:%%PORT_2%%/;
            proxy_read_timeout 5s;
        }
    }
CONF

$t->write_conf($conf);
$t->run;

sub out {
    my ($loc, $code) = @_;
    my $r = $t->execute($loc, {session => 's' . int(rand(1e9)), code => $code}, json => 1);
    is($r->{status}, 200, "$loc: 200") or diag $r->{raw};
    return $r->{json} // {};
}

# an MCP server's tool, called by position, as an LLM writes it
my $r = out('/mcp-x', <<'PY');
print(hermes_tools.get_sum(1, 2))
print(hermes_tools.greet())
print(hermes_tools.greet(name="nginx"))
print(hermes_tools.add(a=2, b=2))
PY
is($r->{status}, 'success', 'MCP: positional call') or diag explain $r;
is($r->{output}, "{'sum': 3}\nhello, None\nhello, nginx\n{'sum': 4}\n",
   'MCP: get_sum(1, 2) calls get-sum with {a:1, b:2}; an optional left out is not sent');
is($r->{tool_calls_made}, 4, 'MCP: the schemas asked for are no tool call');

$r = out('/mcp-x', <<'PY');
import inspect
print(inspect.signature(hermes_tools.get_sum))
print(inspect.signature(hermes_tools.greet))
for bad in ("get_sum(1)", "get_sum(1, 2, 3)", "get_sum(1, 2, c=3)", "greet('a', 'b')"):
    try:
        eval("hermes_tools." + bad)
    except TypeError as e:
        print("TypeError", e)
help(hermes_tools)
PY
like($r->{output}, qr/\A\(a: int, b: int\)\n\(\*, name: str = 'world'\)\n/,
     'MCP: signatures from inputSchema, the default from the schema');
like($r->{output}, qr/TypeError get_sum\(\): missing a required argument: 'b'\n/, 'TypeError: too few');
like($r->{output}, qr/TypeError get_sum\(\): too many positional arguments\n/, 'TypeError: too many');
like($r->{output}, qr/TypeError get_sum\(\): got an unexpected keyword argument 'c'\n/, 'TypeError: unknown keyword');
like($r->{output}, qr/TypeError greet\(\): too many positional arguments\n/, 'TypeError: an optional is keyword-only');
like($r->{output}, qr/    get_sum\(a: int, b: int\)\n        Add two integers\./, 'help(): signature and docstring');
is($r->{tool_calls_made}, 0, 'TypeError: nothing was called');

# hermes_schema of auto, now listed: Python that parses
sub parses {
    my ($desc, $name) = @_;
    my ($py) = $desc =~ /\):\n(.*)\z/s;
    $py //= '';
    write_file('sig.py', $py);
    my $out = `/usr/bin/python3 -c 'import ast,sys; t = ast.parse(open(sys.argv[1]).read()); print(" ".join(f.name + "(" + ",".join(a.arg for a in f.args.posonlyargs + f.args.args) + ";" + ",".join(a.arg for a in f.args.kwonlyargs) + ")" for f in t.body))' '$p/sig.py' 2>&1`;
    is($?, 0, "$name: the signatures parse as Python") or diag "$py\n$out";
    return $out;
}

for my $fmt (qw(openai anthropic)) {
    my $s = $t->http(GET => "/mcp-schema?format=$fmt")->{json};
    my $d = $fmt eq 'openai' ? $s->{function}{description} : $s->{description};
    like($d, qr/\ndef get_sum\(a: int, b: int\):\n    """Add two integers\."""\n/, "hermes_schema ($fmt): get_sum's def");
    my $defs = parses($d, "hermes_schema auto ($fmt)");
    like($defs, qr/^add\(args;\) greet\(;name\) .* get_sum\(a,b;\)(?: \w+\(args;\))*$/m, "$fmt: parsed as the stubs have them");
}

# a plain tool endpoint with hermes_tools_schema
$r = out('/http-x', <<'PY');
import inspect
print(inspect.signature(hermes_tools.echo))
print(hermes_tools.echo("hi", times=2, max_len=3, from_="me")["args"])
print(hermes_tools.echo("hi", **{"max-len": 4})["args"])
print(hermes_tools.echo({"text": "old"})["args"])
try:
    hermes_tools.echo()
except TypeError as e:
    print("TypeError", e)
print(inspect.signature(hermes_tools.slow))
print(hermes_tools.echo.__doc__)
PY
is($r->{output}, <<'OUT', 'HTTP tool: stubs from hermes_tools_schema') or diag explain $r;
(text: str, *, times: int = 1, max_len: int = None, from_: str = None)
{'text': 'hi', 'times': 2, 'max-len': 3, 'from': 'me'}
{'text': 'hi', 'max-len': 4}
{'text': 'old'}
TypeError echo(): missing a required argument: 'text'
(args=None, /, **kwargs)
Echo the arguments back.

Arguments:
    text (string): what to echo
    times (integer)
    max_len (integer, sent as 'max-len')
    from_ (string, sent as 'from')

Calls the gateway's tool 'echo'; raises hermes_tools.ToolError when it fails.
OUT

my $s = $t->http(GET => '/http-schema')->{json};
for my $d ($s->{openai}{function}{description}, $s->{anthropic}{description}) {
    like($d, qr/\ndef echo\(text: str, \*, times: int = 1, max_len: int = None, from_: str = None\):\n    """Echo the arguments back\."""\n/,
         'hermes_schema: a def from the file');
    like($d, qr/\ndef slow\(args: dict = None, \/, \*\*kwargs\):/, 'hermes_schema: a tool the file has not');
    my $defs = parses($d, 'hermes_schema with hermes_tools_schema');
    like($defs, qr/echo\(text;times,max_len,from_\) fail\(;\) slow\(args;\)/, 'parsed as the stubs have them');
}
$t->stop;

# nginx -t: a bad schema file fails, naming the file and what is wrong
my @bad = (
    ['{"name":"echo"}', qr/not a JSON list of tools/, 'not a list'],
    ['[{"description":"x"}]', qr/tool #1 has no "name"/, 'a tool without a name'],
    ['[{"name":"echo","parameters":[1]}]', qr/the "parameters" of tool "echo" are not an object/, 'parameters not an object'],
    ['[{"name":"a b"}]', qr/tool #1: invalid name "a b"/, 'a bad name'],
    ['[{"name":"echo"},{"name":"echo"}]', qr/tool "echo" is there twice/, 'twice'],
    ['[{"type":"function","name":"echo"}]', qr/"type" must be "function", with a "function" object/, 'OpenAI form without function'],
    ['[{"name":"echo","parameters":{"type":"object","required":"text"}}]', qr/"required" is not a list of names/, 'required not a list'],
    ['[{"name":"echo"', qr/is not JSON/, 'not JSON'],
    ['[{"name":"other"}]', qr/tool "other" is not one of "hermes_tools"/, 'a tool not in hermes_tools'],
);
for my $b (@bad) {
    my ($text, $re, $name) = @$b;
    my $f = write_file('bad.json', $text);
    $t->write_conf(<<"CONF");
    hermes_zone kernels:1m;
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /x { hermes_execute; hermes_tools_schema $f; hermes_tools echo; }
    }
CONF
    my ($rc, $out) = $t->test_config;
    isnt($rc, 0, "nginx -t fails: $name");
    like($out, qr/"hermes_tools_schema": "\Q$f\E": .*$re|"hermes_tools_schema": "\Q$f\E" $re/, "nginx -t names the file and says: $name") or diag $out;
}
$t->write_conf(<<'CONF');
    hermes_zone kernels:1m;
    server {
        listen 127.0.0.1:%%PORT_0%%;
        location = /x { hermes_execute; hermes_tools_schema %%PREFIX%%/none.json; }
    }
CONF
my ($rc, $out) = $t->test_config;
isnt($rc, 0, 'nginx -t fails: no such file');
like($out, qr/"hermes_tools_schema": cannot open ".*none\.json"/, 'and names it') or diag $out;

done_testing;
