// proxy-chain in front of one upstream proxy, as crawlee users chain
// theirs: node server.mjs <listen host:port> <upstream http://user:pass@host:port>
import { Server } from "proxy-chain";

const [listen, upstream] = process.argv.slice(2);
const [host, port] = [listen.slice(0, listen.lastIndexOf(":")), Number(listen.slice(listen.lastIndexOf(":") + 1))];
const server = new Server({ host, port, verbose: false, prepareRequestFunction: () => ({ upstreamProxyUrl: upstream }) });
await server.listen();
console.log(`proxy-chain on ${listen} -> ${upstream.replace(/\/\/[^@]*@/, "//")}`);
