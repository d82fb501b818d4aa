"""RACER as a decoding method of transformers' own `generate()`.

    out = model.generate(**inputs, custom_generate=racer.generate, max_new_tokens=128)
    out = model.generate(**inputs, custom_generate=racer.generate, do_sample=True, temperature=0.7,
                         drafter="racer", capacity="auto", streamer=streamer)

With `custom_generate=<callable>` (transformers 5.x, generation/utils.py) generate() validates
the arguments, prepares the generation config, the logits processors and the stopping criteria
as usual, then hands the decoding loop to the callable. `generate` below runs racer's decode loop
(`racer.loop.DecodeRun`) on the same model with those pieces:

* the logits processors (temperature / top-k / top-p warpers, min_new_tokens, repetition
  penalty, ...) are applied at every tree node the acceptance visits, to that node's own
  sequence (context + path), through the loop's `accept` hook, so greedy output is stock
  greedy output and every sampled token is an exact sample of the processed distribution;
* the stopping criteria are checked after every committed token, and the output is cut there;
* a streamer receives the committed tokens of each step in order.

What it cannot do exactly is refused with an error naming the option (batch size > 1, beam
search, assisted generation, returning scores, ...). The drafter's state (automaton,
copy-logit rows, learned sizing) lives for one call unless a `GenerateSession` is passed.

`generate_hub` is the entry of the Hub-style folder `custom_generate/` (loaded by
`generate(custom_generate="<repo or path>", trust_remote_code=True)`, which passes the raw
arguments instead of prepared ones).
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation import GenerateDecoderOnlyOutput, GenerationConfig, GenerationMixin

from . import cpu
from .costcurve import get_cost_curve
from .drafters import METHODS, make_drafter
from .drafters.base import Drafter
from .loop import DecodeConfig, DecodeRun
from .models import TREE_ATTENTION, LoadedModel, ModelLoadError, prepare_model
from .prompting import common_prefix
from .sizing import Sizer
from .tree import DraftTree

#: Model inputs generate() prepares itself and that racer's loop replaces (checked below).
_PREPARED_INPUTS = ("attention_mask", "position_ids", "logits_to_keep", "use_cache", "cache")


@dataclass
class RacerGenerateOutput(GenerateDecoderOnlyOutput):
    """generate()'s decoder-only output plus the tokens committed at each decoding step."""
    accept_lengths: list[int] | None = None


class GenerateSession:
    """Drafter state kept across `generate` calls of one conversation (one user, one model).

    Pass the same session to every turn of a chat; each call feeds the drafter only the tokens
    it has not seen (the new prompt's ids after what the last call fed and produced). Without a
    session every call starts from a fresh drafter: nothing leaks between calls."""

    def __init__(self) -> None:
        self.drafter: Drafter | None = None
        self.method: str | None = None
        self.sizer: Sizer | None = None
        #: Every token the drafter has seen: the last call's prompt and its output.
        self.fed: list[int] = []
        self._model: weakref.ref | None = None

    def _bind(self, model: Any, method: str, vocab_size: int) -> Drafter:
        if self._model is not None and self._model() is not model:
            raise ValueError("session: this GenerateSession belongs to another model; use one session per model")
        if self.method is not None and self.method != method:
            raise ValueError(f"session: this GenerateSession runs drafter {self.method!r}, not {method!r}")
        if self.drafter is None:
            self.drafter = make_drafter(method, vocab_size=vocab_size)
            self.method = method
            self._model = weakref.ref(model)
        return self.drafter


def _refuse(option: str, why: str) -> ValueError:
    return ValueError(f"racer.generate cannot honour {option}: {why}")


