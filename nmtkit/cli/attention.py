"""`nmtkit attention`: flag parsing for nmtkit.generation.inspection (docs/inspect.md).

The flags are AttentionOptions' and SearchConfig's fields (their defaults and help live there).
"""

from __future__ import annotations

from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings
from nmtkit.generation.inspection import AttentionOptions


@app.command("attention")
@with_settings(AttentionOptions, into="opts")
def attention_command(opts: AttentionOptions) -> None:
    """Draw a model's attention for a few sentences (a grid of heads per PNG), or write the arrays.

    The target is --target, the split's own (--split-target), or the model's beam translation.
    Prints the path of each file written; warnings (over-long sentences) go to stderr.
    """
    from nmtkit.generation.inspection import write_attention

    for path in write_attention(opts):
        print(path)
