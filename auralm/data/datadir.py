"""Training data: prepared once into fixed-width binary shards with a manifest, read by the trainer.

``hrmctl prepare-data SOURCE --out DIR [--vocab-size N]`` (task ``lm``) or ``hrmctl prepare-data --task sudoku
--out DIR [--count N]``: its options are declared in cli/tools/prepare_data.py, which calls :func:`prepare`.

A data directory holds ``meta.json`` (the manifest: task, token or puzzle counts, every file's
size and sha256, the source and the options) and the shards it names. ``lm`` shards are the token
stream (uint16 when the vocabulary fits, else uint32), train and validation; ``sudoku`` shards are
records of 162 bytes, the 81 cells of a puzzle (0 = blank) then the 81 of its solution.
Preparing writes into a temporary directory and swaps it in only when everything is written, so a
failure never leaves a half-written or overwritten data directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import random
import shutil
import socket
import urllib.parse
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from auralm.data import sudoku
from auralm.data.prepare_choices import SUDOKU_DEFAULTS
from auralm.errors import UserError

FORMAT = "auralm-data/1"
EOS = "<|endoftext|>"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- writing a data directory


def write_atomically(out: Path, fill) -> None:
    """Call ``fill(tmp_dir)`` to write the data, then swap ``tmp_dir`` in as ``out``."""
    if out.exists() and any(out.iterdir()) and not (out / "meta.json").exists():
        raise UserError(f"{out} exists and is not a data directory (no meta.json): choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_manifest(tmp: Path, task: str, splits: dict, **extra) -> dict:
    files = {p.relative_to(tmp).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    meta = {"format": FORMAT, "task": task, "splits": splits, "files": files, **extra}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def up_to_date(out: Path, fp: str) -> bool:
    """True when ``out`` already holds data made from the same input with the same options."""
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    if meta.get("fingerprint") != fp:
        return False
    try:
        verify(out, meta)
    except UserError:
        return False
    return True


def puzzle_files(from_csv: str | None, test_csv: str | None, what: str) -> list[str]:
    """The files of ``--from-csv`` and ``--test-csv`` that are given, each there (``what``: "puzzles", "mazes")."""
    sources = [f for f in (from_csv, test_csv) if f]
    for f in sources:
        if not Path(f).is_file():
            raise UserError(f"{f}: no such file ({what} a line, or a CSV of question,answer[,rating] rows)")
    if test_csv and not from_csv:
        raise UserError(f"--test-csv needs --from-csv for the train {what}")
    return sources


def read_splits(from_csv: str, test_csv: str | None, train: int | None, test: int | None, seed: int, workers: int,
                form, what: str) -> tuple[list, list]:
    """(train rows, test rows) of the puzzle files ``--from-csv`` and ``--test-csv`` (auralm.data.puzzle_file, in
    ``form``), each shuffled by ``seed``: ``test`` rows (default: those of ``test_csv``, else a tenth of the file)
    and ``train`` of the rest (default: all). Too few for both is one UserError (``what``: "puzzles", "mazes")."""
    from auralm.data.puzzle_file import PuzzleFileError, read_puzzles

    try:
        rows = read_puzzles(from_csv, workers, form)
        test_rows = read_puzzles(test_csv, workers, form) if test_csv else None
    except PuzzleFileError as e:
        raise UserError(str(e)) from None
    random.Random(seed).shuffle(rows)
    if test_rows is None:
        test = test or max(1, len(rows) // 10)
        test_rows, rows = rows[:test], rows[test:]
    else:
        random.Random(seed + 1).shuffle(test_rows)
        test_rows = test_rows[:test] if test else test_rows
    train_rows = rows[:train] if train else rows
    if not train_rows or not test_rows:
        raise UserError(f"{from_csv}: {len(rows) + len(test_rows)} {what} are too few for a train and a test split")
    return train_rows, test_rows


def _without_leaks(train: list, test: list) -> tuple[list, int]:
    """The test puzzles that are no transform of any train puzzle (invariants, then an exact check)."""
    by_signature: dict[tuple, list] = {}
    for puzzle, *_ in train:
        by_signature.setdefault(sudoku.signature(puzzle), []).append(puzzle)
    kept = [t for t in test if not any(sudoku.equivalent(p, t[0]) for p in by_signature.get(sudoku.signature(t[0]), ()))]
    return kept, len(test) - len(kept)


def prepare_sudoku(out: Path, train: int | None = None, test: int | None = None, difficulty: str = "medium",
                   aug: int = 0, seed: int = 0, from_csv: str | None = None, test_csv: str | None = None,
                   count: int | None = None, min_givens: int | None = None, max_givens: int | None = None,
                   val_fraction: float = 0.1, workers: int = 2) -> str:
    """Write a sudoku data directory: ``train`` puzzles (each with ``aug`` transformed copies) and ``test`` held-out
    ones (stored as the split ``val``), generated at ``difficulty`` or read from ``from_csv`` (and ``test_csv``).
    No test puzzle is a transform of a train puzzle. ``count``/``min_givens``/``max_givens``: puzzles with a
    givens range instead of a difficulty, split by ``val_fraction``."""
    custom = count is not None
    if custom:
        lo, hi = sudoku.DIFFICULTIES.get(difficulty, (50, 60))
        min_givens = lo if min_givens is None else min_givens
        max_givens = max(hi, min_givens) if max_givens is None else max_givens
        if not 17 <= min_givens <= max_givens <= 80:
            raise UserError(f"givens must satisfy 17 <= min ({min_givens}) <= max ({max_givens}) <= 80")
        test = max(1, int(count * val_fraction))
        train = count - test
        if train < 1:
            raise UserError(f"--count {count} is too small: need at least 2 puzzles (train and validation)")
    elif difficulty not in sudoku.DIFFICULTIES:
        raise UserError(f"--difficulty {difficulty}: expected one of {', '.join(sudoku.DIFFICULTIES)}")
    for name, value in (("--train", train), ("--test", test)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be at least 1")
    if aug < 0:
        raise UserError("--aug must not be negative")
    sources = puzzle_files(from_csv, test_csv, "puzzles")
    options = dict(train=train, test=test, difficulty=None if (custom or from_csv) else difficulty, aug=aug, seed=seed,
                   givens=[min_givens, max_givens] if custom else None,
                   csv=[(Path(f).name, sha256_file(Path(f))) for f in sources] or None)
    fp = fingerprint({"format": FORMAT, "task": "sudoku", "options": options})
    if up_to_date(out, fp):
        return f"up to date: {out}"

    if from_csv:
        from auralm.data.puzzle_file import SUDOKU

        train_rows, test_rows = read_splits(from_csv, test_csv, train, test, seed, workers, SUDOKU, "puzzles")
    elif custom:
        puzzles, solutions = sudoku.generate(train + test, seed, min_givens, max_givens)
        made = [(p, s, None) for p, s in zip(puzzles, solutions)]
        test_rows, train_rows = made[:test], made[test:]
    else:
        made = sudoku.generate_rated(train + test, seed, difficulty, workers)
        test_rows, train_rows = made[:test], made[test:]
    test_rows, leaks = _without_leaks(train_rows, test_rows)
    if not test_rows:
        raise UserError(f"every one of the {leaks} test puzzles is a train puzzle or a transform of one: give test "
                        f"puzzles of their own (--test-csv) or fewer train puzzles (--train)")

    def fill(tmp: Path) -> None:
        base = np.array([[p, s] for p, s, _ in train_rows], np.uint8)
        parts = [base]
        rng = np.random.default_rng(seed)
        for _ in range(aug):
            parts.append(sudoku.augment_batch(base, rng).astype(np.uint8))
        np.concatenate(parts).tofile(tmp / "train_000.bin")
        np.array([[p, s] for p, s, _ in test_rows], np.uint8).tofile(tmp / "val_000.bin")
        givens = [sum(1 for v in p if v) for p, _, _ in train_rows + test_rows]
        ratings = [r for *_, r in train_rows + test_rows if r is not None]
        stats = {"givens": {"min": min(givens), "mean": round(sum(givens) / len(givens), 2), "max": max(givens)}}
        if ratings:
            stats["rating"] = {"min": min(ratings), "mean": round(sum(ratings) / len(ratings), 2), "max": max(ratings),
                               "kind": "guesses of auralm.data.sudoku.rate" if not from_csv else "the CSV's rating"}
        splits = {"train": {"files": ["train_000.bin"], "puzzles": len(base) * (aug + 1), "base_puzzles": len(base)},
                  "val": {"files": ["val_000.bin"], "puzzles": len(test_rows)}}
        source = {"csv": [Path(f).name for f in sources]} if from_csv else {"generator": "auralm.data.sudoku"}
        write_manifest(tmp, "sudoku", splits, dtype="uint8", record=[2, 81], options=options, source=source,
                  fingerprint=fp, difficulty=options["difficulty"], leaks_removed=leaks, **stats)

    write_atomically(out, fill)
    what = f"{difficulty} " if options["difficulty"] else ""
    copies = f" x {aug + 1} with augmented copies" if aug else ""
    dropped = f"; {leaks} test puzzles were transforms of train puzzles and are left out" if leaks else ""
    return (f"wrote {len(train_rows)} {what}train puzzles{copies} and {len(test_rows)} held-out test puzzles "
            f"to {out}{dropped}")


def ensure(data_dir: Path, task: str, make) -> None:
    """``make()`` (it writes ``data_dir`` and returns the line that says what) if ``data_dir`` has no data yet: the
    default data of ``task``; ranks sharing a disk wait on a lock."""
    if (data_dir / "meta.json").exists():
        return
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(data_dir.parent / f".{data_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (data_dir / "meta.json").exists():
            print(f"generating the default {task} data in {data_dir} ...", flush=True)
            print(make(), flush=True)


def ensure_sudoku(data_dir: Path) -> None:
    """The default sudoku data in ``data_dir`` unless it is there (``ensure``)."""
    ensure(data_dir, "sudoku", lambda: prepare_sudoku(data_dir, **SUDOKU_DEFAULTS))


def train_path_dir(source: Path) -> tuple[Path, bool]:
    """Where the trainer prepares ``data.train_path=FILE``, and whether that is the cache: ``FILE.auralm/``
    beside the file, or, when the file's directory is not writable, ``~/.cache/auralm/data/<name>-<hash of its
    absolute path>`` (``$XDG_CACHE_HOME`` when set)."""
    source = source.expanduser()
    if os.access(source.absolute().parent, os.W_OK | os.X_OK):
        return source.parent / f"{source.name}.auralm", False
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    tag = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
    return cache / "auralm" / "data" / f"{source.name}-{tag}", True


def _source_files(source: str, config: str | None = None) -> list[Path] | None:
    """The local files of ``source`` (a file or a directory of them), or None for a dataset: a name on the Hub, or
    with ``config`` a local dataset directory (its README's ``configs:``, or a loading script)."""
    path = Path(source)
    if config and path.is_dir():
        return None
    if config and path.exists():
        raise UserError(f"--config {config} names a configuration of a dataset; {source} is a file: drop --config")
    if not path.exists():
        if source.startswith((".", "/", "~")) or Path(source).suffix in (".txt", ".jsonl", ".json", ".parquet"):
            raise UserError(f"data source {source} does not exist")
        return None
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                  and p.suffix in (".txt", ".jsonl", ".json", ".parquet"))
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        raise UserError(f"data source {source} is empty (no non-empty .txt, .jsonl or .parquet file)")
    return files


