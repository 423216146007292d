// A host built on the official TypeScript SDK client: starts the proxy over stdio,
// runs the steps named on the command line and prints one JSON object of what it saw.
import { createRequire } from "node:module";
import path from "node:path";

const modules = process.env.AGENTRT_NODE_MODULES;
const require = createRequire(path.join(modules, "noop.js"));
const { Client } = await import(require.resolve("@modelcontextprotocol/sdk/client/index.js"));
const { StdioClientTransport } = await import(
  require.resolve("@modelcontextprotocol/sdk/client/stdio.js")
);

const [command, ...args] = JSON.parse(process.env.AGENTRT_PROXY_COMMAND);
const calls = JSON.parse(process.env.AGENTRT_CALLS);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "ignore" });
const client = new Client({ name: "agentrt-ts-host", version: "1.0.0" });
const logged = [];
const originalError = console.error;
console.error = (...parts) => logged.push(parts.map(String).join(" "));
await client.connect(transport);
// What the proxy sent, in the order it arrived: the SDK hands notifications to their
// handlers a microtask later but settles a response at once (shared/protocol.js), so a
// progress note read in the same chunk as its call's response never reaches onprogress.
const wire = [];
const deliver = transport.onmessage;
transport.onmessage = (message, extra) => {
  if (message.method === "notifications/progress") {
    wire.push({ progress: message.params.progress });
  } else if (message.id !== undefined && message.method === undefined) {
    wire.push({ response: message.id });
  }
  deliver(message, extra);
};
const seen = { tools: (await client.listTools()).tools, results: [], progress: [], wire };
seen.resources = (await client.listResources()).resources;
seen.prompts = (await client.listPrompts()).prompts;
for (const call of calls) {
  const result = await client.callTool(
    { name: call.name, arguments: call.arguments },
    undefined,
    { onprogress: (note) => seen.progress.push(note), timeout: 60000 },
  );
  seen.results.push(result);
}
await client.close();
console.error = originalError;
seen.logged = logged;
process.stdout.write(JSON.stringify(seen));
