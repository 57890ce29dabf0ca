"""The readers of input rows, one module per kind of source that `data.dataset` (or a `data.sources` entry) names.
Each lists what the source consists of now, fingerprints it (prepare takes in only what it has not seen) and
reads its rows as RawRow records; eagle3/data/prepare.py picks the reader and calls it.

    common.py  SourceError (the one error of every reader), SourceFile, RawRow, data_sources, file_sha256
    local.py   a .jsonl/.json/.parquet file, a folder or a glob of them: listed and fingerprinted file by file
    saved.py   a datasets.save_to_disk directory: all its files one unit, read whole (by data.split)
    hub.py     a Hugging Face Hub dataset id or a dataset repository directory, through datasets.load_dataset

Adding a kind of source: docs/corpus.md, "Adding a data source".
"""
