"""Where a result came from: GPU, library versions, git commit, time. Recorded in every result JSON."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
# What decides the numbers: the engine code, the benchmark code, the package metadata (not results or docs).
SOURCE_PATHS = ("milestones", "benchmarks", "pyproject.toml")


def gpu_slug(device: torch.device | str | None = None) -> str:
    """A folder name for the hardware, or ``cpu``: ``NVIDIA H200`` -> ``h200``; ``NVIDIA H100 80GB HBM3`` ->
    ``h100``; ``NVIDIA GeForce RTX 4090`` -> ``rtx-4090``."""
    name = _gpu_name(device)
    if name is None:
        return "cpu"
    words = re.sub(r"(?i)\b(nvidia|geforce|tesla|amd|radeon)\b", " ", name).lower().split()
    slug = "-".join(w for w in words if not re.fullmatch(r"\d+gb|hbm\d*e?|pcie|sxm\d*|nvl", w))
    return re.sub(r"[^a-z0-9.-]+", "-", slug).strip("-") or "gpu"


def _gpu_name(device: torch.device | str | None) -> str | None:
    device = torch.device(device) if device is not None else None
    if (device is not None and device.type != "cuda") or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device)


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: record that we could not tell
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_fingerprint() -> str:
    """SHA-256 over the ``.py`` / ``.sh`` files under ``milestones/`` and ``benchmarks/`` plus ``pyproject.toml``:
    which code ran, even where ``.git`` is missing or stale (``gpu_suite --unpack`` attaches the commit by it)."""
    digest = hashlib.sha256()
    files = {REPO_ROOT / "pyproject.toml"} | {p for folder in SOURCE_PATHS[:2] for p in (REPO_ROOT / folder).rglob("*")
                                               if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts}
    for path in sorted(p for p in files if p.is_file()):
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def git_info() -> dict:
    """Commit and dirty flag (changes under ``SOURCE_PATHS``, results excluded). ``NANOSERVE_GIT_COMMIT`` (and
    ``NANOSERVE_GIT_DIRTY=1``) win over the local ``.git``, which may be stale on the GPU machine."""
    commit = os.environ.get("NANOSERVE_GIT_COMMIT") or None
    if commit is not None:
        dirty = os.environ.get("NANOSERVE_GIT_DIRTY")
        return {"git_commit": commit, "git_dirty": None if dirty is None else dirty not in ("", "0", "false"),
                "git_source": "env"}
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", *SOURCE_PATHS, ":(exclude)benchmarks/results") if commit else None
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status),
            "git_source": "git" if commit else None}


def environment(device: torch.device | str | None = None) -> dict:
    """Where a result came from: GPU, library versions, host, time, git commit and source hash."""
    device = torch.device(device) if device is not None else None
    info = {"gpu_name": _gpu_name(device), "gpu_slug": gpu_slug(device),
            "device": str(device) if device is not None else None, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": _version("triton"), "transformers": _version("transformers"),
            "python": sys.version.split()[0], "platform": platform.platform(), "hostname": platform.node(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if device is not None and device.type == "cuda":
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        info["gpu_count"] = torch.cuda.device_count()  # visible to this process
        # set when several suite processes share one host, one GPU each (two-GPU calls)
        info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {**info, **git_info(), "source_sha256": source_fingerprint()}


def write_json(data: dict, path: str | Path, indent: int = 2, **dumps) -> Path:
    """Write ``data`` to ``path`` (folders made as needed, a trailing newline); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, **dumps) + "\n")
    return path


def default_path(result: dict, filename: str, out: str | Path | None = None) -> Path:
    """``out`` if given, else ``benchmarks/results/<gpu-slug>/<filename>`` (relative to where it runs)."""
    return Path(out) if out else Path("benchmarks/results") / result["env"]["gpu_slug"] / filename


def save(result: dict, filename: str, out: str | None, **dumps) -> dict:
    """``result`` as JSON at ``out`` (default ``benchmarks/results/<gpu>/<filename>``), its path printed."""
    print(f"-> {write_json(result, default_path(result, filename, out), **dumps)}", flush=True)
    return result
