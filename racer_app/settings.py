"""Settings, limits and input validation for the app (no Gradio here: plain values in and out).

Limits depend on the hardware: on a CPU one decode runs at a time and outputs are capped
shorter. Every limit can be overridden by an environment variable (see `Limits.from_env`).
Validation never raises on user input: it clamps to the allowed range and returns the notes
that say what was changed, so the UI can show them.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from racer.copylogit import RULES
from racer.costcurve import get_cost_curve
from racer.drafters.racer import MERGES
from racer.models import LoadedModel
from racer.sizing import Sizer

MERGE_CHOICES = MERGES
BREADTH_RULES = RULES
CAPACITY_MODES = ("auto", "fixed")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _env_float(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return v if math.isfinite(v) else default


#: The largest automaton a visitor may ask for anywhere (the Settings slider's end on a GPU).
AUTOMATON_MAX = 100_000


@dataclass(frozen=True)
class Limits:
    """Per-request and per-session bounds for this server (docs/RELIABILITY.md lists them with
    the environment variables that change them)."""
    max_new_tokens: int          # clamp for any decode
    max_prompt_tokens: int       # refuse longer prompts (in tokens, after the chat template)
    time_limit_s: float          # wall time for one request (race: all three methods)
    inspector_steps: int         # steps that keep picture data (tree, automaton, rows)
    bench_max_prompts: int       # prompts one benchmark request may run
    chat_turns: int              # turns a chat keeps before asking for a reset
    decode_concurrency: int      # decodes running at once (queue the rest)
    on_gpu: bool
    # Fair share and bounded resources; the defaults are a CPU Space's (see `for_device`).
    bench_max_runs: int = 24             # prompts x methods one benchmark request may decode
    bench_time_limit_s: float = 240.0    # wall time for one benchmark request
    max_automaton: int = 20_000          # automaton nodes a visitor may choose
    session_ttl_s: float = 3600.0        # session state kept this long after its last decode
    max_sessions: int = 300              # sessions whose state is kept at once (oldest dropped)
    session_mb: float = 24.0             # state one session may hold (pictures dropped beyond it)
    files_max_age_s: float = 3600.0      # benchmark report files kept at most this long
    files_max_mb: float = 256.0          # all sessions' benchmark files together
    max_body_mb: float = 2.0             # an HTTP request body larger than this is refused unread
    queue_size: int = 64                 # events waiting in the queue at once

    @classmethod
    def for_device(cls, device_type: str) -> "Limits":
        gpu = device_type == "cuda"
        return cls(
            max_new_tokens=_env_int("RACER_MAX_NEW_TOKENS", 1024 if gpu else 512),
            max_prompt_tokens=_env_int("RACER_MAX_PROMPT_TOKENS", 4096 if gpu else 2048),
            time_limit_s=float(_env_int("RACER_TIME_LIMIT_S", 120 if gpu else 180)),
            inspector_steps=_env_int("RACER_INSPECTOR_STEPS", 400),
            bench_max_prompts=_env_int("RACER_BENCH_MAX_PROMPTS", 40 if gpu else 16),
            chat_turns=_env_int("RACER_CHAT_TURNS", 12),
            decode_concurrency=_env_int("RACER_DECODE_CONCURRENCY", 2 if gpu else 1),
            on_gpu=gpu,
            bench_max_runs=_env_int("RACER_BENCH_MAX_RUNS", 400 if gpu else 24),
            bench_time_limit_s=_env_float("RACER_BENCH_TIME_LIMIT_S", 480 if gpu else 240),
            max_automaton=min(AUTOMATON_MAX, _env_int("RACER_MAX_AUTOMATON", AUTOMATON_MAX if gpu else 20_000)),
            session_ttl_s=_env_float("RACER_SESSION_TTL_S", 3600),
            max_sessions=_env_int("RACER_MAX_SESSIONS", 1000 if gpu else 300),
            session_mb=_env_float("RACER_SESSION_MB", 64 if gpu else 24),
            files_max_age_s=_env_float("RACER_FILES_MAX_AGE_S", 3600),
            files_max_mb=_env_float("RACER_FILES_MAX_MB", 256),
            max_body_mb=_env_float("RACER_MAX_BODY_MB", 2),
            queue_size=_env_int("RACER_QUEUE_SIZE", 64),
        )


@dataclass
class Settings:
    """What the Settings view edits. Defaults come from `default_settings(device)`."""
    model: str = "default"
    capacity_mode: str = "auto"
    capacity: int = 16
    automaton_capacity: int = 10_000
    window: int = 10
    topk: int = 8
    breadth_rule: str = "paper"
    merge: str = "merge"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The order of the Settings view's inputs, as passed to event handlers.
FIELDS = tuple(f.name for f in dataclasses.fields(Settings))


def make_sizer(lm: LoadedModel, progress: Any = None) -> Sizer:
    """A fresh per-session tree sizer on this hardware's cost curve (measured once, cached)."""
    return Sizer(get_cost_curve(lm, progress=progress))


