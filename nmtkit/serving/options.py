"""`ServeOptions`: every flag of `nmtkit serve` (docs/serve.md).

The model flags (DATA_DIR, --path, --device, --precision, --threads, --ema) and the search flags
(SearchConfig's: --beam, --lenpen, ..., the server's defaults for every request) are `nmtkit
generate`'s own fields, taken with `same_setting` / `group`, so the two commands cannot drift.
The rest are the server's: where it listens, how many connections it holds and how long it waits
for a slow client, how it batches, and what a request may ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nmtkit.errors import UserError
from nmtkit.backends.registry import ModelSource
from nmtkit.generation.generator import GenerateOptions
from nmtkit.generation.model_flags import check_model_options, from_flags
from nmtkit.search.config import SearchConfig
from nmtkit.settings import group, same_setting, setting

SERVER = "Server"
BATCHING = "Batching"
LIMITS = "Request limits"


@dataclass
class ServeOptions:
    """What `nmtkit serve` needs; each `setting` field is one flag."""

    paths: list[str] = same_setting(GenerateOptions, "paths")
    data_dir: str | None = same_setting(GenerateOptions, "data_dir")
    search: SearchConfig = group(SearchConfig)
    decoding: str | None = same_setting(GenerateOptions, "decoding")
    host: str = setting("127.0.0.1", flag="--host", panel=SERVER, help="Address to listen on (0.0.0.0: every interface).")
    port: int = setting(8000, flag="--port", panel=SERVER, help="TCP port (0: any free port; the log says which).")
    no_ui: bool = setting(False, flag="--no-ui", panel=SERVER, help="Serve the JSON API only: no page at / to try the model in a browser.")
    max_connections: int | None = setting(None, flag="--max-connections", panel=SERVER, help="Connections open at once at most (default: the open-file limit less an eighth, at most 1000); when full, the one waiting longest for its request is closed, or the new one gets 503.")
    header_timeout: float = setting(10.0, flag="--header-timeout", panel=SERVER, help="Seconds a connection may take to send its request's headers (408, then closed).")
    body_timeout: float = setting(30.0, flag="--body-timeout", panel=SERVER, help="Seconds a request's body may take to arrive (408, then closed); also how long an unread answer may wait.")
    graceful_timeout: float = setting(25.0, flag="--graceful-timeout", panel=SERVER, help="On SIGTERM/SIGINT: seconds to finish the requests in flight before dropping them (exit 0 if all were answered, 3 if not).")
    max_batch_sentences: int = setting(64, flag="--max-batch-sentences", panel=BATCHING, help="Sentences searched together at most (from one or several requests).")
    max_batch_tokens: int | None = setting(None, flag="--max-batch-tokens", panel=BATCHING, help="Padded source tokens per search batch at most (default: no limit).")
    max_wait_ms: float = setting(5.0, flag="--max-wait-ms", panel=BATCHING, help="How long the first waiting request waits for others to share its batch (ms).")
    max_queue: int = setting(1024, flag="--max-queue", panel=BATCHING, help="Sentences waiting at most; beyond, requests get 503 with Retry-After.")
    max_request_sentences: int = setting(128, flag="--max-request-sentences", panel=LIMITS, help="Sentences per request at most (413 beyond).")
    max_sentence_chars: int = setting(1000, flag="--max-sentence-chars", panel=LIMITS, help="Characters per sentence at most (413 beyond).")
    max_beam: int = setting(16, flag="--max-beam", panel=LIMITS, help="Largest beam a request may ask for (413 beyond).")
    device: str = same_setting(GenerateOptions, "device")
    precision: str = same_setting(GenerateOptions, "precision")
    threads: int = same_setting(GenerateOptions, "threads")
    ema: bool = same_setting(GenerateOptions, "ema")
    quantize: str = same_setting(GenerateOptions, "quantize")
    shortlist: str | None = same_setting(GenerateOptions, "shortlist")
    engine_note: str | None = field(default=None, compare=False, repr=False)  # from_flags: engine defaults chosen
    source: ModelSource | None = field(default=None, compare=False, repr=False)  # as GenerateOptions.source

    @classmethod
    def from_flags(cls, values: dict) -> "ServeOptions":
        """As `GenerateOptions.from_flags`: --max-len-b, --lenpen-form and --early-stop not given
        depend on the model (`search_flag_defaults`)."""
        return from_flags(cls, values)

    def validate(self) -> None:
        """UserError naming the flag for every impossible setting (the search's own are
        SearchConfig's, checked when it is made)."""
        check_model_options(self)
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be in 0..65535, got {self.port}")
        for flag, v in (("--max-batch-sentences", self.max_batch_sentences), ("--max-queue", self.max_queue),
                        ("--max-request-sentences", self.max_request_sentences),
                        ("--max-sentence-chars", self.max_sentence_chars), ("--max-beam", self.max_beam)):
            if v < 1:
                raise UserError(f"{flag} must be >= 1, got {v}")
        if self.max_connections is not None and self.max_connections < 1:
            raise UserError(f"--max-connections must be >= 1, got {self.max_connections}")
        for flag, v in (("--header-timeout", self.header_timeout), ("--body-timeout", self.body_timeout)):
            if not 0 < v <= 3600:
                raise UserError(f"{flag} must be in (0, 3600] seconds, got {v}")
        if not 0 <= self.graceful_timeout <= 3600:
            raise UserError(f"--graceful-timeout must be in [0, 3600] seconds, got {self.graceful_timeout}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise UserError(f"--max-batch-tokens must be >= 1, got {self.max_batch_tokens}")
        if not 0 <= self.max_wait_ms <= 60_000:
            raise UserError(f"--max-wait-ms must be in 0..60000, got {self.max_wait_ms}")
        if self.max_request_sentences > self.max_queue:
            raise UserError(f"--max-request-sentences {self.max_request_sentences} exceeds --max-queue "
                            f"{self.max_queue}: such a request could never be queued")
        if self.search.beam > self.max_beam:
            raise UserError(f"--beam {self.search.beam} exceeds --max-beam {self.max_beam}")