def _hub_reachable() -> bool:
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (80 if url.scheme == "http" else 443)), timeout=3).close()
        return True
    except OSError:
        return False


def _read_jsonl(files: list[Path], text_field: str) -> list[str]:
    """Every line's ``text_field`` string; a line that is not JSON, or has no such string, is one UserError naming
    the file and the line (``datasets`` would either fail without the line or drop the row silently)."""
    texts = []
    for f in files:
        with open(f, "rb") as fh:
            for n, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw)
                except UnicodeDecodeError:
                    raise UserError(f"{f}, line {n}: not UTF-8 text") from None
                except ValueError as e:
                    raise UserError(f"{f}, line {n}: not JSON ({getattr(e, 'msg', e)})") from None
                text = row.get(text_field) if isinstance(row, dict) else None
                if not isinstance(text, str):
                    raise UserError(f"{f}, line {n}: no {text_field!r} string (each line must be one object like "
                                    f"{{\"{text_field}\": \"...\"}})")
                texts.append(text)
    return texts


def _hub_name() -> str:
    return urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "the Hub"


def _dataset_name(source: str, config: str | None) -> str:
    return f"{source} (config {config})" if config else source


def _read_texts(source: str, files: list[Path] | None, text_field: str, split: str, config: str | None = None,
                streaming: bool = False):
    """The texts of ``source``: a list, or (``streaming``) an iterator that reads the dataset as it is consumed."""
    if files is not None and all(f.suffix == ".jsonl" for f in files) and not streaming:
        return _read_jsonl(files, text_field)
    import datasets  # only preparing lm data needs it

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors are ours to say, in one line
    local = files is not None or Path(source).exists()
    offline = not local and not _hub_reachable()
    if offline and streaming:
        raise UserError(f"cannot stream dataset {_dataset_name(source, config)}: {_hub_name()} is unreachable from "
                        f"this machine (streaming reads the Hub as it goes); connect, or prepare the data where the "
                        f"Hub answers and copy it here (`hrmctl sync-data`)")
    try:
        if files is None:
            if offline:  # use the local cache only, instead of a minute of retries
                import huggingface_hub.constants

                huggingface_hub.constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
            ds = datasets.load_dataset(source, config, split=split, streaming=streaming)
        else:
            kinds = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
            kind = {kinds[f.suffix] for f in files}
            if len(kind) > 1:
                raise UserError(f"data source {source} mixes file types ({', '.join(sorted(kind))}): use one")
            kind = kind.pop()
            extra = {"sample_by": "paragraph"} if kind == "text" else {}
            ds = datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train", streaming=streaming,
                                       **extra)
    except UserError:
        raise
    except Exception as e:  # offline hub, bad file, unknown config: one line, the library's reason
        raise _read_error(source, config, offline, e) from None
    columns = ds.column_names if not streaming else (ds.column_names or _first_columns(ds, source, config))
    if text_field not in columns:
        raise UserError(f"data source {source} has no {text_field!r} column (columns: {', '.join(columns)});"
                        " pass --text-field")
    if streaming:
        return _streamed(ds, source, config, text_field)
    return [t for t in ds[text_field] if isinstance(t, str)]


