"""Figures: training curves (`curves`, `nmtkit plot`) and attention pictures (`attention`,
`nmtkit attention`). Both are matplotlib figures written atomically; matplotlib is the optional
`plot` extra, imported only when a figure is drawn."""
