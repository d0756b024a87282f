#!/usr/bin/env python3
"""HF transformers oracle for images in (issue #17): a tiny random-weight Qwen3.5 vision-language model.

  1. builds Qwen3_5ForConditionalGeneration from a small config: the text half is exactly the tiny
     qwen35 model of scripts/hf_fixtures.py (same config, same seeded weights), the vision half a
     2-block ViT (n_embd 64, 4 heads, patch 16, merge 2, an 8x8 learned position grid) with
     seeded random weights;
  2. converts the projector with llama.cpp's own converter (convert_hf_to_gguf.py --mmproj, from the
     llama-cpp-python 0.3.36 sdist: LLAMA_CPP_DIR) into mmproj.gguf, and the text half with
     scripts/hf_fixtures.py's converter (llama.cpp's converter needs a real tokenizer) into model.gguf;
  3. writes two generated PNGs (sides multiples of 32, so no resize: the pixels HF sees are exactly
     what kiln's preprocessing gives), their normalised pixels in HF's patch order, HF's image
     embeddings, and the logits of every position of a prompt holding both images
     (<|vision_start|> + image tokens + <|vision_end|>, M-RoPE positions from HF's get_rope_index).

Output OUT/: mmproj.gguf model.gguf img0.png img1.png meta.json embd0.f32 embd1.f32 logits.f32
  /work/hfvenv/bin/python scripts/hf_vision_fixtures.py --out tests/fixtures/hf/vision \\
      --llama-cpp /path/to/llama_cpp_python-0.3.36/vendor/llama.cpp
Consumed by tests/model/test_vision_hf.cpp.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_fixtures as hx  # noqa: E402

N_VOCAB = hx.N_VOCAB
IMG_TOKEN, VS_TOKEN, VE_TOKEN = N_VOCAB - 4, N_VOCAB - 6, N_VOCAB - 5  # ids inside the tiny vocabulary
VISION = dict(depth=2, hidden_size=64, hidden_act="gelu_pytorch_tanh", intermediate_size=96, num_heads=4,
              in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
              num_position_embeddings=64)
IMAGES = [(96, 64), (64, 128)]  # (w, h)
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def make_image(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], -1).astype(np.int32)
    img = np.clip(img + rng.integers(-40, 40, img.shape), 0, 255).astype(np.uint8)
    return img


def hf_pixels(img, patch, merge, tps=2):
    """HF Qwen2VL image processor layout: (gh/m * gw/m * m * m, C * T * P * P)."""
    h, w, _ = img.shape
    x = (img.astype(np.float32) / 255.0 - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    x = x.transpose(2, 0, 1)[None]  # [1, C, H, W]
    x = np.repeat(x, tps, axis=0)  # [T, C, H, W]
    gh, gw = h // patch, w // patch
    x = x.reshape(1, tps, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * tps * patch * patch)), (1, gh, gw)


def build(seed=7):
    import torch
    import transformers

    text, tcfg, _ = hx.build_hf("qwen35", seed=hx.ARCHS.index("qwen35") + 1)
    tc = dict(hx.CONFIGS["qwen35"])
    cfg = transformers.Qwen3_5Config(text_config=tc, vision_config=dict(VISION), image_token_id=IMG_TOKEN,
                                     video_token_id=N_VOCAB - 3, vision_start_token_id=VS_TOKEN,
                                     vision_end_token_id=VE_TOKEN, tie_word_embeddings=False)
    model = transformers.Qwen3_5ForConditionalGeneration(cfg).eval().float()
    try:
        model.set_attn_implementation("eager")
    except Exception as e:
        print("eager attention not selectable:", e)
    tsd = text.state_dict()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.startswith("model.language_model."):
                prm.copy_(tsd["model." + name[len("model.language_model."):]])
            elif name == "lm_head.weight":
                prm.copy_(tsd["lm_head.weight"])
            elif name.startswith("model.visual."):
                shape = tuple(prm.shape)
                if "norm" in name and name.endswith("weight"):
                    val = 1.0 + 0.15 * torch.randn(shape, generator=g)
                elif name.endswith("bias"):
                    val = 0.1 * torch.randn(shape, generator=g)
                elif name.endswith("pos_embed.weight"):
                    val = 0.5 * torch.randn(shape, generator=g)
                else:
                    fan_in = int(np.prod(shape[1:]))
                    val = torch.randn(shape, generator=g) / np.sqrt(fan_in)
                prm.copy_(val)
            else:
                raise RuntimeError(f"unexpected parameter {name}")
    return model, cfg, text, tcfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)")
    a = ap.parse_args()
    import torch
    from PIL import Image

    torch.set_num_threads(2)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model, cfg, text, tcfg = build()
    P, Mg = VISION["patch_size"], VISION["spatial_merge_size"]

    # Images, their pixels in HF's layout, HF's image embeddings.
    pix, grids, meta = [], [], {"images": [], "image_token": IMG_TOKEN, "vision_start": VS_TOKEN, "vision_end": VE_TOKEN}
    with torch.no_grad():
        for i, (w, h) in enumerate(IMAGES):
            img = make_image(w, h, 100 + i)
            Image.fromarray(img).save(out / f"img{i}.png")
            pv, thw = hf_pixels(img, P, Mg)
            pix.append(pv)
            grids.append(thw)
            feats = model.model.get_image_features(torch.from_numpy(pv), torch.tensor([thw]))
            e = getattr(feats, "pooler_output", feats)
            e = torch.cat(list(e), 0) if isinstance(e, (list, tuple)) else e
            e = e.float().numpy()
            e.astype("<f4").tofile(out / f"embd{i}.f32")
            meta["images"].append({"file": f"img{i}.png", "w": w, "h": h, "nx": w // P // Mg, "ny": h // P // Mg,
                                   "n_tokens": int(e.shape[0]), "n_embd": int(e.shape[1])})
            print(f"image {i}: {w}x{h} -> {e.shape} std {e.std():.3f}")
        # A prompt with both images between text tokens.
        rng = np.random.default_rng(5)
        txt = lambda n: rng.integers(0, N_VOCAB - 8, n).tolist()
        ids = txt(5)
        for i, m in enumerate(meta["images"]):
            ids += [VS_TOKEN] + [IMG_TOKEN] * m["n_tokens"] + [VE_TOKEN] + txt(4 + 3 * i)
        tt = torch.tensor([[1 if t == IMG_TOKEN else 0 for t in ids]], dtype=torch.int32)
        out_ = model(input_ids=torch.tensor([ids]), pixel_values=torch.from_numpy(np.concatenate(pix)),
                     image_grid_thw=torch.tensor(grids), mm_token_type_ids=tt, use_cache=False)
        logits = out_.logits[0].float().numpy()
        logits.astype("<f4").tofile(out / "logits.f32")
        pos, _ = model.model.get_rope_index(torch.tensor([ids]), tt, torch.tensor(grids))
        meta["prompt"] = ids
        meta["mrope_positions"] = pos[:, 0, :].tolist()  # [3][T] (t, h, w) as HF computes them
        meta["n_vocab"] = N_VOCAB
        print("logits", logits.shape, "std", float(logits.std()))
    (out / "meta.json").write_text(json.dumps(meta))

    # Text GGUF: the qwen35 converter of hf_fixtures.py (same weights as the VL model's text half).
    sd = {k: v.detach().float().cpu().numpy() for k, v in text.state_dict().items()}
    hx.convert("qwen35", tcfg.to_dict(), sd, out / "model.gguf")
    # Projector GGUF: llama.cpp's converter on the saved HF checkpoint.
    with tempfile.TemporaryDirectory() as td:
        model.save_pretrained(td, safe_serialization=True)
        pp = {"image_mean": MEAN, "image_std": STD, "patch_size": P, "merge_size": Mg, "temporal_patch_size": 2,
              "image_processor_type": "Qwen2VLImageProcessor"}
        pathlib.Path(td, "preprocessor_config.json").write_text(json.dumps(pp))
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(a.llama_cpp) / "gguf-py"), NO_LOCAL_GGUF="")
        subprocess.run([sys.executable, str(pathlib.Path(a.llama_cpp) / "convert_hf_to_gguf.py"), td, "--mmproj",
                        "--outtype", "f32", "--outfile", str(out / "mmproj.gguf")], check=True, env=env)
    print("wrote", sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
