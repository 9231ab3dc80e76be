"""`nmtkit serve`: flag parsing for nmtkit.serving.server (docs/serve.md).

The flags are ServeOptions' fields: generate's model and search flags (the server's defaults)
and the server's own (where it listens, connections and timeouts, batching, request limits).
"""

from __future__ import annotations

from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings
from nmtkit.serving.options import ServeOptions


@app.command("serve")
@with_settings(ServeOptions, into="opts")
def serve_command(opts: ServeOptions) -> None:
    """Serve translations over HTTP (JSON) with dynamic batching, until SIGTERM or Ctrl-C.

    POST /translate {"text": [...]} answers {"translations": [...]}, each what `nmtkit generate`
    gives for the sentence with the same flags; GET /health, GET /info. Logs go to stderr.
    Exit status after a signal: 0 once every request in flight was answered, 3 if the shutdown
    dropped some (--graceful-timeout passed, or a second signal).
    """
    import typer

    from nmtkit.serving.server import serve

    status = serve(opts)
    if status:
        raise typer.Exit(status)
