"""The data sets, made and read.

- ``sudoku``: sudoku generation (unique-solution puzzles by difficulty, the public CSVs' format); standard library.
- ``datadir``: preparing a data directory (``python -m auralm.data.datadir sudoku|lm``: sudoku splits, or text
  tokenized into a token stream with its tokenizer), its manifest and checksums, and reading a split into the
  batches each rank trains on.

May import ``auralm.errors`` and each other; never models, training, parallel, planning or tools.
"""
