"""The bandwidth figures of a benchmark report: weight bytes a forward streams, the machine's
streaming read bandwidth, and what a method draws of it."""
import math

import pytest

from racer.bench.bandwidth import drawn, measure, stream_read_gbs, weight_bytes
from racer.tiny import tiny_lm


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def test_an_untied_input_embedding_is_not_streamed():
    model = tiny_lm(vocab=96, seed=0).model
    emb = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight.data_ptr() != emb.data_ptr()
    assert weight_bytes(model) == _bytes(model.parameters()) - _bytes([emb])


def test_a_tied_embedding_counts_once_as_the_output_projection():
    model = tiny_lm(vocab=96, seed=0).model
    untied = weight_bytes(model)
    model.get_output_embeddings().weight = model.get_input_embeddings().weight
    # The separate output matrix is gone; the shared one is streamed once, by the projection.
    assert weight_bytes(model) == _bytes(model.parameters())
    assert weight_bytes(model) == untied  # same shapes: one vocab x hidden matrix either way


def test_stream_read_bandwidth_is_a_positive_rate():
    gbs = stream_read_gbs(mib=8, repeats=2)
    assert math.isfinite(gbs) and gbs > 0.01


def test_measure_reports_how_it_measured():
    m = measure(tiny_lm(vocab=96, seed=0).model)
    assert m["weight_bytes"] > 0 and m["stream_gbs"] >= m["stream_min_gbs"] > 0 and "MiB" in m["stream_how"]


def test_drawn_is_weight_bytes_times_forwards_per_second():
    r = drawn({"weight_bytes": 200e6, "stream_gbs": 40.0}, 10.0)
    assert r["forwards_per_s"] == pytest.approx(100.0)
    assert r["weight_gbs"] == pytest.approx(20.0)
    assert r["of_stream"] == pytest.approx(0.5)
    assert drawn(None, 10.0) is None and drawn({"weight_bytes": 1, "stream_gbs": 1}, None) is None
