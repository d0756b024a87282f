"""Slot save / restore / erase: `kiln serve --slot-save-path DIR`, POST /slots/{id}?action=…
(llama-server's), on SmolLM2-135M-Instruct (attention only) and a generated qwen35 (hybrid: the
recurrent state travels in the file too).

Oracle: the same server's own greedy output. The prefix cache is off (--cache-ram 0), so after an
erase a prompt can only be reused from a restored slot: a restored slot must give cache_n > 0 and
exactly the text the cold run gave. Also: the answers' fields, a file restored into another server
process, and the errors (no --slot-save-path: 501; bad action / slot / file name: 400 naming the
field; a file from another model, a truncated file, a missing file: 400 with the reason).
"""
import pathlib

import pytest
import requests

from server_harness import KilnServer, gen_model, smollm2_path

PROMPT = "The history of the printing press begins in"


def complete(url, prompt=PROMPT, n=12):
    r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0,
                                                 "cache_prompt": True, "return_tokens": True}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def ids(url, text):
    return requests.post(url + "/tokenize", json={"content": text, "add_special": True}).json()["tokens"]


def action(url, slot, act, filename=None):
    body = {} if filename is None else {"filename": filename}
    return requests.post(f"{url}/slots/{slot}?action={act}", json=body, timeout=120)


@pytest.fixture(scope="module", params=["smollm2", "tiny-qwen35"])
def model(request, kiln_bin, work_dir):
    return smollm2_path() if request.param == "smollm2" else gen_model(kiln_bin, work_dir, "tiny-qwen35")


def test_save_erase_restore_gives_the_same_text(kiln_bin, model, tmp_path):
    # The follow-up prompt continues the slot's whole content (a hybrid model's recurrent state is at
    # its end), so only a restored slot can serve it without the prefix cache.
    args = ["--slot-save-path", str(tmp_path), "--cache-ram", "0", "-np", "1", "-c", "2048"]
    with KilnServer(kiln_bin, model, args) as s:
        first = complete(s.url, ids(s.url, PROMPT))
        follow = ids(s.url, PROMPT) + first["tokens"] + ids(s.url, " and then")[-2:]
        r = action(s.url, 0, "save", "a.bin")
        assert r.status_code == 200, r.text
        saved = r.json()
        assert saved["id_slot"] == 0 and saved["filename"] == "a.bin" and saved["n_saved"] > 0
        assert saved["n_written"] == (tmp_path / "a.bin").stat().st_size
        assert "save_ms" in saved["timings"]
        r = action(s.url, 0, "erase")
        assert r.status_code == 200 and r.json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
        ref = complete(s.url, follow)  # erased, no prefix cache: a cold run
        assert ref["timings"]["cache_n"] == 0
        action(s.url, 0, "erase")
        r = action(s.url, 0, "restore", "a.bin")
        assert r.status_code == 200, r.text
        assert r.json()["n_restored"] == saved["n_saved"] and r.json()["n_read"] == saved["n_written"]
        warm = complete(s.url, follow)
        assert warm["timings"]["cache_n"] == saved["n_saved"]
        assert warm["content"] == ref["content"]
    # Another process of the same model restores the file.
    with KilnServer(kiln_bin, model, args) as s:
        assert action(s.url, 0, "restore", "a.bin").status_code == 200
        warm = complete(s.url, follow)
        assert warm["timings"]["cache_n"] == saved["n_saved"] and warm["content"] == ref["content"]


def test_errors(kiln_bin, work_dir, tmp_path):
    smol = smollm2_path()
    with KilnServer(kiln_bin, smol, ["-c", "1024"]) as s:
        r = action(s.url, 0, "save", "x.bin")
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    # A file saved by another model.
    other = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    with KilnServer(kiln_bin, other, ["--slot-save-path", str(tmp_path), "-c", "512"]) as s:
        complete(s.url, n=2)
        assert action(s.url, 0, "save", "other.bin").status_code == 200
    with KilnServer(kiln_bin, smol, ["--slot-save-path", str(tmp_path), "-np", "2", "-c", "1024"]) as s:
        complete(s.url, n=2)
        assert action(s.url, 0, "save", "good.bin").status_code == 200
        cases = [
            (action(s.url, 0, "dance", "a.bin"), "action", None),
            (action(s.url, 7, "erase"), "id_slot", None),
            (action(s.url, 0, "save", "../escape.bin"), "filename", None),
            (action(s.url, 0, "save", ".hidden"), "filename", None),
            (action(s.url, 0, "restore", "missing.bin"), "filename", "cannot open"),
            (action(s.url, 0, "restore", "other.bin"), "filename", "another model"),
            (requests.post(f"{s.url}/slots/0?action=save", json={"filename": 5}), "filename", None),
        ]
        good = pathlib.Path(tmp_path) / "good.bin"
        (pathlib.Path(tmp_path) / "cut.bin").write_bytes(good.read_bytes()[:-20])
        cases.append((action(s.url, 0, "restore", "cut.bin"), "filename", None))
        for r, param, words in cases:
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == param, err
            if words:
                assert words in err["message"], err
        assert not (pathlib.Path(tmp_path).parent / "escape.bin").exists()
