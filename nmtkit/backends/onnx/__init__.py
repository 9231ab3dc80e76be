"""ONNX: `convert` writes an export directory's graphs, `engine` translates with ONNX Runtime.

An export directory (`nmtkit export --format onnx`) holds `encoder.onnx` and `decoder.onnx`
(a decoder step with its caches as inputs and outputs) beside nmtkit's dictionaries, subword
models and `nmtkit.json` (`nmtkit.backends.directory`); docs/export.md gives the graphs' inputs
and outputs. The engine searches with numpy (`nmtkit.search.arrays`) and imports no torch.
Needs the `onnx` extra: pip install -e '.[onnx]' in the nmtkit checkout.
"""
