"""Hugging Face `transformers` interop (MarianMT): `nmtkit export --format huggingface` (`convert`)
and `nmtkit import-hf` (`importer`), over one weight mapping (`mapping`) and a model card (`card`).

An export-only format: nmtkit runs no engine on such a folder (`transformers` does); it is listed
in `nmtkit.backends.registry.EXPORT_ONLY`, not in `FORMATS`.
"""
