"""`nmtkit export`: flag parsing for nmtkit.backends.export (docs/export.md).

The flags are ExportOptions' fields (their defaults and help live there).
"""

from __future__ import annotations

from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings
from nmtkit.backends.export import ExportOptions


@app.command("export")
@with_settings(ExportOptions, into="opts")
def export_command(opts: ExportOptions) -> None:
    """Export a checkpoint and its data directory's dictionaries and subword model(s) as one
    self-contained directory for another runtime (CTranslate2, ONNX Runtime, Hugging Face
    transformers); `nmtkit generate --path DIR` translates with the CTranslate2 and ONNX ones."""
    from nmtkit.console import plain_text, stderr_console
    from nmtkit.backends.export import export

    # plain text: a path with [brackets] or :colons: stays as it is (no markup, no emoji)
    with stderr_console().status(plain_text("export")) as spinner:
        result = export(opts, status=lambda msg: spinner.update(plain_text(f"export: {msg}")))
    print(result.line())