def cost_curve_figure_data(lm: LoadedModel, context: int = 256, chosen: int | None = None) -> dict[str, Any] | None:
    """`visuals.cost_figure` input from the cost curve this process already holds
    (`lm.cost_curve`), or None. Never measures."""
    curve = lm.cost_curve
    if curve is None:
        return None
    d = curve.table(int(context))
    if chosen is not None:
        d["chosen_T"] = int(chosen)
    return d


def default_settings(device_type: str = "cpu", dtype: str = "float32") -> Settings:
    """Defaults that work on the machine at hand. A CPU pays for every extra tree node
    (DESIGN §4: float32 64 nodes = 3.6x a plain step), a GPU barely does."""
    gpu = device_type == "cuda"
    if gpu:
        fixed = 64
    else:
        fixed = 24 if dtype == "bfloat16" else 16
    return Settings(capacity_mode="auto", capacity=fixed,
                    max_new_tokens=256 if gpu else 128)


def _clamp_num(name: str, value: Any, lo: float, hi: float, default: float, notes: list[str],
               integer: bool = True, label: str | None = None) -> Any:
    label = label or name.replace("_", " ")
    default = min(max(default, lo), hi)  # a default above a lowered server limit must not slip through
    try:
        if isinstance(value, bool):  # float(True) is 1.0: a checkbox value is not a count
            raise TypeError
        v = float(value)
        if math.isnan(v):
            raise ValueError
    except (TypeError, ValueError):
        notes.append(f"{label}: '{value}' is not a number; using {default}")
        return int(default) if integer else float(default)
    if math.isinf(v):  # 1e999, "inf": clamp to the nearer bound (round() would overflow)
        c = hi if v > 0 else lo
        notes.append(f"{label} {v:g} is outside {lo:g}–{hi:g}; using {c:g}")
        return int(c) if integer else float(c)
    if integer:
        v = round(v)
    if v < lo or v > hi:
        c = min(max(v, lo), hi)
        notes.append(f"{label} {v:g} is outside {lo:g}–{hi:g}; using {c:g}")
        v = c
    return int(v) if integer else float(v)


def clamp_count(value: Any, label: str, lo: int, hi: int, default: int, notes: list[str]) -> int:
    """An integer input outside the Settings view (benchmark sizes), clamped with a note like
    every setting: NaN, text or a checkbox value get the default, with a note."""
    return _clamp_num(label, value, lo, hi, default, notes, label=label)


