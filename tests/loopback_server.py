"""The stdlib HTTP server the tests' fake servers run on, quiet about clients that hang up.

A client under test that gives up on a request (a deadline, a cancelled /metrics scrape at the end of a replay)
closes its socket while the fake may still be writing; the stdlib server then prints that BrokenPipeError's
traceback to this process's stderr, where a test checking the client's own stderr for "Traceback" would blame the
client. A real server logs a hang-up in its own log; so does this one (nowhere). Any other error in a handler is
a bug of the fake and keeps its traceback."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError, ...
            return
        super().handle_error(request, client_address)
