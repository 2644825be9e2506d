"""The chunks of rows a run's ranks stream into ``parts/`` (``RunFolder.write_rank_chunk``):
each named with its rank, its attempt's token, its process and its number, so that rows of an
earlier attempt (a rank that outlived its launcher and went on writing) or of another run (a
folder copied together) are told from the run's own and never merged as its duplicates; and
how one table's chunks combine, checked whole before anything is written."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from suite.errors import BenchError, clipped
from suite.results import schema

#: where chunks of another attempt or run found in ``parts/`` are kept, never merged
REFUSED = "refused"
#: a chunk's name: ``<table>-rank<rank>[-a<attempt>]-p<pid>-<chunk>.parquet``
CHUNK_NAME = re.compile(r"-rank\d+(?:-a([0-9a-f]+))?-p\d+-\d+\.parquet$")


def chunk_attempt(name: str) -> str | None:
    """The attempt token a chunk's file name carries (None: a chunk from before attempts)."""
    found = CHUNK_NAME.search(name)
    return found.group(1) if found else None


def foreign_line(files: list[Path], history: list[str]) -> str:
    """One line about chunks not of the run's latest attempt: how many, and whose (an
    earlier attempt of the run's ``history``, or another run), naming one.

    Args:
        files: the chunks (at least one).
        history: the run's attempt tokens, the latest last.
    """
    tokens = sorted({chunk_attempt(file.name) or "none" for file in files})
    earlier = [t for t in tokens if t in history[:-1]]
    whose = ("an earlier attempt of this run" if len(earlier) == len(tokens) else
             "another run" if not earlier else "earlier attempts and another run")
    shown = ", ".join(tokens[:3]) + (", ..." if len(tokens) > 3 else "")
    return (f"{len(files)} chunk file(s) in parts/ hold rows of {whose} (attempt {shown}; "
            f"this run's latest is {history[-1] if history else 'unknown'}), e.g. "
            f"{clipped(files[0].name)}")


def combined(frames: list[pd.DataFrame], table: str):
    """One table's frames (the merged rows, then each chunk) as one sorted Arrow table,
    converted before any table is written, so rows that cannot be one table change nothing.

    Raises:
        BenchError: they do not fit together (rows of runs of other shapes).
    """
    # lazy: pyarrow's own import is pandas' to pay where it writes parquet; here only merges
    import pyarrow as pa

    try:  # pyarrow's ArrowInvalid and ArrowTypeError are ValueError and TypeError
        return pa.Table.from_pandas(sort_rows(pd.concat(frames)), preserve_index=False)
    except (ValueError, TypeError) as exc:
        raise BenchError(f"the rows of {table} do not fit together ({type(exc).__name__}: "
                         f"{clipped(str(exc).splitlines()[0] if str(exc) else '')}): "
                         "left in parts/, nothing merged") from None


def sort_rows(frame: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in (schema.ITERATION, schema.RANK) if k in frame.columns]
    if keys:
        frame = frame.sort_values(keys, kind="stable")
    return frame.reset_index(drop=True)