def _read_error(source: str, config: str | None, offline: bool, e: Exception) -> UserError:
    if offline:
        return UserError(f"cannot read dataset {_dataset_name(source, config)}: it is not in the local Hugging Face "
                         f"cache and {_hub_name()} is unreachable; fix: run this once where it is reachable (it "
                         f"fills the cache, HF_HOME), or give a local .txt, .jsonl or .parquet file as SOURCE")
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UserError(f"cannot read data source {_dataset_name(source, config)}: {reason}")


def _first_columns(ds, source: str, config: str | None) -> list[str]:
    """A streamed dataset whose features are not declared: the columns of its first row."""
    try:
        return list(next(iter(ds), {}))
    except Exception as e:
        raise _read_error(source, config, False, e) from None


def _streamed(ds, source: str, config: str | None, text_field: str):
    """The texts of a streamed dataset, read as they are asked for; a failure midway is one UserError."""
    rows = iter(ds)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as e:
            raise _read_error(source, config, False, e) from None
        if isinstance(row.get(text_field), str):
            yield row[text_field]


class SampleTokenizer:
    """A tokenizer.json through the tokenizers library alone: a text's ids (``tok(text)["input_ids"]``) and ids'
    text (``tok.decode(ids)``), as transformers' fast tokenizer over the same file gives them (its special tokens
    added and kept; no spaces cleaned up), without importing transformers: about 0.9 s of CPU beside torch at the
    start of every text run's rank 0, for the samples of its evaluations (2026-11-29)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def __call__(self, text: str) -> dict:
        return {"input_ids": self._tok.encode(text).ids}

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def sample_tokenizer(path):
    """What the trainer's samples need of the tokenizer at ``path``: SampleTokenizer over its tokenizer.json, or
    transformers' (load_tokenizer) for a tokenizer without one or whose decoding cleans up spaces."""
    path = Path(path)
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if (path / "tokenizer.json").is_file() and not config.get("clean_up_tokenization_spaces"):
        return SampleTokenizer(path / "tokenizer.json")
    return load_tokenizer(path)


