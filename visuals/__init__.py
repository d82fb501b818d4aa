"""Figures for RACER Studio: step records (or benchmark summaries) in, plotly figures out.

Pure functions, no model code. Token text comes from a `decode(token_id) -> str` callable
(default `str`). One colour code everywhere: see `visuals.colors`.
"""
from .acceptance_figure import acceptance_by_source, acceptance_histogram
from .attention_figure import attention_mask_figure
from .automaton_figure import automaton_figure, select_neighbourhood
from .benchmark_figure import benchmark_figure
from .candidates_figure import logits_tree_figure, merged_pool_figure, retrieval_candidates_figure
from .colors import (ACCEPTED_COLOR, REJECTED_COLOR, SOURCE_COLORS, SOURCE_NAMES, highlight_color_map,
                     legend_traces, method_color)
from .cost_figure import cost_curve_from_step, cost_figure
from .latency_figure import latency_figure
from .match_figure import match_figure
from .race_figure import race_figure
from .sizer_figure import sizer_figure
from .text_spans import step_boundaries, text_spans, token_sources
from .tree_figure import draft_tree_figure, label_boxes, tree_layout
from .verify_figure import verify_figure
from .what_if_figure import what_if_figure, what_if_tree_figure

__all__ = [
    "draft_tree_figure", "tree_layout", "label_boxes",
    "automaton_figure", "select_neighbourhood",
    "text_spans", "token_sources", "step_boundaries",
    "race_figure", "acceptance_histogram", "acceptance_by_source", "latency_figure", "cost_figure", "cost_curve_from_step",
    "benchmark_figure",
    # the anatomy of one step, stage by stage
    "match_figure", "retrieval_candidates_figure", "logits_tree_figure", "merged_pool_figure", "sizer_figure",
    "attention_mask_figure", "verify_figure", "what_if_figure", "what_if_tree_figure",
    "SOURCE_COLORS", "SOURCE_NAMES", "ACCEPTED_COLOR", "REJECTED_COLOR", "highlight_color_map",
    "legend_traces", "method_color",
]
