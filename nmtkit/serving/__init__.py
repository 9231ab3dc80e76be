"""`nmtkit serve`: an HTTP translation server with dynamic batching (docs/serve.md).

- `batcher.py`: the queue and the worker thread that searches the sentences of concurrent
  requests together (no sockets; any object with `nmtkit.Translator`'s interface);
- `app.py`: the HTTP API (Starlette): request parsing, status codes, the per-request log line;
- `server.py`: binding, loading the model in the background, uvicorn, the bounded shutdown;
- `protocol.py`: the HTTP connections: uvicorn's h11 protocol with timeouts for slow clients, a
  connection limit and nmtkit's accept loop;
- `logs.py`: log lines without control characters, and one line per interval for what floods;
- `options.py`: `ServeOptions`, the command's flags.

Starlette and uvicorn are the optional `serve` extra, imported only when a server starts.
"""
