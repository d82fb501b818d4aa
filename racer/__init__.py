"""RACER Studio: training-free speculative decoding (retrieval + copy-logit draft trees),
verified losslessly with tree attention on stock `transformers` models."""
from .drafters import METHODS, make_drafter
from .loop import DecodeConfig, DecodeRun, decode
from .models import LoadedModel, ModelLoadError, load_model
from .prompting import build_input_ids, to_messages
from .records import DecodeResult, StepRecord
from .tree import DraftTree

__all__ = ["METHODS", "make_drafter", "DecodeConfig", "DecodeRun", "decode", "LoadedModel", "ModelLoadError",
           "load_model", "build_input_ids", "to_messages", "DecodeResult", "StepRecord", "DraftTree",
           "generate", "GenerateSession"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # racer.generate (a transformers decoding method) imports transformers.generation, about
    # 2 s: load it when it is asked for, not with every `import racer`.
    if name in ("generate", "GenerateSession"):
        from . import hf_generate
        return getattr(hf_generate, name)
    raise AttributeError(f"module 'racer' has no attribute {name!r}")
