"""A loopback TCP port that relays bytes to a daemon's unix API socket.

A browser cannot open a unix socket, so `make demo` and the dashboard test open the page
through this relay until the node's own HTTP listener serves it. Bytes only: HTTP is
hypercorn's on the far side. It binds 127.0.0.1, but any local user may connect to it,
unlike the socket (mode 0600): it is for demos and tests, not for serving.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from pathlib import Path

__all__ = ["UnixRelay"]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True  # an open browser connection must not keep the process up


class UnixRelay:
    """Relays 127.0.0.1:`port` to `socket_path` until `close`."""

    def __init__(self, socket_path: Path) -> None:
        target = str(socket_path)

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
                    try:
                        upstream.connect(target)
                    except OSError:
                        return  # the daemon is gone: the browser sees a closed connection
                    back = threading.Thread(target=_pump, args=(upstream, self.request))
                    back.start()
                    _pump(self.request, upstream)
                    back.join()

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