def validate(raw: dict[str, Any] | Settings, limits: Limits, allowed_models: list[str] | None = None,
             defaults: Settings | None = None) -> tuple[Settings, list[str]]:
    """Clamp every field into its allowed range. Returns the settings and notes on what changed."""
    d = raw.to_dict() if isinstance(raw, Settings) else dict(raw)
    base = defaults or Settings()
    notes: list[str] = []
    s = Settings()
    model = str(d.get("model") or "default").strip() or "default"
    allowed = allowed_models or ["default"]
    if model not in allowed:
        notes.append(f"model '{model}' is not allowed on this server; using '{allowed[0]}'")
        model = allowed[0]
    s.model = model
    mode = str(d.get("capacity_mode") or base.capacity_mode)
    if mode not in CAPACITY_MODES:
        notes.append(f"capacity mode '{mode}' unknown; using '{base.capacity_mode}'")
        mode = base.capacity_mode
    s.capacity_mode = mode
    s.capacity = _clamp_num("capacity", d.get("capacity", base.capacity), 1, 128, base.capacity, notes,
                            label="tree capacity")
    s.automaton_capacity = _clamp_num("automaton_capacity", d.get("automaton_capacity", base.automaton_capacity),
                                      64, limits.max_automaton, base.automaton_capacity, notes,
                                      label="automaton capacity")
    s.window = _clamp_num("window", d.get("window", base.window), 2, 32, base.window, notes, label="n-gram window")
    s.topk = _clamp_num("topk", d.get("topk", base.topk), 1, 8, base.topk, notes, label="logits breadth (top-k)")
    rule = str(d.get("breadth_rule") or base.breadth_rule)
    if rule not in BREADTH_RULES:
        notes.append(f"breadth rule '{rule}' unknown; using '{base.breadth_rule}'")
        rule = base.breadth_rule
    s.breadth_rule = rule
    merge = str(d.get("merge") or base.merge)
    if merge not in MERGE_CHOICES:
        notes.append(f"merge '{merge}' unknown; using '{base.merge}'")
        merge = base.merge
    s.merge = merge
    s.temperature = _clamp_num("temperature", d.get("temperature", 0.0), 0.0, 2.0, 0.0, notes, integer=False)
    s.top_p = _clamp_num("top_p", d.get("top_p", 1.0), 0.01, 1.0, 1.0, notes, integer=False, label="top-p")
    s.seed = _clamp_num("seed", d.get("seed", 0), 0, 2**31 - 1, 0, notes)
    s.max_new_tokens = _clamp_num("max_new_tokens", d.get("max_new_tokens", base.max_new_tokens), 1,
                                  limits.max_new_tokens, base.max_new_tokens, notes, label="max new tokens")
    return s, notes


def settings_from_values(values: list[Any] | tuple[Any, ...]) -> dict[str, Any]:
    """The Settings view's component values (in `FIELDS` order) as a dict."""
    return dict(zip(FIELDS, values))


def racer_options(s: Settings) -> dict[str, Any]:
    return {"capacity_automaton": s.automaton_capacity, "window": s.window, "topk": s.topk,
            "breadth_rule": s.breadth_rule, "merge": s.merge}


def capacity_value(s: Settings) -> Any:
    """What `DecodeConfig.capacity` gets: "auto" when asked for and supported, else the int."""
    return "auto" if uses_auto(s) else int(s.capacity)


def uses_auto(s: Settings) -> bool:
    return s.capacity_mode == "auto"


def allowed_models_from_env() -> list[str]:
    """The shipped models ('default' first: they need no model hub, so no allow-list), then the
    hub ids / folders listed in RACER_ALLOWED_MODELS (comma separated)."""
    from racer.models import SHIPPED
    extra = [m.strip() for m in os.environ.get("RACER_ALLOWED_MODELS", "").split(",") if m.strip()]
    out = list(SHIPPED)
    for m in extra:
        if m not in out:
            out.append(m)
    return out


def model_choices(allowed: list[str]) -> list[tuple[str, str]]:
    """The model menu: (label, id) pairs, the shipped models by their titles."""
    from racer.models import SHIPPED
    return [(SHIPPED[m].title if m in SHIPPED else m, m) for m in allowed]
