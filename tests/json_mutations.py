"""Mutations of JSON documents for the property tests of nmtkit's own JSON files (manifest.json,
the record of checked files, an export's nmtkit.json): keys deleted, values replaced by values of
the wrong type or names that leave the directory, keys added."""

from __future__ import annotations

import copy

from hypothesis import strategies as st

# values put in place of any entry: wrong types, names that are no plain file name, huge numbers
WEIRD = [None, True, False, 0, 1, -1, 2**63, 10**300, 1e308, float("inf"), "", ".", "..", "../outside.txt",
         "/etc/hostname", "a/b", "a\\b", "x\x00y", "dict.en.txt", "manifest.json", "nmtkit.json",
         ".nmtkit-verified.json", "nope.txt", "subword-nmt", "sentencepiece", "ctranslate2", "huggingface", "de",
         "en", [], {}, [1, 2], {"file": "dict.de.txt"}, {"de": None}, "0" * 64, "x" * 300]

WEIRD_VALUES = st.one_of(
    st.sampled_from(WEIRD), st.text(max_size=8), st.integers(), st.floats(allow_nan=False),
    st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
                 lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3),
                 max_leaves=6),
)
NEW_KEYS = st.sampled_from(["extra", "de", "en", "file", "files", "kinds", "name", "../x"]) | st.text(max_size=4)


def paths(doc, prefix=()) -> list[tuple]:
    """Every key path in a JSON document (objects and arrays)."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out.extend(paths(v, (*prefix, k)))
    return out


def mutate(data, doc: dict, max_mutations: int = 3) -> dict:
    """A copy of `doc` with 1 to `max_mutations` entries deleted, replaced by weird values or added
    (`data`: Hypothesis's st.data())."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, max_mutations), label="mutations")):
        path = data.draw(st.sampled_from([(), *paths(doc)]), label="at")
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        target = parent[path[-1]] if path else doc
        how = data.draw(st.sampled_from(["delete", "replace", "add"]), label="how")
        if how == "add" and isinstance(target, dict):
            target[data.draw(NEW_KEYS, label="key")] = copy.deepcopy(data.draw(WEIRD_VALUES, label="value"))
        elif how == "delete" and path:
            del parent[path[-1]]
        elif path:
            parent[path[-1]] = copy.deepcopy(data.draw(WEIRD_VALUES, label="value"))  # WEIRD's are shared
    return doc


def replaced(doc: dict, where: tuple, value) -> dict:
    """A deep copy of `doc` with the entry at key path `where` set to `value`."""
    out = copy.deepcopy(doc)
    parent = out
    for k in where[:-1]:
        parent = parent[k]
    parent[where[-1]] = value
    return out
