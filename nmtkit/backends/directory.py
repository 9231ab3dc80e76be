"""The self-contained export directory: what it holds, writing it atomically, and reading it back.

Why one module for both directions: `nmtkit export` writes the directory and `nmtkit generate
--path DIR` / `Translator.load(DIR)` read it; the file names, `nmtkit.json`'s schema and its
checks must agree, and this module imports neither torch nor a runtime, so the generation layer
can read a directory's description cheaply.

Layout (docs/export.md):

    model.bin, config.json, *_vocabulary.json   the runtime's own model (CTranslate2 today)
    dict.SRC.txt, dict.TGT.txt                  the data directory's dictionaries (ids <-> tokens)
    spm*.model / bpe*.codes                     its subword model(s) (segmentation, detokenization)
    nmtkit.json                                 written last: what the directory is (below)

`nmtkit.json` holds `format` / `format_version`, the runtime and its quantization, the
architecture (`arch`, `arch_config`), the languages and task, the source checkpoint (its path as
given, sha256, update, whether its EMA weights were taken, the files it was averaged from), and
`data`: the data directory manifest's entries for the copied files (`source_lang`, `target_lang`,
`task`, `parsing`, `subword`, `dictionaries`, `files` with sha256), in the manifest's own schema,
so that the data directory's readers (`load_dictionaries`, `subword_model_path` and
`load_model_file`, the parsing tree writer) read the export directory through the same code.

Writing: the directory is built in a hidden working folder beside it and put into place
(`atomic_directory`); an export that is killed leaves its working folders, which the next export
into the same folder removes once their lock shows their export gone (`remove_leftovers`). How
the folders are locked, swapped and cleaned up is nmtkit.workdir's, shared with the data directory.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from nmtkit import workdir
from nmtkit.errors import UserError
from nmtkit.io import read_json

INFO_NAME = "nmtkit.json"
FORMAT_NAME = "nmtkit-export"
FORMAT_VERSION = 1


def is_export_dir(path: str | os.PathLike) -> bool:
    """True for a directory holding an `nmtkit.json` (an export), whatever its state."""
    p = Path(path)
    return p.is_dir() and (p / INFO_NAME).is_file()


def read_info(path: str | os.PathLike) -> dict:
    """Read and check `DIR/nmtkit.json` alone (what the directory is, its runtime among it);
    UserError (one line naming the file) for a missing, foreign, newer or incomplete description."""
    d = Path(path)
    p = d / INFO_NAME
    if not p.is_file():
        raise UserError(f"{d} is not an nmtkit export directory (no {INFO_NAME}; make one with nmtkit export)")
    info = read_json(p)
    if not isinstance(info, dict) or info.get("format") != FORMAT_NAME:
        raise UserError(f"{p}: not an nmtkit export description (format is not {FORMAT_NAME!r})")
    if not isinstance(info.get("format_version"), int) or info["format_version"] > FORMAT_VERSION:
        raise UserError(f"{p}: export format version {info.get('format_version')!r} is newer than this nmtkit "
                        f"understands ({FORMAT_VERSION}); upgrade nmtkit")
    for key in ("runtime", "arch_config", "data"):
        if not isinstance(info.get(key), dict):
            raise UserError(f"{p}: incomplete export description (no {key!r})")
    name = info["runtime"].get("name")
    if not isinstance(name, str):  # the format the registry looks up
        raise UserError(f"{p}: runtime.name must be the name of a runtime, got {repr(name)[:60]}")
    return info


def check_files(path: str | os.PathLike, info: dict) -> None:
    """The directory's files against its description `info` (`read_info`): the runtime's
    present, every copied data file checked against its sha256. UserError (one line naming the
    file) for a damaged directory."""
    from nmtkit.data.manifest import check_entries, is_file_name, verify_files

    d = Path(path)
    names = info["runtime"].get("files", [])
    if not isinstance(names, list) or not all(is_file_name(n) for n in names):  # none outside the directory
        raise UserError(f"{d / INFO_NAME}: runtime.files must be a list of file names in the directory, "
                        f"got {repr(names)[:60]}")
    for name in names:
        if not (d / name).is_file():
            raise UserError(f"{d / name}: missing (listed in {INFO_NAME}); export the model again")
    data = info["data"]
    for key in ("dictionaries", "subword", "files"):
        if not isinstance(data.get(key), dict):
            raise UserError(f"{d / INFO_NAME}: incomplete export description (no 'data.{key}')")
    check_entries(data, str(d / INFO_NAME), "data.")
    verify_files(d, data)


def data_files(manifest: dict) -> list[str]:
    """The data directory files an export needs: both dictionaries and the subword model(s)."""
    names = []
    for lang in (manifest["source_lang"], manifest["target_lang"]):
        names.append(manifest["dictionaries"][lang]["file"])
        sub = manifest["subword"]["files"].get(lang)
        if sub is not None:
            names.append(sub)
    return list(dict.fromkeys(names))  # a joined dictionary or joint model is one file


def data_section(manifest: dict, names: list[str]) -> dict:
    """The manifest entries an export keeps (its schema, restricted to the copied files)."""
    data = {
        "source_lang": manifest["source_lang"],
        "target_lang": manifest["target_lang"],
        "subword": manifest["subword"],
        "dictionaries": manifest["dictionaries"],
        "files": {n: manifest["files"][n] for n in names if n in manifest["files"]},
        "fingerprint": manifest.get("fingerprint"),
    }
    if "task" in manifest:
        data["task"] = manifest["task"]
    if isinstance(manifest.get("multilingual"), dict):  # the languages and their tags (nmtkit.data.languages)
        data["multilingual"] = {k: manifest["multilingual"][k] for k in ("pairs", "langs", "tags")}
    if isinstance(manifest.get("parsing"), dict):  # the tree writer needs the part-of-speech mode only
        data["parsing"] = {"pos_tags": manifest["parsing"].get("pos_tags")}
    return data


def check_output(output: str | os.PathLike, force: bool, inputs: list[tuple[str, str | os.PathLike]]) -> Path:
    """Refuse an --output that exists (unless --force replaces an earlier export) or that holds an input.

    `inputs`: (flag, path) of what the export reads; replacing a folder that contains one of them
    would delete it.
    """
    out = Path(output)
    if out.exists() or out.is_symlink():
        if not force:
            raise UserError(f"--output {out} exists; pass --force to replace it")
        if not out.is_dir():
            raise UserError(f"--output {out} is a file, not an export directory; choose another --output")
        if any(out.iterdir()) and not (out / INFO_NAME).is_file():
            raise UserError(f"--output {out} is not an nmtkit export directory (no {INFO_NAME}); "
                            "--force replaces only an earlier export: choose another --output")
    resolved = out.resolve()
    for flag, p in inputs:
        q = Path(p).resolve()
        if q == resolved or resolved in q.parents:
            raise UserError(f"--output {out} would contain {flag} {p}; choose another --output")
    return out


# ---- the working folders (nmtkit.workdir locks them, swaps the new directory in and cleans up) -----

# Beside --output NAME: `.NAME.nmtkit-export-XXXXXXXX.tmp` (the new directory being built) and
# `.NAME.nmtkit-export-XXXXXXXX.old` (an earlier export moved aside for the rename).
_FOLDERS = workdir.WorkFolders(
    build=".{name}.nmtkit-export-{rand}.tmp", aside=".{name}.nmtkit-export-{rand}.old", marker=INFO_NAME,
    restored="restored {target} from {name}, where an interrupted 'nmtkit export --force' had moved it",
    removed="removed {path}, left by an interrupted 'nmtkit export'")


def remove_leftovers(output: str | os.PathLike) -> list[str]:
    """Remove the working folders that killed exports left beside `output` (for any --output in
    that folder); return what was done, one line each, for the user.

    An export that a --force replacement moved aside and that is missing is put back instead.
    Folders of exports still running are locked, and left alone. Call it before checking
    --output, which a restored export occupies again.
    """
    return _FOLDERS.clear(Path(output), every_name=True)


@contextlib.contextmanager
def atomic_directory(output: str | os.PathLike) -> Iterator[Path]:
    """A new hidden folder beside `output`, put in place as `output` only if the block succeeds.

    An earlier `output` (the caller allowed it with --force) is swapped out and deleted (or moved
    aside for the rename, where the system cannot swap), so a crash leaves either the old
    directory or the new one, and a failure in the block leaves `output` untouched and no
    temporary folder behind. A kill leaves the locked working folders, which `remove_leftovers`
    removes (or puts back) once this process is gone.
    """
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _FOLDERS.build_folder(out)
    try:
        yield tmp
        _FOLDERS.put_in_place(tmp, out)
    except BaseException:
        workdir.discard(tmp)
        raise


def write_info(folder: Path, info: dict) -> None:
    """Write `nmtkit.json` (last: its presence marks a complete directory)."""
    from nmtkit.io import atomic_write

    info = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **info}
    with atomic_write(folder / INFO_NAME, "w") as fh:
        json.dump(info, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
