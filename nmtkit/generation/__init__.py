"""Translating with a trained model, whatever runs it: the `Translator` (the Python API and the
one opener, `translator`), its inputs and batches (`items`), the `nmtkit generate` driver
(`generator`), `nmtkit attention` (`inspection`) and the runtime-neutral side of forced decoding
(`forced`: scores, alignments, attention of given targets).

The model work is an engine's (`nmtkit.backends`); the search and its settings are
`nmtkit.search`. Nothing is imported here, so that `import nmtkit.generation.X` stays cheap.
"""
