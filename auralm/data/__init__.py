"""The data sets, made and read.

- ``sudoku``: sudoku generation (unique-solution puzzles by difficulty, the public CSVs' format); numpy.
- ``datadir``: preparing a data directory (``hrmctl prepare-data`` through each task's ``prepare``: sudoku
  splits, or text tokenized into a token stream with its tokenizer), its manifest and checksums, and reading a split into the
  batches each rank trains on.
- ``prepare_choices``: the values prepare-data's options take (tasks, shard widths, difficulties, named sets);
  standard library only, for hrmctl's help and completion.

May import ``auralm.errors`` and each other; never models, training, parallel, planning or tools.
"""
