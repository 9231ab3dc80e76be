"""`nmtkit export`: a trained model as a self-contained directory for another runtime (docs/export.md).

- `exporter`: `ExportOptions` (the command's flags) and `export` (the whole job);
- `directory`: the directory's layout, `nmtkit.json`, atomic writing and reading it back (no
  torch, no runtime imported: the generation layer reads exports through it);
- `ctranslate2`: the nmtkit Transformer as a `ctranslate2.specs.TransformerSpec`.

Decoding an export is the generation layer's (`nmtkit.generation.ct2_translator`).
"""