def _generate_frame() -> dict[str, Any] | None:
    """The locals of the GenerationMixin.generate call that called `generate`, if it did.

    With a callable `custom_generate`, transformers 5.24 forwards only the prepared model
    inputs and the callable's own extra parameters: `streamer`, `assistant_model` and
    `synced_gpus` stay behind in generate()'s frame (it even feeds the streamer the prompt
    before calling us). Reading them there is the one way to honour a streamer, and to refuse
    an assistant model instead of silently ignoring it, without patching transformers."""
    frame = sys._getframe(2)
    if frame is not None and frame.f_code is inspect.unwrap(GenerationMixin.generate).__code__:
        return frame.f_locals
    return None


class _Untokenized:
    """The loop decodes its output to text at the end; generate() returns token ids only."""

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return ""


#: One racer view of each transformers model (its cost curve is measured once per process).
_TARGETS: "weakref.WeakKeyDictionary[Any, LoadedModel]" = weakref.WeakKeyDictionary()


def _target(model: Any) -> LoadedModel:
    """The model as racer's loop sees it; end-of-sequence ids are set per call."""
    device, dtype = model.device, model.dtype
    lm = _TARGETS.get(model)
    if lm is not None and lm.device == device and lm.dtype == dtype:
        return lm
    config = model.config
    impl = getattr(config, "_attn_implementation", None)
    if impl not in (*TREE_ATTENTION, cpu.attention.NAME):
        raise _refuse(f"attn_implementation={impl!r}", "tree verification needs an attention that takes an "
                      "arbitrary mask; load the model with attn_implementation='sdpa' (or 'eager')")
    name = str(getattr(config, "_name_or_path", "") or type(model).__name__)
    try:
        # The caller's model is not changed: no kernel is swapped in ("stock"), only its attention
        # layout and context are read and one small tree forward checked against sequential decoding.
        lm = prepare_model(model, _Untokenized(), spec="transformers", name=name, linear_kernel="stock",
                           source="transformers")
    except ModelLoadError as e:
        raise _refuse(f"this model ({type(model).__name__})", str(e)) from e
    _TARGETS[model] = lm
    return lm


def _eos_ids(gc: GenerationConfig) -> frozenset[int]:
    eos = gc.eos_token_id
    if eos is None:
        return frozenset()
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    return frozenset([int(eos)] if isinstance(eos, int) else [int(x) for x in eos])


