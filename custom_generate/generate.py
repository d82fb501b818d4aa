"""RACER speculative decoding as a transformers `custom_generate` method.

    model.generate(**inputs, custom_generate="<this repository or a local path>", trust_remote_code=True,
                   max_new_tokens=256, drafter="racer", capacity="auto")

transformers loads this file and calls `generate(model, **arguments of generate())`; the work is
done by `racer.hf_generate` from RACER Studio (see README.md).
"""
try:  # inside try: transformers' import check would otherwise name a wrong package ("racer") to install
    from racer.hf_generate import generate_hub
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("this custom_generate method runs RACER Studio's `racer` package, which is not "
                      "importable here: install RACER Studio (pip install the project, or put its checkout on "
                      "PYTHONPATH); see custom_generate/README.md") from e


def generate(model, *args, **kwargs):
    return generate_hub(model, *args, **kwargs)
