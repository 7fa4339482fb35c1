"""GGUF headers read and checked without loading the model: version, metadata, tensor count, and the
architecture and name a packaged model pins. Reads are bounded, so a corrupt file is an error, not a hang."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from arag.errors import ModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# Files are read (and copied) in steps of this many bytes.
CHUNK_BYTES = 4 << 20
# Bounds that no real model reaches; past them the header is garbage, not a model.
_MAX_COUNT = 1 << 24
_MAX_STRING = 64 << 20


@dataclass(frozen=True)
class GGUFArray:
    """An array value, summarised: its element type and length (the contents are skipped)."""

    item_type: int
    length: int


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file's header says."""

    version: int
    tensor_count: int
    kv_count: int
    metadata: dict[str, Any]

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    @property
    def name(self) -> str | None:
        value = self.metadata.get("general.name")
        return value if isinstance(value, str) else None


# gguf_type -> struct format of a scalar; 8 (string) and 9 (array) are read by hand.
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<B",  # bool, one byte
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


class _Reader:
    def __init__(self, f: BinaryIO, where: str) -> None:
        self.f = f
        self.where = where

    def bad(self, what: str) -> ModelError:
        return ModelError(
            f"not a valid GGUF file: {what}",
            where=self.where,
            fix="delete the file and assemble or download it again",
        )

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise self.bad("the file ends inside the header")
        return data

    def skip(self, n: int) -> None:
        # A seek past the end would not fail; reading keeps truncation detectable.
        while n > 0:
            step = min(n, CHUNK_BYTES)
            self.read(step)
            n -= step

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > _MAX_STRING:
            raise self.bad(f"a string of {n} bytes")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.scalar("<I")
            length = self.scalar("<Q")
            if length > _MAX_STRING:
                raise self.bad(f"an array of {length} items")
            if item_type == _STRING:
                for _ in range(length):
                    n = self.scalar("<Q")
                    if n > _MAX_STRING:
                        raise self.bad(f"a string of {n} bytes")
                    self.f.seek(n, os.SEEK_CUR)
            elif item_type in _SCALARS:
                self.skip(length * struct.calcsize(_SCALARS[item_type]))
            elif item_type == _ARRAY:
                for _ in range(length):
                    self.value(_ARRAY)
            else:
                raise self.bad(f"unknown array item type {item_type}")
            return GGUFArray(item_type=item_type, length=length)
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise self.bad(f"unknown value type {vtype}")
        v = self.scalar(fmt)
        return bool(v) if vtype == _BOOL else v


def read_gguf_header(path: Path) -> GGUFInfo:
    """Parse a GGUF file's header and key-value metadata (array contents are skipped).

    Raises :class:`ModelError` when the file is missing, is not GGUF, or its header is cut short.
    """
    where = str(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the reader needs the raw handle
    except OSError as exc:
        raise ModelError(
            f"cannot open model file: {exc.strerror or exc}",
            where=where,
            fix="check the path in ARAG_LLM__MODEL",
        ) from exc
    with f:
        r = _Reader(f, where)
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise r.bad(f"magic bytes are {magic!r}, expected {GGUF_MAGIC!r}")
        version = r.scalar("<I")
        if version not in SUPPORTED_VERSIONS:
            raise r.bad(f"GGUF version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
        tensor_count = r.scalar("<Q")
        kv_count = r.scalar("<Q")
        if tensor_count > _MAX_COUNT or kv_count > _MAX_COUNT:
            raise r.bad(f"implausible counts ({tensor_count} tensors, {kv_count} keys)")
        meta: dict[str, Any] = {}
        for _ in range(kv_count):
            key = r.string()
            vtype = r.scalar("<I")
            meta[key] = r.value(vtype)
        # A string array skipped by seeking may have run past the end: check we are still inside.
        if f.tell() > os.fstat(f.fileno()).st_size:
            raise r.bad("the file ends inside the header")
    return GGUFInfo(version=version, tensor_count=tensor_count, kv_count=kv_count, metadata=meta)


def check_gguf(path: Path, *, architecture: str | None = None, name: str | None = None) -> GGUFInfo:
    """Read and sanity-check a GGUF header; ``architecture`` and ``name``, when given, must match."""
    info = read_gguf_header(path)
    if info.tensor_count == 0:
        raise ModelError(
            "the GGUF file holds no tensors",
            where=str(path),
            fix="use a model file, not a vocabulary-only file",
        )
    if architecture is not None and info.architecture != architecture:
        raise ModelError(
            f"the GGUF file's architecture is {info.architecture!r}, expected {architecture!r}",
            where=str(path),
            fix="delete the file and assemble it again",
        )
    if name is not None and info.name != name:
        raise ModelError(
            f"the GGUF file's general.name is {info.name!r}, expected {name!r}",
            where=str(path),
            fix="delete the file and assemble it again",
        )
    return info
