"""nmtkit's own runtime: checkpoints run by PyTorch (`engine.TorchEngine`), searched by
`nmtkit.search.beam`, teacher-forced by `forced` for scores, alignments and attention."""
