"""Fixtures the Anthropic Messages and OpenAI Responses API tests share: the weather tool's schema and
two servers (SmolLM2 with the Qwen3 template, a generated tiny qwen35 with the Qwen3.5 template).
Imported by test_server_anthropic.py and test_server_responses.py (pytest collects imported fixtures)."""
import pytest

from server_harness import KilnServer, gen_model, smollm2_path

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}


@pytest.fixture(scope="module")
def smol(kiln_bin, shared_data):
    tmpl = shared_data / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
    with KilnServer(kiln_bin, smollm2_path(), ["-np", "2", "-c", "8192", "--chat-template-file", tmpl]) as s:
        yield s.url


@pytest.fixture(scope="module")
def tiny(kiln_bin, work_dir, shared_data):
    model = gen_model(kiln_bin, work_dir, "tiny-qwen35")
    tmpl = shared_data / "chat-templates" / "Qwen3.5-4B.jinja"
    with KilnServer(kiln_bin, model, ["-c", "4096", "--chat-template-file", tmpl]) as s:
        yield s.url
