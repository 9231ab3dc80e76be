"""Text preparation for the WMT14 recipes (recipes/wmt14_en_de, recipes/wmt14_en_fr).

Why a script of its own: the recipes need three small, exact text jobs that shell tools do badly
(UTF-8 checks, pair-preserving cleaning, SGM extraction identical to sacreBLEU's), and the shell
stage functions in recipes/lib/wmt14.sh stay readable when each job is one call:

  extract ARCHIVE DEST MEMBER...
                               copy the named members of a .tgz/.tar into DEST (one pass; a
                               leading "./" in the archive's names is ignored)
  sgm IN.sgm[.gz] OUT          newstest SGM -> plain text, sacreBLEU's own procedure
  corpus OUT_PREFIX SRC TGT SRC_FILE:TGT_FILE ...
                               concatenate parallel corpora into OUT_PREFIX.{SRC,TGT}, dropping
                               pairs with invalid UTF-8 and normalising characters like Moses'
                               remove-non-printing-char.perl (what fairseq's prepare scripts run)
  slice IN OUT FIRST COUNT     lines FIRST..FIRST+COUNT-1 (1-based) of IN, for SMOKE=1 runs
  lines FILE                   print the number of lines

Every output is written to a temporary name and renamed into place only when complete.
Statistics go to stderr; errors are one line and exit status 2.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import sys
import tarfile
import tempfile
import unicodedata
from pathlib import Path
from typing import IO, Iterator


class DataError(Exception):
    """A problem with the input files: reported as one line, exit status 2."""


def _open_in(path: str) -> IO[bytes]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"file not found: {p}")
    return gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")


def _raw_lines(path: str) -> Iterator[bytes]:
    """The lines of a plain or gzipped file as bytes, without the final newline (\\n only, like
    nmtkit's readers: a stray \\r or U+2028 inside a line never splits it)."""
    with _open_in(path) as fh:
        for raw in fh:
            yield raw[:-1] if raw.endswith(b"\n") else raw


class _AtomicText:
    """A UTF-8 text file written under a temporary name and renamed over `path` on success."""

    def __init__(self, path: str):
        self.path = Path(path)

    def __enter__(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.fh = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        return self.fh

    def __exit__(self, exc_type, exc, tb) -> None:
        self.fh.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            os.unlink(self.tmp)


# --- archives -----------------------------------------------------------------------------------


def extract_members(archive: str, dest: str, members: list[str]) -> None:
    """Copy `members` of a tar archive (gzip-compressed or not) to DEST/MEMBER, in one pass.

    Why not `tar -xf ARCHIVE MEMBER`: archives differ in whether their names start with "./",
    and GNU tar and bsdtar match such names differently; here both spellings are accepted, and a
    missing member is reported with the names the archive does hold."""
    wanted = {(m[2:] if m.startswith("./") else m): m for m in members}
    found: set[str] = set()
    seen: list[str] = []
    try:
        with tarfile.open(archive, "r:*") as tar:
            for info in tar:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if len(seen) < 40 and info.isfile():
                    seen.append(name)
                if name not in wanted or not info.isfile():
                    continue
                src = tar.extractfile(info)
                assert src is not None
                out = Path(dest) / wanted[name]
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_name(f".{out.name}.part")
                with open(tmp, "wb") as fo:
                    shutil.copyfileobj(src, fo, 1 << 22)
                os.replace(tmp, out)
                found.add(name)
                if len(found) == len(wanted):
                    break
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"{archive}: cannot read the archive: {e}") from None
    missing = sorted(set(wanted) - found)
    if missing:
        raise DataError(f"{archive} has no member {', '.join(missing)}; it holds e.g. {', '.join(seen[:12])}")


# --- SGM test sets ------------------------------------------------------------------------------

_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def sgm_to_text(src: str, dst: str) -> int:
    """Extract the <seg> texts of a WMT SGM file exactly as sacreBLEU does (FakeSGMLDataset):
    keep lines starting with "<seg ", strip the markup, strip and collapse whitespace. No entity
    unescaping (sacreBLEU does none either), so the text equals `sacrebleu -t wmt14/full --echo`."""
    n = 0
    with _AtomicText(dst) as out:
        for lineno, raw in enumerate(_raw_lines(src), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{src}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x})") from None
            if line.startswith("<seg "):
                text = _SEG.sub(r"\1", line)
                out.write(re.sub(r"\s+", " ", text.strip()) + "\n")
                n += 1
        if n == 0:  # inside the `with`: nothing is written
            raise DataError(f"{src}: no <seg> lines (not a WMT SGM file?)")
    return n


# --- training corpora ---------------------------------------------------------------------------


