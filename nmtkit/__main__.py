"""`python -m nmtkit` is the same as the `nmtkit` console script (and what torchrun launches)."""

from nmtkit.cli import main

if __name__ == "__main__":
    main()
