"""`kiln fit` (the memory planner's command, docs/memory.md) on metadata-only files, no GPU.

The models are `kiln gguf gen --meta-only` headers of the real Qwen3.5 shapes; the projector is
written by gguf-py's GGUFWriter (header and tensor infos only) with Qwen3.5-9B's vision tower, so its
size is computed here independently of kiln. Expected KV sizes are computed by hand from the shapes.
"""
import re
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")  # in scripts/requirements.txt: present in normal runs
from gguf import GGUFWriter  # noqa: E402

MIB = 1 << 20


def run(kiln_bin, *args, env=None):
    return subprocess.run([str(kiln_bin), *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def models(kiln_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    out = {}
    for name, preset, mix, extra in [("9b", "qwen35-9b", "iq4_xs", ["--mtp"]), ("27b", "qwen35-27b", "q4_k_m", []),
                                     ("0.8b", "qwen35-0.8b", "q4_k_m", [])]:
        p = d / f"{name}.meta.gguf"
        r = run(kiln_bin, "gguf", "gen", "--preset", preset, "--mix", mix, *extra, "--meta-only", "-q", "-o", p)
        assert r.returncode == 0, r.stderr
        assert p.stat().st_size < 16 * MIB  # the header only
        out[name] = p
    # Qwen3.5-9B's vision tower (HF vision_config: depth 27, width 1152, FFN 4304, patch 16 x 2 frames,
    # 2x2 merge into 4096) in F16, norms, biases and the position table F32 (llama.cpp's converter keeps
    # V_ENC_EMBD_POS in F32): header and tensor infos, no data.
    proj = d / "mmproj.meta.gguf"
    w = GGUFWriter(str(proj), "clip")
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_uint32("clip.vision.block_count", 27)
    w.add_uint32("clip.vision.embedding_length", 1152)
    w.add_uint32("clip.vision.feed_forward_length", 4304)
    w.add_uint32("clip.vision.attention.head_count", 16)
    w.add_uint32("clip.vision.patch_size", 16)
    w.add_uint32("clip.vision.spatial_merge_size", 2)
    total = 0

    def t(name, shape, dtype):  # shape in numpy order (last dimension contiguous)
        nonlocal total
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        w.add_tensor_info(name, shape, np.dtype(dtype), nbytes)
        total += nbytes

    E, F, M = 1152, 4304, 4 * 1152
    t("v.patch_embd.weight", (E, 3, 16, 16), np.float16)
    t("v.patch_embd.weight.1", (E, 3, 16, 16), np.float16)
    t("v.position_embd.weight", (2304, E), np.float32)
    for i in range(27):
        p = f"v.blk.{i}."
        t(p + "attn_qkv.weight", (3 * E, E), np.float16)
        t(p + "attn_qkv.bias", (3 * E,), np.float32)
        t(p + "attn_out.weight", (E, E), np.float16)
        t(p + "attn_out.bias", (E,), np.float32)
        for n in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"):
            t(p + n, (E,), np.float32)
        t(p + "ffn_up.weight", (F, E), np.float16)
        t(p + "ffn_up.bias", (F,), np.float32)
        t(p + "ffn_down.weight", (E, F), np.float16)
        t(p + "ffn_down.bias", (E,), np.float32)
    t("v.post_ln.weight", (E,), np.float32)
    t("v.post_ln.bias", (E,), np.float32)
    t("mm.0.weight", (M, M), np.float16)
    t("mm.0.bias", (M,), np.float32)
    t("mm.2.weight", (4096, M), np.float16)
    t("mm.2.bias", (4096,), np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    out["mmproj"], out["mmproj_bytes"] = proj, total
    return out


def row(table, part):
    """(host MiB, GPU MiB) of a part in the plan table."""
    m = re.search(rf"^\s+{re.escape(part)}\s+([0-9.]+)\s+([0-9.]+)", table, re.M)
    assert m, f"no row '{part}' in:\n{table}"
    return float(m.group(1)), float(m.group(2))


def chosen(stdout):
    m = re.search(r"^-ngl (\d+) -c (\d+)(?: -ub 2048)?$", stdout, re.M)
    assert m, stdout
    return int(m.group(1)), int(m.group(2))


def test_user1_qwen35_9b_64k_projector_mtp_on_8gib(kiln_bin, models):
    r = run(kiln_bin, "fit", "-m", models["9b"], "--mmproj", models["mmproj"], "-c", 65536,
            "--spec-type", "draft-mtp", "--device-memory", "8GiB")
    assert r.returncode == 0, r.stderr
    ngl, ctx = chosen(r.stdout)
    assert ctx == 65536  # explicit: never changed
    assert 0 < ngl < 33  # the projector and the MTP head cost layers on 8 GiB
    host, gpu = row(r.stdout, "projector")
    assert gpu == pytest.approx(models["mmproj_bytes"] / MIB, abs=0.05)
    # Attention layers (every 4th, il = 3, 7, ..., 31) on the GPU (il >= 32 - ngl) x 2 (K, V) x 4 heads x
    # 256 x f16 x 65536 positions: 256 MiB each.
    n_attn_gpu = sum(1 for il in range(3, 32, 4) if il >= 32 - min(ngl, 32))
    assert row(r.stdout, "KV cache")[1] == pytest.approx(256.0 * n_attn_gpu, abs=0.05)
    # Speculation keeps --spec-draft-n-max (3: kiln serve's default, and llama-server's) recurrent states
    # per slot beside the live one, as the engine does; a longer draft keeps more and costs layers.
    assert "(1 + 3 speculative keep states)" in r.stdout and "x 4 output rows" in r.stdout, r.stdout
    assert "fits" in r.stdout
    # The CUDA context without a GPU: an RTX 4090's 128 SMs x 1536 threads x 1 KiB of local memory +
    # the driver's 262 MiB + 128 MiB of kernels loaded on use (docs/memory.md), inside the 8 GiB.
    assert row(r.stdout, "CUDA context") == (0.0, 582.0), r.stdout
    assert "8192.0 MiB (--device-memory) - 1024.0 MiB target = 7168.0 MiB usable" in r.stdout
    r16 = run(kiln_bin, "fit", "-m", models["9b"], "--mmproj", models["mmproj"], "-c", 65536,
              "--spec-type", "draft-mtp", "--spec-draft-n-max", 16, "--device-memory", "8GiB")
    assert r16.returncode == 0, r16.stderr
    assert "(1 + 16 speculative keep states)" in r16.stdout
    assert chosen(r16.stdout)[0] < ngl
    # Every layer and the output with 64K cannot fit: fail at once, naming the parts.
    r = run(kiln_bin, "fit", "-m", models["9b"], "--mmproj", models["mmproj"], "-c", 65536,
            "--spec-type", "draft-mtp", "--device-memory", "8GiB", "-ngl", "all")
    assert r.returncode == 1
    for part in ("does not fit", "weights", "KV cache", "projector", "image batch", "MTP head"):
        assert part in r.stderr, r.stderr


def test_ubatch_auto_takes_large_steps_only_where_everything_fits(kiln_bin, models):
    """-ub auto (kiln serve's default): 2048-token steps where the plan fitted at 512 keeps every layer and the
    output on the GPU and still fits with them; 512 where the context or the layers were fitted to the card,
    on the CPU, and with --fit off; an explicit -ub is kept."""
    def steps(stdout):
        m = re.search(r"activations for (\d+) tokens per step", stdout)
        assert m, stdout
        return int(m.group(1))

    roomy = ["fit", "-m", models["9b"], "-c", 32768, "--device-memory", "80GiB"]
    r = run(kiln_bin, *roomy)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^-ngl 33 -c 32768 -ub 2048$", r.stdout, re.M), r.stdout
    assert steps(r.stdout) == 2048
    big = row(r.stdout, "compute scratch")[1]
    r512 = run(kiln_bin, *roomy, "--ubatch-size", 512)
    assert re.search(r"^-ngl 33 -c 32768$", r512.stdout, re.M), r512.stdout
    assert steps(r512.stdout) == 512 and row(r512.stdout, "compute scratch")[1] < big
    r1k = run(kiln_bin, *roomy, "--ubatch-size", 1024)
    assert re.search(r"^-ngl 33 -c 32768 -ub 1024$", r1k.stdout, re.M), r1k.stdout
    # -b caps the step as in the engine (min(-b, -ub)).
    rb = run(kiln_bin, *roomy, "-b", 1024)
    assert steps(rb.stdout) == 1024 and re.search(r"^-ngl 33 -c 32768 -ub 2048$", rb.stdout, re.M), rb.stdout
    # Unset context on 8 GiB: fitted to the card, so the steps stay at 512 (context comes first).
    r8 = run(kiln_bin, "fit", "-m", models["9b"], "--device-memory", "8GiB")
    assert r8.returncode == 0, r8.stderr
    assert steps(r8.stdout) == 512 and re.search(r"^-ngl 33 -c \d+$", r8.stdout, re.M), r8.stdout
    # Layers on the CPU (explicit 64K on 8 GiB): 512.
    rp = run(kiln_bin, "fit", "-m", models["9b"], "-c", 65536, "--device-memory", "8GiB")
    assert steps(rp.stdout) == 512 and chosen(rp.stdout)[0] < 33, rp.stdout
    # --fit off: 512 (no plan is searched).
    ro = run(kiln_bin, *roomy, "--fit", "off")
    assert steps(ro.stdout) == 512, ro.stdout
    bad = run(kiln_bin, *roomy, "--ubatch-size", "big")
    assert bad.returncode == 2 and "--ubatch-size big" in bad.stderr


def test_generated_projector_is_planned_as_the_hand_written_one(kiln_bin, models, tmp_path):
    """`kiln gguf gen --mmproj --preset qwen35-9b --meta-only` (docs/gguf.md) has the tensor table written
    above with gguf-py: the plan counts the same projector bytes and chooses the same -ngl."""
    gen = tmp_path / "mmproj-9b.meta.gguf"
    r = run(kiln_bin, "gguf", "gen", "--mmproj", "--preset", "qwen35-9b", "--meta-only", "-q", "-o", gen)
    assert r.returncode == 0, r.stderr
    assert gen.stat().st_size < 1 << 20
    base = ["fit", "-m", models["9b"], "-c", 65536, "--spec-type", "draft-mtp", "--device-memory", "8GiB"]
    r_hand = run(kiln_bin, *base, "--mmproj", models["mmproj"])
    r_gen = run(kiln_bin, *base, "--mmproj", gen)
    assert r_hand.returncode == 0 and r_gen.returncode == 0, (r_hand.stderr, r_gen.stderr)
    assert row(r_gen.stdout, "projector") == row(r_hand.stdout, "projector")
    assert row(r_gen.stdout, "projector")[1] == pytest.approx(models["mmproj_bytes"] / MIB, abs=0.05)
    assert row(r_gen.stdout, "image batch") == row(r_hand.stdout, "image batch")
    assert chosen(r_gen.stdout) == chosen(r_hand.stdout)


def test_user1_context_left_unset_is_lowered_first(kiln_bin, models):
    r = run(kiln_bin, "fit", "-m", models["9b"], "--device-memory", "8GiB")
    assert r.returncode == 0, r.stderr
    ngl, ctx = chosen(r.stdout)
    assert ngl == 33 and 4096 <= ctx < 262144 and ctx % 256 == 0
    # --fit-ctx above what fits: the context stays at that floor and layers go instead.
    r = run(kiln_bin, "fit", "-m", models["9b"], "--device-memory", "8GiB", "--fit-ctx", 200000)
    assert r.returncode == 0, r.stderr
    ngl2, ctx2 = chosen(r.stdout)
    assert ctx2 == 200000 and ngl2 < 33


def test_user2_qwen35_27b_262k_q4_0_on_24gib(kiln_bin, models):
    r = run(kiln_bin, "fit", "-m", models["27b"], "-c", 262144, "-ctk", "q4_0", "-ctv", "q4_0",
            "--device-memory", "24GiB")
    assert r.returncode == 0, r.stderr
    ngl, ctx = chosen(r.stdout)
    assert ctx == 262144
    # 16 attention layers x 2 x 4 heads x 144-byte q4_0 rows x 262144 = 4.5 GiB when all are on the GPU
    if ngl == 65:
        assert row(r.stdout, "KV cache")[1] == pytest.approx(4608.0, abs=0.05)
    # f16 and every layer: impossible, exit 1 with the parts
    r = run(kiln_bin, "fit", "-m", models["27b"], "-c", 262144, "-ngl", "all", "--device-memory", "24GiB")
    assert r.returncode == 1
    assert "KV cache 16384.0 MiB" in r.stderr, r.stderr


def test_environment_cap_and_bad_flags(kiln_bin, models):
    import os
    env = dict(os.environ, KILN_DEVICE_MEMORY="4GiB")
    r = run(kiln_bin, "fit", "-m", models["9b"], "-c", 8192, env=env)
    assert r.returncode == 0, r.stderr
    assert "4096.0 MiB (--device-memory)" in r.stdout
    r = run(kiln_bin, "fit", "-m", models["9b"], "--device-memory", "8 apples")
    assert r.returncode == 2 and "--device-memory" in r.stderr
    r = run(kiln_bin, "fit", "-m", models["27b"], "--spec-type", "draft-mtp", "--device-memory", "24GiB")
    assert r.returncode == 1 and "no MTP block" in r.stderr


def test_draft_model_is_planned(kiln_bin, models):
    """--spec-type draft-simple -md: the draft model's weights, KV and recurrent state are parts of the
    plan ("draft ..."), on the GPU with -ngld, with its own cache types (-ctkd/-ctvd); they take room
    the target's layers had. The draft's KV by hand: Qwen3.5-0.8B has 6 attention layers x 2 (K, V) x
    2 heads x 256 dims; at 32768 positions in q8_0 (34 bytes per 32 values) that is 204 MiB."""
    base = ["fit", "-m", models["9b"], "-c", 32768, "--device-memory", "8GiB"]
    r0 = run(kiln_bin, *base, "--spec-type", "ngram-simple")
    assert r0.returncode == 0, r0.stderr
    r = run(kiln_bin, *base, "--spec-type", "draft-simple", "-md", models["0.8b"], "-ctkd", "q8_0", "-ctvd", "q8_0")
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "draft weights")[1] > 300  # all its layers on the GPU
    assert row(r.stdout, "draft KV cache")[1] == pytest.approx(6 * 2 * 2 * 256 * 34 / 32 * 32768 / MIB, abs=0.05)
    assert row(r.stdout, "draft recurrent state")[1] > 0
    assert chosen(r.stdout)[0] <= chosen(r0.stdout)[0]
    # -ngld 0: the draft stays on the host.
    r = run(kiln_bin, *base, "--spec-type", "draft-simple", "-md", models["0.8b"], "-ngld", 0)
    assert r.returncode == 0, r.stderr
    host, gpu = row(r.stdout, "draft weights")
    assert gpu == 0 and host > 300
    # The pair goes together.
    r = run(kiln_bin, *base, "--spec-type", "draft-simple")
    assert r.returncode == 2 and "-md" in r.stderr


# ---- MoE expert offload (--cpu-moe, --n-cpu-moe, -ot): Qwen3.5-35B-A3B shapes, metadata only ----

@pytest.fixture(scope="module")
def moe(kiln_bin, tmp_path_factory):
    """The 35B-A3B header and, independently of kiln, its expert bytes per layer read with gguf-py."""
    p = tmp_path_factory.mktemp("fit-moe") / "35b-a3b.meta.gguf"
    r = run(kiln_bin, "gguf", "gen", "--preset", "qwen35moe-35b-a3b", "--mix", "q4_k_m", "--meta-only", "-q", "-o", p)
    assert r.returncode == 0, r.stderr
    assert p.stat().st_size < 16 * MIB
    experts = [0] * 40
    # gguf-py maps the tensor data too: read a sparse copy padded past the end of the (absent) data.
    sparse = p.with_suffix(".sparse.gguf")
    sparse.write_bytes(p.read_bytes())
    with open(sparse, "r+b") as f:
        f.truncate(64 << 30)
    rd = gguf.GGUFReader(str(sparse))
    for t in rd.tensors:
        m = re.match(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$", t.name)
        if m:
            experts[int(m.group(1))] += int(t.n_bytes)
    assert all(e > 0 for e in experts)
    return p, experts


def moe_chosen(stdout):
    m = re.search(r"^-ngl (\d+) -c (\d+)(?: --n-cpu-moe (\d+)| (--cpu-moe))?(?: -ub 2048)?$", stdout, re.M)
    assert m, stdout
    n = 40 if m.group(4) else int(m.group(3) or 0)
    return int(m.group(1)), int(m.group(2)), n


def test_moe_experts_on_the_host_keep_512_token_steps(kiln_bin, moe):
    """-ub auto takes large steps only with everything on the GPU: experts on the host (--cpu-moe) keep 512."""
    path, _ = moe
    r = run(kiln_bin, "fit", "-m", path, "-ngl", "all", "--cpu-moe", "-c", 65536, "--device-memory", "80GiB")
    assert r.returncode == 0, r.stderr
    assert "512 tokens per step" in r.stdout and re.search(r"^-ngl 41 -c 65536 --cpu-moe$", r.stdout, re.M), r.stdout
    r = run(kiln_bin, "fit", "-m", path, "-ngl", "all", "-c", 65536, "--device-memory", "80GiB")
    assert r.returncode == 0, r.stderr
    assert "2048 tokens per step" in r.stdout and re.search(r"^-ngl 41 -c 65536 -ub 2048$", r.stdout, re.M), r.stdout


def test_moe_cpu_moe_and_n_cpu_moe_on_8gib(kiln_bin, moe):
    path, experts = moe
    base = ["fit", "-m", path, "-c", 32768, "--device-memory", "8GiB"]
    r_all = run(kiln_bin, *base, "-ngl", "all", "--fit", "off")
    assert r_all.returncode == 1  # 35B on 8 GiB: does not fit with the experts on the GPU
    r = run(kiln_bin, *base, "-ngl", "all", "--cpu-moe")
    assert r.returncode == 0, r.stderr
    assert moe_chosen(r.stdout) == (41, 32768, 40)
    host, gpu = row(r.stdout, "expert weights")
    assert host == pytest.approx(sum(experts) / MIB, abs=0.05) and gpu == 0
    # The GPU keeps everything else: the all-GPU weights minus exactly the expert uploads.
    assert row(r_all.stdout, "weights")[1] - row(r.stdout, "weights")[1] == pytest.approx(sum(experts) / MIB, abs=0.5)
    assert "the expert tensors of 40 of them on the host" in r.stdout
    # -ncmoe / -cmoe spellings, and --n-cpu-moe N: the first N layers only.
    r = run(kiln_bin, *base, "-ngl", "all", "-ncmoe", 34)
    assert r.returncode == 0, r.stderr
    assert moe_chosen(r.stdout) == (41, 32768, 34)
    assert row(r.stdout, "expert weights")[0] == pytest.approx(sum(experts[:34]) / MIB, abs=0.05)
    r2 = run(kiln_bin, *base, "-ngl", "all", "-cmoe")
    assert r2.returncode == 0 and moe_chosen(r2.stdout)[2] == 40
    # -ot with llama.cpp's regex: layers 0-9 by pattern.
    r = run(kiln_bin, *base, "-ngl", "all", "-ot", r"blk\.[0-9]\.ffn_.*_exps=CPU", "--fit", "off")
    assert row(r.stdout, "expert weights")[0] == pytest.approx(sum(experts[:10]) / MIB, abs=0.05)


def test_moe_fit_moves_experts_before_layers(kiln_bin, moe):
    path, experts = moe
    r = run(kiln_bin, "fit", "-m", path, "-c", 32768, "--device-memory", "8GiB")
    assert r.returncode == 0, r.stderr
    ngl, ctx, n = moe_chosen(r.stdout)
    assert ngl == 41 and ctx == 32768 and 0 < n < 40  # every layer stays; the first n layers' experts move
    assert row(r.stdout, "expert weights")[0] == pytest.approx(sum(experts[:n]) / MIB, abs=0.05)
    # One layer fewer does not fit.
    r1 = run(kiln_bin, "fit", "-m", path, "-c", 32768, "--device-memory", "8GiB", "-ngl", "all", "--n-cpu-moe", n - 1)
    assert r1.returncode == 1, r1.stdout
    # -c unset: the context comes back after the experts moved.
    r = run(kiln_bin, "fit", "-m", path, "--device-memory", "8GiB")
    assert r.returncode == 0, r.stderr
    ngl, ctx, n = moe_chosen(r.stdout)
    assert ngl == 41 and n > 0 and ctx > 4096 and ctx % 256 == 0
    # Explicit flags are kept: --n-cpu-moe 2 cannot hold every layer, so layers move (experts are not changed).
    r = run(kiln_bin, "fit", "-m", path, "-c", 32768, "--device-memory", "8GiB", "--n-cpu-moe", 2)
    assert r.returncode == 0, r.stderr
    ngl, ctx, n = moe_chosen(r.stdout)
    assert n == 2 and ngl < 41
    # -ngl all without expert flags: not fitted, the error says what would help.
    r = run(kiln_bin, "fit", "-m", path, "-c", 32768, "--device-memory", "8GiB", "-ngl", "all")
    assert r.returncode == 1 and "--cpu-moe" in r.stderr, r.stderr
    # Without a GPU (no --device-memory): the CPU plan, experts with their layers.
    r = run(kiln_bin, "fit", "-m", path, "-c", 4096, "--cpu-moe")
    assert r.returncode == 0, r.stderr
    assert "expert weights" not in r.stdout


def test_moe_flag_errors(kiln_bin, moe, models):
    path, _ = moe
    base = ["fit", "-m", path, "-c", 4096, "--device-memory", "8GiB", "-ngl", "all"]
    r = run(kiln_bin, *base, "-ot", "exps=GPU0")
    assert r.returncode == 2 and "-ot/--override-tensor 'exps=GPU0'" in r.stderr and "unknown device 'GPU0'" in r.stderr
    r = run(kiln_bin, *base, "-ot", "blk[=CPU")
    assert r.returncode == 2 and "bad regular expression 'blk['" in r.stderr, r.stderr
    r = run(kiln_bin, *base, "-ot", "no_such_tensor=CPU")
    assert r.returncode != 0 and "'no_such_tensor=CPU': the pattern matches no tensor" in r.stderr, r.stderr
    r = run(kiln_bin, *base, "-ot", "attn_norm=CPU")
    assert r.returncode != 0 and "blk.0.attn_norm.weight" in r.stderr and "expert tensors" in r.stderr, r.stderr
    r = run(kiln_bin, *base, "-ot", "exps=CUDA3")
    assert r.returncode != 0 and "CUDA3" in r.stderr and "CUDA0" in r.stderr, r.stderr
    r = run(kiln_bin, *base, "--n-cpu-moe", -2)
    assert r.returncode == 2 and "--n-cpu-moe -2" in r.stderr, r.stderr
    r = run(kiln_bin, "fit", "-m", models["9b"], "-c", 4096, "--device-memory", "8GiB", "--cpu-moe")
    assert r.returncode != 0 and "--cpu-moe" in r.stderr and "no expert tensors" in r.stderr, r.stderr


def test_moe_flags_on_a_cpu_run_change_nothing(kiln_bin, tmp_path):
    """`kiln logits` (the tools share ModelFlags): on the CPU the flags move nothing, logits are identical;
    a bad rule is refused before anything runs."""
    m = tmp_path / "tiny-moe.gguf"
    r = run(kiln_bin, "gguf", "gen", "--preset", "tiny-qwen35moe", "-q", "-o", m)
    assert r.returncode == 0, r.stderr
    outs = []
    for extra in ([], ["--cpu-moe"], ["-ncmoe", 2, "-ot", r"blk\.3\.ffn_.*_exps=CPU"]):
        out = tmp_path / f"l{len(outs)}.npy"
        r = run(kiln_bin, "logits", "-m", m, "--tokens", "1,2,3,4,5", "-ngl", 0, *extra, "-o", out)
        assert r.returncode == 0, r.stderr
        outs.append(np.load(out))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    r = run(kiln_bin, "logits", "-m", m, "--tokens", "1,2,3", "-ngl", 0, "-ot", "exps=nowhere", "-o", tmp_path / "x.npy")
    assert r.returncode != 0 and "unknown device 'nowhere'" in r.stderr, r.stderr