def clean_text(line: str) -> str:
    """Moses remove-non-printing-char.perl (s/\\p{C}/ /g: control, format, private-use,
    surrogate and unassigned characters become spaces), then whitespace stripped and collapsed.

    Why: a few corpus lines hold control characters, zero-width or bidi marks; the subword model
    should never learn them, and collapsing whitespace makes the cleaning step's token counts
    independent of stray spacing."""
    if not line.isascii() or any(c < " " or c == "\x7f" for c in line):
        line = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in line)
    return " ".join(line.split())


def concat_corpora(prefix: str, src_lang: str, tgt_lang: str, pairs: list[tuple[str, str]]) -> dict:
    """Concatenate parallel corpora (plain or .gz) into PREFIX.SRC and PREFIX.TGT.

    Pairs stay aligned: a pair is dropped as a whole when either side is not valid UTF-8 (counted);
    empty pairs are kept here and dropped by `nmtkit preprocess`' cleaning, which counts them.
    Each corpus must have the same number of lines on both sides, else nothing is written."""
    stats = {"pairs": 0, "invalid_utf8": 0, "per_corpus": []}
    with _AtomicText(f"{prefix}.{src_lang}") as fs, _AtomicText(f"{prefix}.{tgt_lang}") as ft:
        for src_path, tgt_path in pairs:
            n = bad = 0
            src_it, tgt_it = _raw_lines(src_path), _raw_lines(tgt_path)
            sentinel = object()
            while True:
                s = next(src_it, sentinel)
                t = next(tgt_it, sentinel)
                if s is sentinel or t is sentinel:
                    if s is not t:
                        longer = src_path if t is sentinel else tgt_path
                        raise DataError(
                            f"{src_path} and {tgt_path} differ in length ({longer} is longer; "
                            f"after {n} pairs): a damaged or wrong download?"
                        )
                    break
                n += 1
                try:
                    su, tu = s.decode("utf-8"), t.decode("utf-8")
                except UnicodeDecodeError:
                    bad += 1
                    continue
                fs.write(clean_text(su) + "\n")
                ft.write(clean_text(tu) + "\n")
            stats["pairs"] += n - bad
            stats["invalid_utf8"] += bad
            stats["per_corpus"].append((src_path, n, bad))
            print(f"  {src_path} + .{tgt_lang}: {n:,} pairs, {bad:,} dropped (invalid UTF-8)", file=sys.stderr)
    print(f"  {prefix}.{{{src_lang},{tgt_lang}}}: {stats['pairs']:,} pairs", file=sys.stderr)
    return stats


# --- small helpers ------------------------------------------------------------------------------


def slice_lines(src: str, dst: str, first: int, count: int) -> int:
    """Write lines first..first+count-1 (1-based) of `src` to `dst`; fail if `src` is shorter."""
    if first < 1 or count < 1:
        raise DataError(f"slice: FIRST and COUNT must be >= 1, got {first} {count}")
    n = 0
    with _AtomicText(dst) as out:
        for lineno, raw in enumerate(_raw_lines(src), start=1):
            if lineno < first:
                continue
            if lineno >= first + count:
                break
            try:
                out.write(raw.decode("utf-8") + "\n")
            except UnicodeDecodeError as e:
                raise DataError(f"{src}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x})") from None
            n += 1
        if n < count:
            raise DataError(f"{src}: asked for lines {first}..{first + count - 1} but it has only {first - 1 + n}")
    return n


def count_lines(path: str) -> int:
    return sum(1 for _ in _raw_lines(path))


def main(argv: list[str]) -> int:
    usage = __doc__.split("\n\n")[1]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    cmd, args = argv[0], argv[1:]
    try:
        if cmd == "extract" and len(args) >= 3:
            extract_members(args[0], args[1], args[2:])
        elif cmd == "sgm" and len(args) == 2:
            n = sgm_to_text(*args)
            print(f"  {args[1]}: {n:,} lines", file=sys.stderr)
        elif cmd == "corpus" and len(args) >= 4:
            prefix, src, tgt = args[:3]
            pairs = []
            for spec in args[3:]:
                if spec.count(":") != 1:
                    raise DataError(f"corpus: expected SRC_FILE:TGT_FILE, got {spec!r}")
                a, b = spec.split(":")
                pairs.append((a, b))
            concat_corpora(prefix, src, tgt, pairs)
        elif cmd == "slice" and len(args) == 4:
            slice_lines(args[0], args[1], int(args[2]), int(args[3]))
        elif cmd == "lines" and len(args) == 1:
            print(count_lines(args[0]))
        else:
            print(f"wmt14_data.py: bad arguments: {' '.join(argv)}\n{usage}", file=sys.stderr)
            return 2
    except (DataError, ValueError) as e:
        print(f"wmt14_data.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
