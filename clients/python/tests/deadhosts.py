"""Hosts of a broad crawl on loopback, each on an address of its own (its
own target): live ones, and ones dead in each way a site can be."""
from __future__ import annotations

import http.server
import socket
import threading

#: Kinds of dead host, each reached over https:// through a CONNECT (so a
#: proxy's answer to it is what is judged) but the site's 502, over http://.
CLOSED, FILTERED, BAD_TLS, SITE_502 = "closed port", "filtered port", "TLS that fails", "the site's 502"
DEAD = (CLOSED, FILTERED, BAD_TLS, SITE_502)


class Hosts:
    def __init__(self, prefix: str):
        self._prefix, self._n = prefix, 0
        self._closers = []

    def _ip(self) -> str:
        self._n += 1
        return f"{self._prefix}.{self._n}"

    def live(self) -> str:
        """A plain-HTTP site answering 200 with its own address."""
        return self._serve(200, b"live page")

    def dead(self, kind: str) -> str:
        ip = self._ip()
        if kind == SITE_502:
            return self._serve(502, b"upstream broke", ip)
        s = socket.socket()
        s.bind((ip, 0))
        port = s.getsockname()[1]
        if kind == CLOSED:
            s.close()
        elif kind == FILTERED:
            # A backlog of none, filled by one connection never accepted:
            # further SYNs go unanswered, as behind a firewall's DROP.
            s.listen(0)
            filler = socket.create_connection((ip, port))
            self._closers += [s.close, filler.close]
        else:
            s.listen(16)
            self._closers.append(s.close)
            threading.Thread(target=_not_tls, args=(s,), daemon=True).start()
        return f"https://{ip}:{port}/"

    def _serve(self, status: int, body: bytes, ip: str = "") -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        srv = http.server.ThreadingHTTPServer((ip or self._ip(), 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self._closers.append(srv.shutdown)
        host, port = srv.server_address[:2]
        return f"http://{host}:{port}/"

    def close(self) -> None:
        for c in self._closers:
            c()


def _not_tls(s: socket.socket) -> None:
    while True:
        try:
            c, _ = s.accept()
        except OSError:
            return
        try:
            c.sendall(b"this is not TLS\r\n")
        finally:
            c.close()
