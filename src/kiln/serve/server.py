"""uvicorn around :class:`kiln.serve.app.Api`: :func:`serve` in the foreground (``kiln
serve``), :class:`ServerThread` in a background thread (tests, benchmarks).

The engine thread starts with the server and stops after it, so no request is left waiting.
"""

from __future__ import annotations

import socket
import threading
import time

from kiln.errors import KilnError
from kiln.serve.model import ServedModel
from kiln.serve.scheduler import Scheduler


def _config(model: ServedModel, scheduler: Scheduler, host: str, port: int, log_level: str):
    import uvicorn

    from kiln.serve.app import Api

    return uvicorn.Config(Api(model, scheduler).app(), host=host, port=port,
                          log_level=log_level, access_log=log_level == "info",
                          timeout_graceful_shutdown=5)


def serve(model: ServedModel, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 8,
          max_queue: int = 64, log_level: str = "info") -> None:
    """Serve ``model`` until interrupted (Ctrl-C: uvicorn's graceful shutdown).

    Raises
    ------
    KilnError
        If ``max_batch``/``max_queue`` are out of range.
    """
    import uvicorn

    scheduler = Scheduler(model.decoder, max_batch, max_queue)
    scheduler.start()
    try:
        uvicorn.Server(_config(model, scheduler, host, port, log_level)).run()
    finally:
        scheduler.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """``model`` served on ``host:port`` from a background thread.

    >>> with ServerThread(model, max_batch=4) as srv:
    ...     openai.OpenAI(base_url=srv.url + "/v1", api_key="-")

    Attributes
    ----------
    url : str
        ``http://host:port``.
    scheduler : Scheduler
    """

    def __init__(self, model: ServedModel, host: str = "127.0.0.1", port: int | None = None,
                 max_batch: int = 8, max_queue: int = 64, log_level: str = "warning"):
        import uvicorn

        port = port or free_port(host)
        self.url = f"http://{host}:{port}"
        self.scheduler = Scheduler(model.decoder, max_batch, max_queue)
        self._server = uvicorn.Server(_config(model, self.scheduler, host, port, log_level))
        self._thread = threading.Thread(target=self._server.run, name="kiln-serve-http",
                                        daemon=True)

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        """Start the engine and the server; returns once it accepts connections.

        Raises
        ------
        KilnError
            If the server did not start within ``timeout_s``.
        """
        self.scheduler.start()
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise KilnError(f"kiln serve did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop the server (open streams are cut), then the engine."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        self.scheduler.stop()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
