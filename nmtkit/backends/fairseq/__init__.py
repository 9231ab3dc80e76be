"""fairseq checkpoints brought into nmtkit (`nmtkit import-fairseq`), read without running them.

`unpickle.py` reads the file (torch's weights-only loader, fairseq's classes as inert records),
`convert.py` maps its architecture and weights onto nmtkit's `Transformer`, `importer.py` writes
the nmtkit checkpoint and data directory.
"""