def _check(model: Any, input_ids: torch.Tensor, gc: GenerationConfig, model_kwargs: dict[str, Any],
           frame: dict[str, Any] | None) -> None:
    """Refuse, by name, every option whose result racer's loop cannot reproduce exactly."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise _refuse("an encoder-decoder model", "racer's loop decodes causal (decoder-only) language models")
    if frame is not None:
        if frame.get("assistant_model") is not None:
            raise _refuse("assistant_model", "RACER drafts without a second model; leave assistant_model out")
        if frame.get("synced_gpus"):
            raise _refuse("synced_gpus=True", "racer's loop runs on one device")
    if gc.constraints is not None or gc.force_words_ids is not None:
        raise _refuse("constraints / force_words_ids", "constrained beam search is a different decoding method")
    if gc.num_beams is not None and gc.num_beams > 1:
        raise _refuse(f"num_beams={gc.num_beams}", "beam search is a different decoding method; use num_beams=1")
    if not gc.do_sample and gc.penalty_alpha and gc.top_k is not None and gc.top_k > 1:
        raise _refuse(f"penalty_alpha={gc.penalty_alpha}", "contrastive search is a different decoding method")
    if gc.dola_layers is not None:
        raise _refuse("dola_layers", "DoLa decoding is a different decoding method")
    for option in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if getattr(gc, option, None) is not None:
            raise _refuse(option, "assisted generation is a different speculative method (RACER drafts its own "
                          "trees; drafter='pld' is prompt lookup inside racer's loop)")
    if getattr(gc, "use_mtp", False):
        raise _refuse("use_mtp", "multi-token-prediction drafting is a different speculative method")
    if gc.guidance_scale is not None and gc.guidance_scale != 1:
        raise _refuse(f"guidance_scale={gc.guidance_scale}", "classifier-free guidance runs the model itself, one "
                      "token at a time, inside its logits processor")
    # After the modes: generate() has already expanded the batch for beams and return sequences.
    if gc.num_return_sequences and gc.num_return_sequences > 1:
        raise _refuse(f"num_return_sequences={gc.num_return_sequences}", "it decodes one sequence per call")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise _refuse(f"batch size {input_ids.shape[0] if input_ids.dim() == 2 else tuple(input_ids.shape)}",
                      "it decodes one sequence at a time; call generate() once per prompt")
    if gc.return_dict_in_generate:
        for option in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
            if getattr(gc, option, False):
                raise _refuse(option, "racer's loop returns token ids and accept lengths, not per-token "
                              "scores, logits, attentions or hidden states")
    for key, value in model_kwargs.items():
        if key not in _PREPARED_INPUTS:
            raise _refuse(f"model input {key!r}", "it feeds the model token ids only (no embeddings, extra "
                          "inputs or caches of your own)")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise _refuse("an attention_mask with padding", "it decodes one unpadded sequence")
    pos = model_kwargs.get("position_ids")
    if pos is not None and not torch.equal(pos.flatten().cpu(), torch.arange(input_ids.shape[1])):
        raise _refuse("position_ids", "it numbers positions itself (0, 1, 2, ... for one unpadded sequence)")
    cache = model_kwargs.get("cache")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise _refuse("a filled cache (past_key_values)", "it prefills the whole prompt into its own cache")


class _Ids:
    """The sequence as generate() sees it: prompt + committed tokens in one preallocated row,
    so processors and stopping criteria get views (no copy per token)."""

    def __init__(self, prompt: torch.Tensor, room: int) -> None:
        self.row = torch.empty((1, prompt.shape[1] + room), dtype=torch.long, device=prompt.device)
        self.row[:, :prompt.shape[1]] = prompt
        self.length = prompt.shape[1]

    def view(self, n: int) -> torch.Tensor:
        return self.row[:, :n]


class _ProcessedAccept:
    """The loop's `accept` rule with generate()'s logits processors: descend the tree from the
    root; at each node run the processors on that node's sequence (context + path) and its
    logits, take the argmax (greedy) or a draw (sampling), and go on while a child carries it.
    Only the nodes on the path are processed, as sequential decoding would process them."""

    def __init__(self, ids: _Ids, processors: Any, sample: bool, generator: torch.Generator | None) -> None:
        self.ids, self.processors, self.sample, self.generator = ids, processors, sample, generator

    def __call__(self, tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
        row, n = self.ids.row, self.ids.length
        if tree.tokens[0] >= 0:          # -1: the prefill's choice, before any root token
            row[0, n] = tree.tokens[0]
            n += 1
        node, path = 0, [0]
        while True:
            # float32 like generate() (it upcasts before processing); a copy, as processors may write in place.
            scores = self.processors(row[:, :n], logits[node:node + 1].to(torch.float32, copy=True))
            if self.sample:
                probs = torch.softmax(scores[0], dim=-1)
                token = int(torch.multinomial(probs, 1, generator=self.generator).item())
            else:
                token = int(torch.argmax(scores[0]).item())
            child = tree.child(node, token)
            if child < 0:
                return path, token
            node = child
            path.append(node)
            row[0, n] = token
            n += 1


def generate(model: Any, input_ids: torch.Tensor, logits_processor: Any = None, stopping_criteria: Any = None,
             generation_config: GenerationConfig | None = None, synced_gpus: bool = False, streamer: Any = None, *,
             drafter: str = "racer", capacity: int | str = "auto", session: GenerateSession | None = None,
             **model_kwargs: Any) -> torch.Tensor | RacerGenerateOutput:
    """RACER decoding for `model.generate(..., custom_generate=racer.generate)`.

    drafter: any method of racer's loop (`racer.METHODS`: "racer", "tr", "pld", "ar", ...).
    capacity: draft tree size including the root, or "auto" (sized from this machine's measured
    cost curve; the first call on a machine measures it, seconds, then it is cached on disk).
    session: a `GenerateSession` to keep the drafter's state across the turns of one chat.
    Returns the token ids (prompt + new), or with return_dict_in_generate=True a
    `RacerGenerateOutput` (generate()'s decoder-only output plus `accept_lengths`).
    Stopping criteria are called with `scores=None` (scores are not kept).
    """
    frame = _generate_frame()
    if frame is not None and streamer is None:
        streamer = frame.get("streamer")
    if generation_config is None or logits_processor is None or stopping_criteria is None:
        raise TypeError("racer.generate is a decoding method for transformers' generate(): call "
                        "model.generate(..., custom_generate=racer.generate)")
    gc = generation_config
    _check(model, input_ids, gc, model_kwargs, frame)
    if drafter not in METHODS:
        raise ValueError(f"drafter={drafter!r} is not a method of racer's loop; known: {', '.join(METHODS)}")
    lm = dataclasses.replace(_target(model), eos_ids=_eos_ids(gc))
    prompt = [int(t) for t in input_ids[0].tolist()]
    budget = int(gc.max_length) - len(prompt)
    if len(prompt) + budget > lm.max_context:
        raise _refuse(f"max_new_tokens={budget} after a {len(prompt)}-token prompt",
                      f"tree attention on this model stays exact within {lm.max_context} tokens of context")

    new_from = 0
    if session is not None:
        draft = session._bind(model, drafter, lm.vocab_size)
        new_from = common_prefix(session.fed, prompt)
    else:
        draft = make_drafter(drafter, vocab_size=lm.vocab_size)
    sizer = None
    if capacity == "auto":
        sizer = session.sizer if session is not None else None
        if sizer is None:
            # Measured on the cached view, so the curve is measured (or read from disk) once per process.
            sizer = Sizer(get_cost_curve(_target(model)))
            if session is not None:
                session.sizer = sizer

    ids = _Ids(input_ids, max(budget, lm.max_context - len(prompt)) + 1)
    processors = logits_processor if len(logits_processor) else None
    accept = None
    if gc.do_sample or processors is not None:
        gen = None
        if gc.do_sample:
            # Seeded from torch's global generator, so torch.manual_seed(s) makes a call reproducible.
            gen = torch.Generator(device=model.device)
            gen.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        accept = _ProcessedAccept(ids, processors if processors is not None else (lambda _ids, s: s),
                                  bool(gc.do_sample), gen)

    run = DecodeRun(lm, prompt, draft, DecodeConfig(max_new_tokens=budget, capacity=capacity),
                    new_from=new_from, accept=accept, sizer=sizer)
    new: list[int] = []
    lengths: list[int] = []
    try:
        for rec in run:
            step: list[int] = []
            stop = False
            for token in rec.committed:
                ids.row[0, ids.length] = token
                ids.length += 1
                step.append(token)
                if bool(stopping_criteria(ids.view(ids.length), None).any()):
                    stop = True
                    break
            new.extend(step)
            lengths.append(len(step))
            if streamer is not None and step:
                streamer.put(torch.tensor(step, dtype=torch.long))
            if stop:
                break
    finally:
        # Also on an error, so a TextIteratorStreamer's reader is not left waiting.
        if streamer is not None:
            streamer.end()
    if session is not None:
        session.fed = prompt + new
    sequences = ids.view(ids.length).clone().to(input_ids.device)
    if gc.return_dict_in_generate:
        return RacerGenerateOutput(sequences=sequences, accept_lengths=lengths)
    return sequences


def generate_hub(model: Any, *args: Any, **kwargs: Any) -> torch.Tensor | RacerGenerateOutput:
    """The entry of the `custom_generate/` folder. Loaded from a repository or path,
    transformers calls the folder's `generate(model, **arguments of generate())` without
    preparing anything; prepare them as generate() does and decode with `generate`."""
    return GenerationMixin.generate(model, *args, custom_generate=generate, **kwargs)

