"""bench/analyze/load.py reads a trace a chunk at a time (bench/analyze/trace_text.py): any chunk size gives
the same Trace, a character or an event split between two reads included, and a truncated file is still an
error."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from analyze_fixtures import GPU_META, gpu_events, write_trace, x

from bench.analyze import load, trace_text
from bench.analyze.trace import Trace


def _fields(t: Trace):
    return (list(t.names), t.name_id.tolist(), list(t.cats), t.cat_id.tolist(), t.threads, t.tid_id.tolist(),
            t.ts.tolist(), t.dur.tolist(), np.nan_to_num(t.correlation, nan=-1).tolist(),
            np.nan_to_num(t.blocks_per_sm, nan=-1).tolist(), t.comm_args, t.meta)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 4096])
def test_any_chunk_size_gives_the_same_trace(tmp_path, monkeypatch, chunk):
    # a two-byte character (é) in a name, a long number and a string after the events in the metadata
    events = [*gpu_events(), x("aten::mul_é", "cpu_op", 3, 1)]
    meta = {**GPU_META, "baseTimeNanoseconds": 1795618165530775612, "displayTimeUnit": "ms"}
    path = tmp_path / "t.json.gz"  # written as UTF-8, not \u escapes: é is two bytes that a read may split
    path.write_bytes(gzip.compress(json.dumps({**meta, "traceEvents": events}, ensure_ascii=False).encode()))
    whole = load.load_trace(path)
    monkeypatch.setattr(trace_text, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(trace_text, "AHEAD", 32)  # longer than any number in the file
    assert _fields(load.load_trace(path)) == _fields(whole)
    assert "aten::mul_é" in list(whole.names) and whole.meta["baseTimeNanoseconds"] == 1795618165530775612


def test_truncated_and_bad_json_at_small_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_text, "CHUNK_BYTES", 5)
    monkeypatch.setattr(trace_text, "AHEAD", 32)
    good = write_trace(tmp_path / "g.json.gz", gpu_events(), GPU_META)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(load.TraceError, match="truncated gzip"):
        load.load_trace(cut)
    bad = tmp_path / "bad.json"
    bad.write_bytes(gzip.decompress(good.read_bytes())[:-3])  # the closing "]}" and more cut off
    with pytest.raises(load.TraceError, match="not valid JSON"):
        load.load_trace(bad)
