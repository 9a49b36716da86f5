// SPDX-License-Identifier: BSD-2-Clause
// The official MCP TypeScript SDK's client against a hermes_mcp location:
// node mcp-sdk-client.cjs NPM_MODULES URL; prints one JSON object of what
// it saw, for t/109 to judge.  Two MCP sessions: state kept within one,
// separate across them; progress while a cell prints; isError on an
// exception; the session ended with DELETE.
'use strict';

const path = require('path');
const [npm, url] = process.argv.slice(2);
const sdk = (p) => require(path.join(npm, '@modelcontextprotocol/sdk/dist/cjs', p));
const { Client } = sdk('client/index.js');
const { StreamableHTTPClientTransport } = sdk('client/streamableHttp.js');

function text(result) {
  return (result.content || []).filter((c) => c.type === 'text').map((c) => c.text).join('');
}

async function connect(name) {
  const client = new Client({ name, version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  return { client, transport };
}

async function main() {
  const out = {};
  const a = await connect('hermes-t109-a');
  const b = await connect('hermes-t109-b');
  out.sessions = [a.transport.sessionId, b.transport.sessionId];
  out.server = a.client.getServerVersion();
  out.tools = (await a.client.listTools()).tools.map((t) => t.name).sort();

  const call = (c, code, opts) =>
    c.client.callTool({ name: 'execute_code', arguments: { code } }, undefined, opts);

  await call(a, 'x = 41');
  out.same = text(await call(a, 'x + 1'));
  out.other = text(await call(b, "print('x' in dir())"));

  const progress = [];
  const r = await call(a,
    "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)",
    { onprogress: (p) => progress.push(p) });
  out.progress = progress;
  out.printed = text(r);

  const e = await call(a, '1/0');
  out.error = { isError: e.isError === true, text: text(e) };
  out.structured = (await call(a, 'x')).structuredContent;

  await a.transport.terminateSession();
  await a.client.close();
  await b.client.close();
  console.log(JSON.stringify(out));
}

main().catch((err) => {
  console.log(JSON.stringify({ failed: String(err && err.stack || err) }));
  process.exit(1);
});
