"""`treegraft new-plugin`: the package it writes installs and passes its own tests at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.plugins.test_example_plugin import install_fresh, run_tests_outside
from treegraft.cli import app
from treegraft.core.config import ConfigError
from treegraft.core.registry import KINDS as REGISTRY_KINDS
from treegraft.new_plugin import KINDS, TEMPLATES, names_of, plugin_files, write_plugin


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_generated_package_installs_and_passes_its_tests(kind: str, tmp_path: Path) -> None:
    made = tmp_path / "made"
    result = CliRunner().invoke(
        app, ["new-plugin", f"my-{kind}", "--kind", kind, "--dir", str(made)]
    )
    assert result.exit_code == 0, result.output
    root = made / f"my-{kind}"
    assert f"wrote {root}" in result.output
    site = install_fresh(root, tmp_path)
    entry_points = (site / f"my_{kind}-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert f"my_{kind} = my_{kind}" in entry_points
    done = run_tests_outside(tmp_path / root.name / "tests", site, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "failed" not in done.stdout and " passed" in done.stdout


def test_names_derived_from_the_distribution_name() -> None:
    assert names_of("my-scheduler", "scheduler") == {
        "dist": "my-scheduler",
        "module": "my_scheduler",
        "name": "my_scheduler",
        "cls": "MyScheduler",
        "kind": "scheduler",
    }
    assert names_of("fast_Ngram", "drafter")["cls"] == "FastNgramDrafter"


def test_files_written() -> None:
    files = plugin_files("acme-sched", "scheduler")
    assert set(files) == {
        "pyproject.toml",
        "README.md",
        "src/acme_sched/__init__.py",
        "src/acme_sched/scheduler.py",
        "tests/test_scheduler.py",
    }
    assert 'acme_sched = "acme_sched"' in files["pyproject.toml"]
    assert 'register("acme_sched", AcmeSchedScheduler)' in files["src/acme_sched/__init__.py"]
    assert "$" not in "".join(files.values()).replace("$ ", "")


def test_every_kind_the_registry_knows_has_a_template() -> None:
    """`new-plugin` once had templates for drafters, schedulers and rescorers only."""
    assert (
        set(KINDS)
        == set(REGISTRY_KINDS)
        == {
            "drafter",
            "builder",
            "rescorer",
            "grafter",
            "scheduler",
            "verifier",
        }
    )
    for kind in KINDS:
        assert (TEMPLATES / f"{kind}.py.tmpl").is_file()
        assert (TEMPLATES / f"test_{kind}.py.tmpl").is_file()


@pytest.mark.parametrize("kind", KINDS)
def test_files_written_for_every_kind(kind: str) -> None:
    files = plugin_files(f"acme-{kind}", kind)
    module = f"acme_{kind}"
    assert set(files) == {
        "pyproject.toml",
        "README.md",
        f"src/{module}/__init__.py",
        f"src/{module}/{kind}.py",
        f"tests/test_{kind}.py",
    }
    cls = f"Acme{kind.capitalize()}"
    hook = files[f"src/{module}/__init__.py"]
    assert f"def {REGISTRY_KINDS[kind].hook}(register: Register)" in hook
    assert f'register("{module}", {cls})' in hook
    assert (
        f"class {cls}({REGISTRY_KINDS[kind].interface.__name__}):"
        in files[f"src/{module}/{kind}.py"]
    )
    assert "assert_lossless(" in files[f"tests/test_{kind}.py"]
    assert f"name: {module}" in files["README.md"]  # the usage example names the component
    assert "$" not in "".join(files.values()).replace("$ ", "")
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")  # no syntax error in any generated module


def test_every_usage_example_is_a_valid_pipeline() -> None:
    """Every template's README example names real components with valid fields (the new
    component's config validated by its own Config class, loaded from the template)."""
    from types import SimpleNamespace

    import yaml

    from treegraft.core.config import pipeline_spec_from_dict
    from treegraft.core.hookspecs import hookimpl
    from treegraft.core.registry import Registry

    for kind in KINDS:
        files = plugin_files(f"acme-{kind}", kind)
        usage = files["README.md"].split("```yaml\n")[1].split("```")[0]
        module: dict = {"__name__": f"acme_{kind}_{kind}"}
        exec(compile(files[f"src/acme_{kind}/{kind}.py"], "c.py", "exec"), module)
        cls = module[f"Acme{kind.capitalize()}"]

        def hook(register, cls=cls, kind=kind) -> None:
            register(f"acme_{kind}", cls)

        plugin = SimpleNamespace(**{REGISTRY_KINDS[kind].hook: hookimpl(hook)})
        registry = Registry.create(autoload=False, plugins=[plugin])
        spec = pipeline_spec_from_dict(yaml.safe_load(usage), registry)
        assert f"name: acme_{kind}" in usage and spec is not None