def load_tokenizer(path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise UserError(f"cannot load tokenizer {path}: {str(e).strip().splitlines()[0]}") from None


def _train_tokenizer(texts: list[str], vocab_size: int, out: Path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS)
    tok.save_pretrained(out)
    return tok


def prepare_lm(source: str, out: Path, vocab_size: int, tokenizer: str | None, max_tokens: int | None,
               min_text_length: int, max_text_length: int | None, text_field: str = "text", split: str = "train",
               val_fraction: float = 0.05, dtype: str = "auto", shard_tokens: int = 100_000_000,
               config: str | None = None, streaming: bool = False) -> str:
    """``config``: the dataset's configuration (C4's ``en``, Wikipedia's ``20231101.es``); ``streaming``: read the
    dataset as it downloads and stop at ``max_tokens`` (required then): the tokenizer is trained on the first
    texts (about 4 bytes a token of the budget, at most TOKENIZER_SAMPLE_BYTES), then the stream is read on only
    until the budget is reached."""
    if streaming and not max_tokens:
        raise UserError("--streaming needs --max-tokens N: the token budget at which reading stops")
    files = _source_files(source, config)
    if vocab_size < 257 and tokenizer is None:
        raise UserError(f"--vocab-size {vocab_size} is too small: a byte-level BPE needs at least 257")
    if dtype == "uint16" and tokenizer is None and vocab_size > 65536:
        raise UserError(f"--vocab-size {vocab_size} does not fit the uint16 shard width (at most 65536): "
                        "use --dtype uint32 or a smaller vocabulary")
    options = dict(vocab_size=vocab_size, tokenizer=tokenizer, max_tokens=max_tokens, min_text_length=min_text_length,
                   max_text_length=max_text_length, text_field=text_field, split=split, val_fraction=val_fraction,
                   dtype=dtype, shard_tokens=shard_tokens)
    if config or streaming:  # only when given: data made before these options keeps its fingerprint
        options.update(config=config, streaming=streaming)
    src = ({"files": {str(f.resolve()): sha256_file(f) for f in files}} if files is not None
           else {"dataset": source, **({"config": config} if config else {})})
    if tokenizer is not None:
        src["tokenizer"] = {p.name: sha256_file(p) for p in sorted(Path(tokenizer).glob("*")) if p.is_file()}
    fp = fingerprint({"format": FORMAT, "task": "lm", "source": src, "options": options})
    if files is not None and up_to_date(out, fp):  # a hub dataset cannot be checked without fetching it
        return f"up to date: {out}"

    kept = (t for t in _read_texts(source, files, text_field, split, config, streaming)
            if len(t) >= min_text_length and (max_text_length is None or len(t) <= max_text_length))
    sample = _first_texts(kept, min(4 * max_tokens, TOKENIZER_SAMPLE_BYTES) if streaming else None)
    if not sample:
        raise UserError(f"data source {source} has no text between --min-text-length {min_text_length} "
                        f"and --max-text-length {max_text_length} characters")
    texts = itertools.chain(sample, kept)  # streaming: the rest is read only as the budget needs it

    def fill(tmp: Path) -> None:
        tok = load_tokenizer(tokenizer) if tokenizer else _train_tokenizer(sample, vocab_size, tmp / "tokenizer")
        if tokenizer:
            tok.save_pretrained(tmp / "tokenizer")
        vocab = len(tok)
        eos = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
        if eos is None:
            raise UserError(f"tokenizer {tokenizer} has no end-of-text token")
        width = np.uint16 if vocab <= 65536 else np.uint32
        if dtype == "uint16" and width is np.uint32:
            raise UserError(f"the tokenizer's vocabulary ({vocab}) does not fit the uint16 shard width: use --dtype uint32")
        if dtype == "uint32":
            width = np.uint32
        stream, total = [], 0
        while max_tokens is None or total < max_tokens:
            chunk = list(itertools.islice(texts, 1000 if not streaming else 64))
            if not chunk:
                break
            for ids in tok(chunk, add_special_tokens=False, return_attention_mask=False)["input_ids"]:
                stream.append(np.array(ids + [eos], dtype=width))
                total += len(ids) + 1
        tokens = np.concatenate(stream)[:max_tokens]
        n_val = int(len(tokens) * val_fraction)
        if n_val < 2 or len(tokens) - n_val < 2:
            raise UserError(f"data source {source} gives only {len(tokens)} tokens: too few for a train/validation split")
        splits = {}
        for name, part in (("train", tokens[: len(tokens) - n_val]), ("val", tokens[len(tokens) - n_val:])):
            names = []
            for i in range(0, len(part), shard_tokens):
                names.append(f"{name}_{i // shard_tokens:03d}.bin")
                part[i: i + shard_tokens].tofile(tmp / names[-1])
            splits[name] = {"files": names, "tokens": int(len(part))}
        write_manifest(tmp, "lm", splits, dtype=np.dtype(width).name, options=options, source=src, fingerprint=fp,
                  tokenizer={"path": "tokenizer", "vocab_size": vocab, "eos_id": int(eos),
                             "from": tokenizer or "trained"})

    write_atomically(out, fill)
    meta = json.loads((out / "meta.json").read_text())
    read = f"; streamed {_dataset_name(source, config)} up to the budget of {max_tokens} tokens" if streaming else ""
    return (f"wrote {meta['splits']['train']['tokens']} train and {meta['splits']['val']['tokens']} validation "
            f"tokens ({meta['dtype']}, vocabulary {meta['tokenizer']['vocab_size']}) to {out}{read}")


TOKENIZER_SAMPLE_BYTES = 200_000_000  # streaming: the tokenizer learns from at most this much of the first text


def _first_texts(texts, budget_bytes: int | None) -> list[str]:
    """All of ``texts`` (None), or the first ones up to ``budget_bytes`` of UTF-8 (the rest stays in the iterator)."""
    if budget_bytes is None:
        return list(texts)
    out, size = [], 0
    for t in texts:
        out.append(t)
        size += len(t.encode("utf-8"))
        if size >= budget_bytes:
            break
    return out


# ---------------------------------------------------------------- reading a data directory


def prepare_command(task: str, out: str) -> str:
    """The `hrmctl prepare-data` line that makes the data directory ``out`` for ``task`` (the task's own)."""
    from auralm import tasks

    return tasks.get(task).prepare_command(out)


def prepare_hint(task: str) -> str:
    """What ``prepare_command``'s SOURCE may be, after it in the same line ("" when it takes none)."""
    from auralm import tasks

    return tasks.get(task).prepare_hint


def load_manifest(data_dir: Path, task: str) -> dict:
    """The manifest of ``data_dir``, checked against the files it names and the task."""
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
    except FileNotFoundError:
        raise UserError(f"no data in {data_dir} (no meta.json): run `{prepare_command(task, str(data_dir))}`"
                        f"{prepare_hint(task)}") from None
    except ValueError as e:
        raise UserError(f"{data_dir}/meta.json is not valid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise UserError(f"{data_dir}/meta.json has format {meta.get('format')!r}, expected {FORMAT!r}: prepare the data again")
    if meta.get("task") != task:
        raise UserError(f"{data_dir} holds {meta.get('task')!r} data but task={task}: pass data_dir= or task=")
    verify(data_dir, meta)
    return meta


def verify(data_dir: Path, meta: dict) -> None:
    for name, info in meta["files"].items():
        path = data_dir / name
        if not path.exists():
            raise UserError(f"{data_dir} does not match its manifest: {name} is missing; prepare or sync the data again")
        if path.stat().st_size != info["bytes"] or sha256_file(path) != info["sha256"]:
            raise UserError(f"{data_dir} does not match its manifest: {name} has changed; prepare or sync the data again")


def manifest_hash(data_dir: Path) -> str | None:
    try:
        return hashlib.sha256((data_dir / "meta.json").read_bytes()).hexdigest()
    except OSError:
        return None


class TokenWindows:
    """The token stream of one split as windows of ``block_size + 1`` tokens (input and shifted target)."""

    def __init__(self, data_dir: Path, meta: dict, split: str, block_size: int):
        self.block = block_size
        self.shards = [np.memmap(data_dir / f, dtype=meta["dtype"], mode="r") for f in meta["splits"][split]["files"]]
        counts = [max(0, (len(s) - 1) // block_size) for s in self.shards]
        self.starts = np.cumsum([0] + counts)
        self.unit = "tokens"

    def __len__(self) -> int:
        return int(self.starts[-1])

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for i in indices:
            s = int(np.searchsorted(self.starts, i, side="right")) - 1
            off = (int(i) - int(self.starts[s])) * self.block
            rows.append(self.shards[s][off: off + self.block + 1])
        w = torch.from_numpy(np.stack(rows).astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def units(self, x: torch.Tensor) -> int:
        return x.numel()


class Puzzles:
    """Sudoku puzzles of one split: input cells (0 = blank) and targets (digit - 1; -100 on givens)."""

    def __init__(self, data_dir: Path, meta: dict, split: str):
        self.records = np.concatenate([np.fromfile(data_dir / f, dtype=np.uint8).reshape(-1, 2, 81)
                                       for f in meta["splits"][split]["files"]])
        self.unit = "puzzles"

    @classmethod
    def of(cls, records: np.ndarray) -> "Puzzles":
        """Puzzles held in memory: (n, 2, 81) uint8, each puzzle and its solution."""
        self = cls.__new__(cls)
        self.records, self.unit = records, "puzzles"
        return self

    def __len__(self) -> int:
        return len(self.records)

    def batch(self, indices, rng: np.random.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets; with ``rng``, each puzzle under its own random validity-preserving transform."""
        records = self.records[np.asarray(indices)]
        if rng is not None:
            records = sudoku.augment_batch(records, rng)
        rec = torch.from_numpy(records.astype(np.int64))
        x, y = rec[:, 0], rec[:, 1] - 1
        return x, y.masked_fill(x != 0, -100)

    def units(self, x: torch.Tensor) -> int:
        return x.shape[0]


def batches(ds, batch_size: int, rank: int, world: int, seed: int, start: int = 0, augment: bool = False):
    """Endless batches for this rank, from batch number ``start`` on.

    Each epoch is a fresh permutation (seed + epoch) split into disjoint per-rank parts by
    DistributedSampler, so the order depends only on (seed, world, batch size) and the position.
    ``augment`` (sudoku): every batch transformed by a generator seeded from (seed, rank, its position),
    so a resumed run sees the same puzzles.
    """
    sampler = DistributedSampler(range(len(ds)), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    per_epoch = len(sampler) // batch_size
    if per_epoch == 0:
        raise UserError(f"the train split has {len(ds)} samples, fewer than one batch on every rank "
                        f"(batch_size {batch_size} x {world} ranks): more data or a smaller batch")
    epoch, first = divmod(start, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for b in range(first, per_epoch):
            rows = order[b * batch_size: (b + 1) * batch_size]
            if augment:
                yield ds.batch(rows, np.random.default_rng([seed, rank, epoch * per_epoch + b]))
            else:
                yield ds.batch(rows)
        epoch, first = epoch + 1, 0


def shared_batches(ds, sizes: list[int], rank: int, seed: int, start: int = 0, augment: bool = False):
    """Endless batches for this rank when the ranks take unequal shares of each global batch (auralm.parallel.
    balance): each epoch is a permutation of the whole split (seed + epoch); global batch b is its rows
    [b*B, (b+1)*B) with B = sum(sizes), of which rank r takes sizes[r] rows after those of the ranks before it.
    ``start`` counts global batches, as ``batches`` counts its own."""
    total, first_row = sum(sizes), sum(sizes[:rank])
    per_epoch = len(ds) // total
    if per_epoch == 0:
        raise UserError(f"the train split has {len(ds)} samples, fewer than one global batch of {total}: "
                        f"more data or a smaller batch")
    epoch, first = divmod(start, per_epoch)
    while True:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(len(ds), generator=g).tolist()
        for b in range(first, per_epoch):
            rows = order[b * total + first_row: b * total + first_row + sizes[rank]]
            if augment:
                yield ds.batch(rows, np.random.default_rng([seed, rank, epoch * per_epoch + b]))
            else:
                yield ds.batch(rows)
        epoch, first = epoch + 1, 0
