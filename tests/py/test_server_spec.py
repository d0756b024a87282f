"""Speculative decoding through `kiln serve` (issue 16): `--spec-type ngram-simple` on a generated
hybrid model (tiny-qwen35) gives the same greedy text as a server without it, and reports the drafts
in `timings` (draft_n, draft_n_accepted), `/slots` and `/metrics` (llama-server's names); the
synthetic-acceptance flags warn at startup and accept what the rates say; `--spec-type draft-mtp` on a
model with an MTP block (tiny-qwen35-mtp) and `--spec-type draft-simple -md` (the target's own file)
give the plain text too; draft-mtp without an MTP block, draft-simple with a missing draft file and bad
values are refused with the flag named."""
import subprocess

import pytest
import requests

from server_harness import AGAINST, KilnServer, gen_model

pytestmark = pytest.mark.skipif(bool(AGAINST), reason="spawns kiln with its own flags")

# A prompt that repeats itself, so the n-gram drafter finds matches.
PROMPT = "one two three four five six. " * 6


def complete(url, n=48, prompt=PROMPT):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False, "ignore_eos": True}
    r = requests.post(url + "/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def model(kiln_bin, work_dir):
    return gen_model(kiln_bin, work_dir, "tiny-qwen35")


def test_ngram_simple_equals_plain_and_reports_drafts(kiln_bin, model):
    with KilnServer(kiln_bin, model, ["-np", "2", "-c", "4096"]) as s:
        plain = complete(s.url)
    args = ["-np", "2", "-c", "4096", "--metrics", "--spec-type", "ngram-simple", "--spec-draft-n-max", "4",
            "--spec-ngram-size-n", "1"]
    with KilnServer(kiln_bin, model, args) as s:
        spec = complete(s.url)
        assert spec["content"] == plain["content"]
        t = spec["timings"]
        assert t["draft_n"] > 0, t
        assert 0 <= t["draft_n_accepted"] <= t["draft_n"]
        slots = requests.get(s.url + "/slots", timeout=30).json()
        assert all("draft_n" in x and "draft_n_accepted" in x for x in slots)
        m = requests.get(s.url + "/metrics", timeout=30).text
        vals = {ln.split()[0]: float(ln.split()[1]) for ln in m.splitlines() if ln and not ln.startswith("#")}
        assert vals["llamacpp:n_draft_total"] == t["draft_n"]
        assert vals["llamacpp:n_draft_accepted_total"] == t["draft_n_accepted"]
        assert "speculative decoding: ngram-simple" in s.log_text()


@pytest.mark.parametrize("kind", ["draft-mtp", "draft-simple"])
def test_model_drafters_equal_plain(kiln_bin, work_dir, kind):
    target = gen_model(kiln_bin, work_dir, "tiny-qwen35-mtp")
    with KilnServer(kiln_bin, target, ["-c", "4096"]) as s:
        plain = complete(s.url, prompt="a b c d e f g")
    extra = ["-md", str(target)] if kind == "draft-simple" else []
    args = ["-c", "4096", "--spec-type", kind, "--spec-draft-p-min", "0", *extra]
    with KilnServer(kiln_bin, target, args) as s:
        out = complete(s.url, prompt="a b c d e f g")
        assert out["content"] == plain["content"]
        assert out["timings"]["draft_n"] > 0, out["timings"]
        if kind == "draft-simple":  # the target's own greedy drafts
            assert out["timings"]["draft_n_accepted"] > 0, out["timings"]
        assert f"speculative decoding: {kind}" in s.log_text()


def test_synthetic_rates_warn_and_accept_nothing(kiln_bin, model):
    # Rates of zero: every draft is rejected, so the output is the model's own (llama.cpp's test).
    with KilnServer(kiln_bin, model, ["-c", "4096"]) as s:
        plain = complete(s.url)
    args = ["-c", "4096", "--spec-type", "ngram-simple", "--spec-draft-n-max", "2", "--spec-ngram-size-n", "1",
            "--spec-synth-rates", "0,0"]
    with KilnServer(kiln_bin, model, args) as s:
        out = complete(s.url)
        assert out["timings"]["draft_n"] > 0
        assert out["timings"]["draft_n_accepted"] == 0
        assert out["content"] == plain["content"]
        assert "synthetic acceptance" in s.log_text()


@pytest.mark.parametrize("flags,message", [
    (["--spec-type", "draft-simple", "-md", "x.gguf"], "x.gguf"),  # no such draft file
    (["--spec-type", "draft-simple"], "-md"),
    (["--spec-type", "draft-mtp"], "draft-mtp"),  # tiny-qwen35 has no MTP block
    (["--spec-type", "ngram-simple", "--spec-synth-len", "9"], "--spec-synth-len"),
    (["--spec-type", "ngram-simple", "--spec-synth-rates", "0.2,0.5,0.1"], "--spec-synth-rates"),
    (["--spec-synth-len", "2"], "requires --spec-type"),
])
def test_refused_at_load(kiln_bin, model, flags, message):
    s = KilnServer(kiln_bin, model, ["-c", "4096"] + flags, wait=False)
    try:
        s.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        s.stop()
        pytest.fail("the server started with " + " ".join(flags))
    assert s.proc.returncode != 0
    assert message in s.log_text()
    s.stop()


def test_unknown_spec_type_names_the_flag(kiln_bin, model):
    r = subprocess.run([str(kiln_bin), "serve", "-m", str(model), "--spec-type", "mtp"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "--spec-type" in (r.stdout + r.stderr) and "unknown speculative type" in (r.stdout + r.stderr)
