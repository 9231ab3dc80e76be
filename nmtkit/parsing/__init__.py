"""Constituency trees for parsing-as-translation and for parseval scoring."""

from nmtkit.parsing.trees import (
    Tree,
    TreeError,
    add_root,
    parse_trees,
    read_trees,
    remove_empty,
    split_trees,
    strip_function_tags,
    strip_label,
    strip_root,
)

__all__ = [
    "Tree",
    "TreeError",
    "add_root",
    "parse_trees",
    "read_trees",
    "remove_empty",
    "split_trees",
    "strip_function_tags",
    "strip_label",
    "strip_root",
]
