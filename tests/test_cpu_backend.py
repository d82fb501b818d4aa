"""racer.cpu as a whole: the kernels build wherever they can (so the kernel tests' hardware skips
cannot hide a broken build), each family's switch turns off that family alone, and the load notes
say what runs."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from racer import cpu
from racer.cpu import ON, Switches
from racer.cpu.build import bf16, extension, unavailable_reason
from racer.cpu.linear import kernel_of
from racer.cpu.norm import FastRMSNorm
from racer.tiny import tiny_lm

ROOT = Path(__file__).resolve().parent.parent


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def test_the_kernels_build_where_a_compiler_and_avx2_exist():
    if not (shutil.which("c++") or shutil.which("g++")) or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("no C++ compiler or no AVX2 here: racer runs on PyTorch's kernels")
    assert ON.compiled, "RACER_CPU_KERNELS=0 is set for the test run"
    assert extension() is not None, unavailable_reason()
    # The bf16 kernels run exactly where the CPU has AVX512-BF16.
    assert bf16() == ("avx512_bf16" in _cpu_flags())


def test_switches_read_the_environment(monkeypatch):
    for name in ("RACER_CPU_KERNELS", "RACER_LINEAR", "RACER_NORM_KERNEL", "RACER_STEP_ATTENTION", "RACER_FAST_LAYER",
                 "RACER_ROW_KERNEL"):
        monkeypatch.delenv(name, raising=False)
    assert Switches.from_env() == Switches()
    monkeypatch.setenv("RACER_LINEAR", "packed")
    monkeypatch.setenv("RACER_NORM_KERNEL", "0")
    monkeypatch.setenv("RACER_ROW_KERNEL", "0")
    s = Switches.from_env()
    assert (s.linear, s.norm, s.rows, s.fast_layer, s.step_attention, s.compiled) == \
        ("packed", False, False, True, True, True)
    monkeypatch.setenv("RACER_LINEAR", "fastest")
    with pytest.raises(ValueError, match="RACER_LINEAR='fastest'"):
        Switches.from_env()


@pytest.fixture
def switches():
    saved = Switches(**vars(ON))
    yield ON
    for k, v in vars(saved).items():
        setattr(ON, k, v)


def norms(lm) -> int:
    return sum(type(m) is FastRMSNorm for m in lm.model.modules())


@pytest.mark.skipif(extension() is None, reason="racer's CPU kernels do not build here")
def test_each_switch_turns_off_its_family_only(switches):
    full = tiny_lm()
    assert kernel_of(full.model) == "tiled" and norms(full) and cpu.layers.count(full.model)
    assert any("RMSNorm" in n for n in full.notes) and any("decoder-layer" in n for n in full.notes)

    switches.norm = False
    lm = tiny_lm()
    assert not norms(lm) and kernel_of(lm.model) == "tiled" and not any("RMSNorm" in n for n in lm.notes)
    switches.norm = True

    switches.fast_layer = False
    lm = tiny_lm()
    assert not cpu.layers.count(lm.model) and norms(lm) and not any("decoder-layer" in n for n in lm.notes)
    switches.fast_layer = True

    switches.linear = "packed"
    lm = tiny_lm()
    assert kernel_of(lm.model) == "packed" and norms(lm) and not cpu.layers.count(lm.model)
    assert lm.notes[0].startswith("oneDNN packed")


@pytest.mark.skipif(extension() is None, reason="racer's CPU kernels do not build here")
def test_the_row_switch_sends_rows_to_pytorch(switches, monkeypatch):
    from racer.cpu import rows
    x = torch.randn(3, 50)
    called = []
    real = rows.extension
    monkeypatch.setattr(rows, "extension", lambda: called.append(1) or real())
    rows.argmax(x)
    assert called
    called.clear()
    switches.rows = False
    assert torch.equal(rows.argmax(x), x.argmax(-1)) and not called


def test_no_compiled_kernels_at_all():
    """RACER_CPU_KERNELS=0: nothing is built and the model runs on oneDNN's and PyTorch's kernels."""
    code = ("import json; from racer.cpu import extension, unavailable_reason; from racer.tiny import tiny_lm; "
            "from racer.cpu.linear import kernel_of; lm = tiny_lm(); print(json.dumps([extension() is None, "
            "unavailable_reason(), kernel_of(lm.model), lm.notes]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"RACER_CPU_KERNELS": "0", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert out.returncode == 0, out.stderr
    none, reason, kernel, notes = json.loads(out.stdout)
    assert none and "RACER_CPU_KERNELS=0" in reason and kernel in ("packed", "small-batch")
    assert not any("RMSNorm" in n or "decoder-layer" in n for n in notes)


def test_a_model_off_the_cpu_never_asks_for_the_kernels(monkeypatch):
    """On a GPU machine the cost curve's cache key must not build the CPU kernels (a minute of the
    GPU's time); "meta" stands in for the GPU here."""
    from racer.kvcache import new_cache

    lm = tiny_lm(vocab=32, kernel="stock")
    model = lm.model.to("meta")

    def built():
        raise AssertionError("the CPU kernels were asked for")
    monkeypatch.setattr(cpu, "extension", built)
    monkeypatch.setattr("racer.kvcache.extension", built)
    assert cpu.signature(model) == {"kernel": "stock", "layers": "module", "norm": "torch",
                                    "step_attention": "torch", "rows": "torch", "silu_mul": "torch"}
    cache = new_cache(model)
    k = torch.zeros(1, 2, 6, 4, device="meta")
    for i in range(len(cache.layers)):
        cache.layers[i].update(k, k)
    assert cache.compact(2, [0, 2]) is False