BAD = {
    "kind": (
        ("my-x", "builderz", set()),
        "--kind: expected one of drafter, builder, rescorer, grafter, scheduler, verifier, got "
        "'builderz'",
    ),
    "name": (("9lives", "drafter", set()), "NAME: expected a package name of letters"),
    "dot": (("my.plugin", "builder", set()), "NAME: expected a package name of letters"),
    "space": (("my plugin", "grafter", set()), "NAME: expected a package name of letters"),
    "dash-first": (("-x", "verifier", set()), "NAME: expected a package name of letters"),
    "dash-last": (("x-", "verifier", set()), "NAME: expected a package name of letters"),
    "empty": (("", "builder", set()), "NAME: expected a package name of letters"),
    "non-ascii": (("grün", "grafter", set()), "NAME: expected a package name of letters"),
    "clash": (("ngram", "drafter", {"ngram"}), "NAME: the drafter name 'ngram' is already"),
    "framework": (("Treegraft", "scheduler", set()), "NAME: a module named 'treegraft' exists"),
    "library": (("torch", "drafter", set()), "NAME: a module named 'torch' exists already"),
    "stdlib": (("json", "rescorer", set()), "NAME: a module named 'json' exists already"),
    "keyword": (("class", "scheduler", set()), "NAME: the import name 'class' is a Python keyword"),
}


@pytest.mark.parametrize(("args", "message"), BAD.values(), ids=BAD.keys())
def test_bad_arguments(args: tuple, message: str, tmp_path: Path) -> None:
    name, kind, taken = args
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        write_plugin(name, kind, tmp_path, registered=taken)


@pytest.mark.parametrize("kind", ["builder", "grafter", "verifier"])
def test_an_existing_folder_is_refused_and_left_alone(kind: str, tmp_path: Path) -> None:
    (tmp_path / f"my-{kind}").mkdir()
    (tmp_path / f"my-{kind}" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"^NAME: .*my-\w+ already exists; choose another NAME"):
        write_plugin(f"my-{kind}", kind, tmp_path)
    assert [p.name for p in (tmp_path / f"my-{kind}").iterdir()] == ["keep.txt"]


def test_cli_lists_the_known_kinds_for_an_unknown_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["new-plugin", "my-x", "--kind", "sampler", "--dir", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "drafter, builder, rescorer, grafter, scheduler, verifier" in result.output
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_an_existing_folder_and_a_builtin_name(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    result = CliRunner().invoke(app, ["new-plugin", "taken", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "already exists" in result.output
    result = CliRunner().invoke(
        app, ["new-plugin", "ngram", "--kind", "drafter", "--dir", str(tmp_path)]
    )
    assert result.exit_code == 2 and "'ngram' is already registered" in result.output


def test_the_guides_worked_example_is_the_template_output() -> None:
    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "gated-scheduler"
    files = plugin_files("gated-scheduler", "scheduler")
    on_disk = {
        str(p.relative_to(example)): p.read_text()
        for p in example.rglob("*")
        if p.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in p.parts)
        and ".egg-info" not in str(p)
    }
    assert on_disk == files  # regenerate: treegraft new-plugin gated-scheduler --dir docs/examples


def test_the_guides_sweep_file_is_valid() -> None:
    import re

    import yaml

    from treegraft.bench.config import bench_config_from_dict

    guide = (Path(__file__).resolve().parents[1] / "docs" / "writing-a-scheduler.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", guide, re.S)]
    sweep = next(b for b in blocks if "pairs" in b)
    config = bench_config_from_dict(sweep)
    assert config.pipelines[0].override == {"scheduler": {"name": "gated_scheduler"}}


def test_a_dir_that_is_a_file_is_named_as_dir(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    result = CliRunner().invoke(app, ["new-plugin", "my-x", "--dir", str(afile)])
    assert result.exit_code == 2
    assert f"--dir: {afile} is a file; expected a directory" in result.output


def test_a_name_too_long_for_the_file_system_leaves_nothing_behind(tmp_path: Path) -> None:
    long = "a" * 300
    with pytest.raises(ConfigError, match=r"^NAME: cannot write .*\(\d+ characters\): File name"):
        write_plugin(long, "scheduler", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_worked_examples_layers_field_says_where_it_calls() -> None:
    """The guide's example said 'strong calls only in the first N layers' where it calls at
    layers 1 .. N (layer 0 never): its doc and the guide's text now say what it does."""
    import attrs

    from treegraft.testing import layer_state

    source = plugin_files("gated-scheduler", "scheduler")["src/gated_scheduler/scheduler.py"]
    module: dict = {"__name__": "gated_scheduler_example"}
    exec(compile(source, "scheduler.py", "exec"), module)
    config = module["GatedSchedulerConfig"](layers=2)
    scheduler = module["GatedScheduler"](config)
    unsure = [layer_state(layer=layer, frontier_max_score=-3.0) for layer in range(5)]
    assert [s.layer for s in unsure if scheduler.decide(s)] == [1, 2]
    assert "layers 1 .. N" in attrs.fields(type(config)).layers.metadata["doc"]
    guide = (Path(__file__).resolve().parents[1] / "docs" / "writing-a-scheduler.md").read_text()
    assert "only at layers 1 to `layers`" in guide and "first N layers" not in guide
