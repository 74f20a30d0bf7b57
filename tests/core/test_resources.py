"""`Resources`: tokenizers per model reference, one forward per shared Resources, checked
arguments (models, dtype, device)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import torch

from tests.conftest import greedy_reference, tiny_llama, word_tokenizer
from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import Pipeline, load_pipeline
from treegraft.core.resources import Resources
from treegraft.testing import memory_resources

PROMPT = [1, 2, 3, 1, 2, 3, 4]


def spec(target: str, forward: str = "auto") -> dict:
    return {
        "target": target,
        "drafters": {"weak": {"name": "ngram", "max_ngram": 3}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"max_new_tokens": 6, "dtype": "float64", "device": "cpu", "forward": forward},
    }


def test_a_folders_tokenizer_serves_that_folder_alone(model_dir: Path) -> None:
    res = memory_resources(target=tiny_llama(seed=1))
    folder = res.load_tokenizer(str(model_dir))
    assert folder is not None and res.load_tokenizer(str(model_dir)) is folder  # loaded once
    assert res.load_tokenizer("mem:target") is None  # not the folder's


def test_an_explicit_tokenizer_serves_models_without_their_own(model_dir: Path) -> None:
    res = memory_resources(target=tiny_llama(seed=1))
    explicit = word_tokenizer(64)
    res.tokenizer = explicit
    assert res.load_tokenizer("mem:target") is explicit
    own = res.load_tokenizer(str(model_dir))
    assert own is not explicit and own.get_vocab() == word_tokenizer(64).get_vocab()
    given = word_tokenizer(64)
    res.add_model("mem:other", tiny_llama(seed=2), tokenizer=given)
    assert res.load_tokenizer("mem:other") is given


def test_a_pipeline_over_a_model_without_a_tokenizer_gets_none_from_shared_resources(
    model_dir: Path,
) -> None:
    res = memory_resources(target=tiny_llama(seed=1, vocab=64))
    assert load_pipeline(spec(str(model_dir)), resources=res).tokenizer is not None
    pipe = load_pipeline(spec("mem:target"), resources=res)
    assert pipe.tokenizer is None
    with pytest.raises(ArgumentError, match=r"^prompt: this pipeline has no tokenizer"):
        pipe.generate("t1 t2")


def test_a_second_pipeline_with_another_forward_is_refused() -> None:
    target = tiny_llama(seed=1)
    res = memory_resources(target=target)
    first = load_pipeline(spec("mem:target", "lean"), resources=res)
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec("mem:target", "tree"), resources=res)
    assert str(info.value) == (
        "pipeline.decoding.forward: 'tree', but these Resources already serve a pipeline with "
        "'lean' (one decoding.forward per Resources: it sets how the shared models attend); "
        "build this pipeline on a separate Resources"
    )
    with pytest.raises(ArgumentError, match=r"^forward: 'tree', but these Resources already"):
        res.use_forward("tree")  # called directly
    want = greedy_reference(target, PROMPT, 6)
    assert list(first.generate(PROMPT).token_ids) == want  # untouched
    same = load_pipeline(spec("mem:target", "lean"), resources=res)  # the same forward is fine
    assert list(same.generate(PROMPT).token_ids) == want


@pytest.mark.parametrize(
    ("ref", "model", "message"),
    [
        ("mem:t", "str", "add_model: model 'mem:t': expected a transformers PreTrainedModel with "
         "a config (e.g. from AutoModelForCausalLM), got str"),
        ("mem:t", torch.nn.Linear(3, 3), "add_model: model 'mem:t': expected a transformers "
         "PreTrainedModel with a config (e.g. from AutoModelForCausalLM), got Linear"),
        (5, None, "add_model: ref: expected a non-empty string, got 5"),
        # was taken, under a name Resources.model then refuses to look up (check_ref)
        ("   ", None, "add_model: ref: expected a non-empty string, got '   '"),
    ],
    ids=["str", "linear", "ref-int", "ref-blank"],
)  # fmt: skip
def test_add_model_refuses_what_is_not_a_model(ref, model, message: str) -> None:
    res = Resources()
    with pytest.raises(ArgumentError) as info:
        res.add_model(ref, model)
    assert str(info.value) == message and not res.models


def test_dtype_and_device_by_name() -> None:
    res = Resources(dtype="float64", device="cpu")
    assert res.dtype == torch.float64 and res.device == torch.device("cpu")
    assert Resources(dtype=torch.bfloat16).dtype == torch.bfloat16
    for bad in ("fp16", torch.int64):
        with pytest.raises(ArgumentError) as info:
            Resources(dtype=bad)
        assert str(info.value) == (
            "Resources: dtype: expected one of float32, float64, bfloat16, float16 (a name or "
            f"the torch dtype), got {bad!r}"
        )
    with pytest.raises(ArgumentError, match=r"^Resources: device: expected 'auto', .* got 'tpu'"):
        Resources(device="tpu")
    with pytest.raises(ArgumentError, match=r"^Resources: device: expected a torch.device or"):
        Resources(device=0)


def test_create_refuses_a_bad_device_or_dtype_as_an_argument_error() -> None:
    with pytest.raises(ArgumentError, match=r"^dtype: expected one of float32, .* got 'fp16'$"):
        Resources.create(dtype="fp16")
    with pytest.raises(ArgumentError, match=r"^device: expected 'auto', .* got 'tpu'$") as info:
        Resources.create(device="tpu")
    assert isinstance(info.value, ValueError)  # callers catching ValueError still do


def _folder_like(tmp_path: Path, model_dir: Path, case: str) -> str:
    """A model reference of the kind `case` names, beside a copy of a good model folder."""
    if case == "file":
        return str(model_dir / "config.json")
    if case == "adapter":
        (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    if case == "gguf":
        (tmp_path / "model.Q4.gguf").write_bytes(b"GGUF")
    if case == "hub-cache":
        import shutil

        shutil.copytree(model_dir, tmp_path / "snapshots" / "abc123")
    return str(tmp_path)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("file", "is a file, not a folder: expected 'zoo:NAME' or a directory .* use the folder"),
        ("adapter", "holds no config.json: .* it holds a PEFT adapter \\(adapter_config.json\\)"),
        ("gguf", "holds no config.json: .* it holds a GGUF file \\(model.Q4.gguf\\)"),
        ("empty", "holds no config.json: expected 'zoo:NAME' or a directory"),
        ("hub-cache", "holds no config.json: .* it is a Hugging Face cache folder: use a snapshot"),
    ],
    ids=["file", "adapter", "gguf", "empty", "hub-cache"],
)
def test_a_path_to_no_model_folder_says_what_it_holds(
    tmp_path: Path, model_dir: Path, case: str, needle: str
) -> None:
    ref = _folder_like(tmp_path, model_dir, case)
    with pytest.raises(ConfigError, match=f"^pipeline.target: model '{ref}' {needle}"):
        load_pipeline(spec(ref))


def test_a_folder_without_read_permission_is_named(tmp_path: Path, monkeypatch) -> None:
    """As root the test cannot take the permission away: `stat` is made to fail as it would."""
    real = Path.stat

    def stat(self, *args, **kwargs):
        if self.parent == tmp_path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(str(tmp_path)))
    assert str(info.value) == (
        f"pipeline.target: model '{tmp_path}': cannot read the folder {tmp_path}: Permission denied"
    )


def test_a_checkpoint_with_its_own_code_is_refused_without_running_or_asking(
    tmp_path: Path, model_dir: Path, monkeypatch
) -> None:
    """An `auto_map` to the folder's modules (trust_remote_code): transformers would ask on the
    terminal whether to run them; treegraft never runs them and says so at once."""
    import json
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "custom", "auto_map": {"AutoConfig": "conf.C", "AutoModel": "mod.M"}}
    (folder / "config.json").write_text(json.dumps(config))
    for module in ("conf", "mod"):
        (folder / f"{module}.py").write_text("raise SystemExit('the folder code ran')\n")
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("asked on the terminal"))
    with pytest.raises(ConfigError, match="treegraft never runs a checkpoint's code"):
        load_pipeline(spec(str(folder)))


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        (
            "tokenizer_config.json",
            "[]",
            "tokenizer_config.json is not a JSON object \\(got list\\)",
        ),
        ("tokenizer.json", "{bad", "tokenizer.json is not valid JSON"),
        ("special_tokens_map.json", '"x"', "special_tokens_map.json is not a JSON object"),
        ("added_tokens.json", "[1]", "added_tokens.json is not a JSON object \\(got list\\)"),
        ("chat_template.json", "{bad", "chat_template.json is not valid JSON"),
        ("tokenizer.json", '{"model": 5}', "do not load \\(a key is missing: 'added_tokens'\\)"),
    ],
    ids=["config-list", "tokenizer-not-json", "special-str", "added-list", "chat", "no-key"],
)
def test_tokenizer_files_that_do_not_load_name_the_file(
    tmp_path: Path, model_dir: Path, name: str, text: str, needle: str
) -> None:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    (folder / name).write_text(text)
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(str(folder)))
    assert str(info.value).startswith(f"pipeline.target: {folder}: the tokenizer files in")
    assert re.search(needle, str(info.value)), info.value


def test_a_drafter_whose_tokenizer_does_not_load_is_named_by_validate_and_load(
    tmp_path: Path, model_dir: Path
) -> None:
    import shutil

    import yaml

    from treegraft.core.validation import pipeline_errors

    drafter = tmp_path / "drafter"
    shutil.copytree(model_dir, drafter)
    (drafter / "tokenizer.json").write_text("{bad")
    data = spec(str(model_dir))
    data["drafters"]["strong"] = {"name": "hf_lm", "model": str(drafter)}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    _, errors = pipeline_errors(tmp_path / "p.yaml")
    with pytest.raises(ConfigError) as info:
        load_pipeline(data)
    want = f"pipeline.drafters.strong.model: {drafter}: the tokenizer files in {drafter} do not"
    assert str(info.value).startswith(want)
    assert errors == [f"{tmp_path / 'p.yaml'}: {info.value}"]


def test_a_tokenizer_key_naming_a_file_or_a_folder_without_one_says_so(
    tmp_path: Path, model_dir: Path
) -> None:
    (tmp_path / "config.json").write_text("{}")  # a model folder without tokenizer files
    cases = {
        str(model_dir / "tokenizer.json"): f"is a file, not a folder: expected 'zoo:NAME' or the "
        f"folder written by save_pretrained that holds it ({str(model_dir)!r})",
        str(tmp_path): "holds no tokenizer files: expected a folder written by save_pretrained",
    }
    for ref, needle in cases.items():
        data = spec(str(model_dir)) | {"tokenizer": ref}
        with pytest.raises(ConfigError) as info:
            load_pipeline(data)
        assert str(info.value).startswith("pipeline.tokenizer: ") and needle in str(info.value)


def test_own_code_beside_a_known_architecture_is_not_run_and_said(
    tmp_path: Path, model_dir: Path
) -> None:
    """Phi-3 style: `auto_map` names the folder's module although transformers ships the
    architecture; transformers' class is loaded (the output is its greedy decoding), the module
    never runs, and a warning says so."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    from treegraft.core.resources import OwnCodeWarning

    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "mod.MyLlama"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "mod.py").write_text("raise SystemExit('the folder code ran')\n")
    with pytest.warns(OwnCodeWarning, match=r"folder's own code \(mod\.MyLlama\), which treegraft"):
        pipe = load_pipeline(spec(str(folder)))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    assert list(pipe.generate(PROMPT).token_ids) == greedy_reference(model, PROMPT, 6)


def test_a_failure_transformers_explains_at_length_is_told_in_its_line(
    model_dir: Path, monkeypatch
) -> None:
    """What transformers or torch raise may be a page (colour codes, advice): the error keeps
    the line that says what is wrong; `--debug` shows the rest."""
    from transformers import AutoModelForCausalLM

    def fail(*args, **kwargs):
        raise RuntimeError(
            "\x1b[1mAdvice first.\x1b[0m\n\tWeightsUnpickler error: bad global\nmore"
        )

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(str(model_dir)))
    assert str(info.value) == (
        f"pipeline.target: {model_dir}: transformers could not load the model in {model_dir}: "
        "RuntimeError: WeightsUnpickler error: bad global"
    )


def test_a_stated_dtype_or_device_must_agree_with_the_resources(monkeypatch) -> None:
    res = memory_resources(target=tiny_llama(seed=1))  # float64 on the CPU
    for decoding, message in [
        ({"dtype": "float32"}, "pipeline.decoding.dtype: the pipeline states 'float32', but the "
         "Resources it is built on hold their models in 'float64' (one dtype per Resources): "
         "give Resources(dtype='float32'), or leave decoding.dtype out to use the Resources' "
         "dtype"),
        ({"device": "cuda:3"}, "pipeline.decoding.device: device 'cuda:3' requested but CUDA "
         "is not available; use 'cpu' or 'auto'")
        if not torch.cuda.is_available() else
        ({"device": "cuda:99"}, "pipeline.decoding.device: device 'cuda:99': this machine has "),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as info:
            load_pipeline({**spec("mem:target", "lean"), "decoding": decoding}, resources=res)
        assert str(info.value).startswith(message)
    built = pipeline_spec_from_dict(spec("mem:target"))  # in code, without a mapping's keys
    built = attrs.evolve(built, decoding=attrs.evolve(built.decoding, dtype="bfloat16"))
    with pytest.raises(ConfigError, match=r"^pipeline\.decoding\.dtype: the pipeline states 'bf"):
        Pipeline.from_spec(attrs.evolve(built, decoding_keys=frozenset()), resources=res)
    # left out, or stated as the resources hold them: the resources' dtype and device
    for decoding in ({}, {"dtype": "float64", "device": "cpu"}):
        pipe = load_pipeline({**spec("mem:target", "lean"), "decoding": decoding}, resources=res)
        assert pipe.decoder.target.model.dtype == torch.float64
    monkeypatch.setattr("treegraft.core.resources.device_problem", lambda name: None)
    res.device = torch.device("cuda", 1)  # where a GPU machine's Resources would hold them
    with pytest.raises(ConfigError) as info:
        load_pipeline({**spec("mem:target"), "decoding": {"device": "cpu"}}, resources=res)
    assert str(info.value) == (
        "pipeline.decoding.device: the pipeline states 'cpu' (cpu), but the Resources it is "
        "built on hold their models on 'cuda:1': give Resources(device='cpu'), or leave "
        "decoding.device out to use the Resources' device"
    )


def test_create_takes_what_the_constructor_takes() -> None:
    res = Resources.create(device=torch.device("cpu", 0), dtype=torch.float64)
    assert res.device == torch.device("cpu") and res.dtype == torch.float64
    with pytest.raises(ArgumentError, match=r"^dtype: expected one of float32, .* got \['f'\]$"):
        Resources.create(dtype=["f"])  # unhashable: not a TypeError
    with pytest.raises(ArgumentError, match=r"^forward: expected one of auto, .* got 'fast'$"):
        Resources.create(forward="fast")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.parametrize(
    ("device", "message"),
    [
        (torch.device("cuda"), "device 'cuda' requested but CUDA is not available"),
        (torch.device("cuda", 1), "device 'cuda:1' requested but CUDA is not available"),
        (torch.device("meta"), "expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got 'meta'"),
    ],
    ids=["cuda", "cuda-1", "meta"],
)
def test_a_torch_device_this_machine_lacks_is_refused(device, message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        Resources(device=device)
    assert str(info.value).startswith(f"Resources: device: {message}")


def test_add_model_refuses_a_model_on_the_meta_device() -> None:
    with torch.device("meta"):
        model = tiny_llama(seed=1)
    with pytest.raises(
        ArgumentError, match=r"^add_model: model 'mem:t': its weights are on the meta "
    ):
        Resources().add_model("mem:t", model)  # was torch's NotImplementedError


def test_device_names_take_ascii_digits_and_any_length_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cuda:٣` (an Arabic-Indic 3) passed `decoding.device`, which torch then refused raw;
    `cuda:` and 5000 digits was a raw ValueError on a CUDA machine (int() refuses them)."""
    from treegraft.core.config import pipeline_spec_from_dict
    from treegraft.core.devices import device_problem

    data = {"target": "zoo:target", "drafters": {"w": "ngram"}, "builder": "layered"}
    with pytest.raises(ConfigError, match=r"^pipeline\.decoding\.device: expected str 'auto'"):
        pipeline_spec_from_dict({**data, "decoding": {"device": "cuda:\u0663"}})
    assert device_problem("cuda:\u0663").startswith("expected 'auto', 'cpu', 'cuda', 'cuda:N'")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    problem = device_problem("cuda:" + "9" * 5000)
    assert problem is not None and problem.endswith("this machine has 2 CUDA device(s)")
    assert "(5005 characters)" in problem
    assert device_problem("cuda:1") is None


REF_METHODS = ("model", "runner", "check", "vocab_size", "tokenizer_file", "tokenizer_of")


@pytest.mark.parametrize(
    "method", [*REF_METHODS, "real_vocab", "load_tokenizer", "token_counts", "datastore"]
)
@pytest.mark.parametrize("ref", [None, 3, ["mem:t"]], ids=["none", "int", "list"])
def test_a_model_reference_of_another_type_is_named(method: str, ref) -> None:
    """Once an AttributeError (`.startswith`) or TypeError (unhashable) from deep inside."""
    with pytest.raises(ArgumentError, match=rf"^Resources\.{method}: ref: expected a "):
        getattr(Resources(), method)(ref)


def test_a_runner_forward_that_is_no_forward_is_an_argument_error_not_the_models_refusal() -> None:
    """Once a `ModelRefused` blaming the model for the typo, kept as its verdict."""
    res = memory_resources(target=tiny_llama(seed=1))
    for method in ("runner", "check"):
        with pytest.raises(ArgumentError, match=rf"^Resources\.{method}: forward: expected None "):
            getattr(res, method)("mem:target", forward="laen")
    assert not res.checked
    res.check("mem:target", forward="lean")  # a forward of its own is served


def test_place_refuses_a_device_map_that_is_no_mapping() -> None:
    with pytest.raises(ArgumentError, match=r"^Resources\.place: device_maps: expected a mapping"):
        Resources().place(["auto"], None)
    with pytest.raises(ArgumentError, match=r"^Resources\.place: offload_folder: expected a fol"):
        Resources().place({}, 3)


def test_a_checkpoints_output_settings_are_reset_at_load_and_it_decodes(
    tmp_path: Path,
) -> None:
    """`output_attentions: true` in config.json (fine-tuning scripts save it) made transformers
    refuse the SDPA attention the pipeline loads with, `return_dict: false` its forward fail
    (the model's tuples); the outputs change no logits."""
    import json

    from transformers import AutoModelForCausalLM

    tiny_llama(seed=5, vocab=64).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config |= {"output_attentions": True, "output_hidden_states": True, "return_dict": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    pipe = load_pipeline(spec(str(tmp_path)))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, return_dict=True)
    assert model.config.output_attentions  # as the user's own generate loads it
    assert list(pipe.generate(PROMPT).token_ids) == greedy_reference(model, PROMPT, 6)


def test_a_load_failure_names_the_reason_below_a_line_that_ends_in_a_colon() -> None:
    from treegraft.core.resources import reason_line

    exc = ValueError(
        "Class validation error for validator 'validate_x':\n"
        "    ValueError: `x` is not supported here.\n\nmore advice"
    )
    assert reason_line(exc) == (
        "Class validation error for validator 'validate_x': ValueError: `x` is not supported here."
    )
    assert reason_line(ValueError("\x1b[1mbad value\x1b[0m\nadvice")) == "bad value"


def test_tokenizer_files_without_their_vocabulary_file_are_named_by_validate_and_load(
    tmp_path: Path, model_dir: Path
) -> None:
    """A tokenizer_config.json whose tokenizer.json (or tokenizer.model) did not come along
    loads in transformers as a tokenizer of special tokens alone, which turns every text into
    no tokens: the folder is named, not each prompt called empty."""
    import json
    import shutil

    import yaml

    from treegraft.core.validation import pipeline_errors

    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    (folder / "tokenizer.json").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "LlamaTokenizer"  # its vocabulary: tokenizer.model, missing
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec(str(folder))))
    _, errors = pipeline_errors(tmp_path / "p.yaml")
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(str(folder)))
    message = str(info.value)
    assert message.startswith(
        f"pipeline.target: {folder}: the tokenizer files in {folder} hold no vocabulary, only"
    )
    assert (
        "tokenizer.json or the vocabulary file of tokenizer_config.json (its tokenizer_class"
        in message
    )
    assert errors == [f"{tmp_path / 'p.yaml'}: {message}"]


def test_tokenizer_files_whose_tokenizer_cannot_encode_are_named_when_built(
    tmp_path: Path, model_dir: Path
) -> None:
    """A string `model_max_length` loads, then fails every encoding with a raw TypeError: the
    pipeline refuses the folder when it is built (and validate), not at the first prompt."""
    import json
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = "2048"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as info:
        load_pipeline(spec(str(folder)))
    assert str(info.value).startswith(
        f"pipeline.target: {folder}: the tokenizer files in {folder} load as a tokenizer that "
        "fails to encode text (TypeError: "
    )


def test_auto_on_cuda_takes_the_tree_kernel_only_for_models_whose_attention_it_computes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`decoding.forward: auto` on CUDA chooses per model: the tree-attention kernel for plain
    causal SDPA attention, SDPA (lean where supported) for a sliding window, which the kernel's
    one tree mask cannot express; an explicit `tree` refuses that model, naming the settings."""
    from treegraft.conformance.tiny import tiny_model
    from treegraft.core.runner.attention_rules import ModelRefused

    window = tiny_model("mistral", seed=3, sliding_window=5)
    res = memory_resources(plain=tiny_llama(seed=1), window=window)
    monkeypatch.setattr("treegraft.core.resources.device_problem", lambda name: None)
    res.device = torch.device("cuda")  # the decision only; the models stay on the CPU
    res.use_forward("auto")
    attention = {ref: m.config._attn_implementation for ref, m in res.models.items()}
    assert attention == {"mem:plain": "treegraft_tree", "mem:window": "sdpa"}
    plain, sliding = res.plan_for("mem:plain"), res.plan_for("mem:window")
    assert (plain.tree_kernel, plain.target) == (True, "transformers")
    assert (sliding.tree_kernel, sliding.target, sliding.drafter) == (False, "auto", "fused")
    assert "tree-attention kernel (its attention is plain causal" in plain.describe()
    assert sliding.describe().startswith("auto: lean where supported, else transformers'")
    assert "not the tree-attention kernel: MistralForCausalLM has sliding window 5" in (
        sliding.describe()
    )
    served = res.runner("mem:window")  # where it was refused
    assert (served.attention, served.forward) == ("sdpa", "auto")
    assert res.runner("mem:plain").attention == "tree"
    res.use_forward("tree")  # asked for the kernel: refused, naming what serves it
    assert window.config._attn_implementation == "treegraft_tree"
    with pytest.raises(ModelRefused, match=r"sliding window 5: use SDPA \(decoding.forward: auto"):
        res.runner("mem:window")


def test_float64_on_mps_is_refused_naming_the_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apple's MPS has no float64: Resources (and a pipeline stating both) refuse the pair up
    front, where moving the first model failed with torch's own TypeError."""
    monkeypatch.setattr("treegraft.core.resources.device_problem", lambda name: None)
    with pytest.raises(ArgumentError) as info:
        Resources.create(device="mps", dtype="float64")
    assert str(info.value) == (
        "dtype: float64 on device 'mps': Apple's MPS framework has no float64; use float32, "
        "bfloat16 or float16, or device 'cpu'"
    )
    with pytest.raises(ArgumentError, match=r"^Resources: dtype: float64 on device 'mps'"):
        Resources(device=torch.device("mps"), dtype=torch.float64)
    raw = {**spec("mem:target"), "decoding": {"device": "mps", "dtype": "float64"}}
    with pytest.raises(ConfigError, match=r"^pipeline\.decoding\.dtype: float64 on device 'mps'"):
        load_pipeline(raw)
    assert Resources(device=torch.device("mps"), dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("tokenizer", ["tok", 5, {"t1": 1}])
def test_what_is_no_tokenizer_is_refused_where_it_is_given(tokenizer) -> None:
    """`add_model(..., tokenizer="tok")` and `Resources(tokenizer=...)` were accepted; the first
    text prompt then failed with a raw TypeError ('str' object is not callable)."""
    from treegraft.testing import tiny_model

    with pytest.raises(ArgumentError, match="add_model: tokenizer: expected a transformers tok"):
        Resources().add_model("mem:t", tiny_model(), tokenizer=tokenizer)
    with pytest.raises(ArgumentError, match="Resources: tokenizer: expected a transformers tok"):
        Resources(tokenizer=tokenizer)
    resources = Resources()
    with pytest.raises(ArgumentError, match="Resources: tokenizer: expected"):
        resources.tokenizer = tokenizer


def test_a_model_added_under_a_used_name_is_probed_and_takes_no_old_tokenizer() -> None:
    """The probe's verdict was cached by name: a model added under the name of one already
    probed skipped the probe (a model the probe refuses then failed mid-generation with a raw
    RuntimeError), and kept the tokenizer given with the one it replaced."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from treegraft.testing import tiny_model

    spec = {
        "target": "mem:t",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "decoding": {"max_new_tokens": 4},
    }
    resources = Resources(dtype=torch.float64)
    resources.add_model("mem:t", tiny_model(), tokenizer=word_tokenizer(64))
    assert load_pipeline(spec, resources=resources).tokenizer is not None
    torch.manual_seed(0)
    odd = LlamaConfig(vocab_size=64, hidden_size=6, num_attention_heads=2, head_dim=3)
    odd.num_key_value_heads, odd.num_hidden_layers, odd.intermediate_size = 2, 1, 8
    resources.add_model("mem:t", LlamaForCausalLM(odd))  # rotary pairs of a head of 3: refused
    with pytest.raises(ConfigError, match=r"'mem:t' .* cannot be served exactly"):
        load_pipeline(spec, resources=resources)
    resources.add_model("mem:t", tiny_model(seed=4))
    assert load_pipeline(spec, resources=resources).tokenizer is None


def test_models_given_to_the_constructor_are_added_as_add_model_adds_them() -> None:
    """`Resources(models={...})` kept the mapping as it was: a model there was 'not found'
    (not in memory, so looked for as a folder), and a value that is no model failed with a raw
    AttributeError."""
    from treegraft.testing import tiny_model

    model = tiny_model(seed=3)
    spec = {
        "target": "mem:a",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "decoding": {"max_new_tokens": 6},
    }
    pipe = load_pipeline(spec, resources=Resources(models={"mem:a": model}, dtype=torch.float64))
    assert list(pipe.generate([1, 2, 3]).token_ids) == greedy_reference(model, [1, 2, 3], 6)
    with pytest.raises(ArgumentError, match=r"^Resources: models: model 'mem:a': expected a tra"):
        Resources(models={"mem:a": 5})


def test_an_empty_model_reference_is_not_the_current_folder(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model: ''` resolved to the current folder: a model there was loaded without a word."""
    from treegraft.core.resources import ModelRefError, resolve_model_path

    monkeypatch.chdir(model_dir)  # a folder holding a model's config.json
    for ref in ("", " "):
        with pytest.raises(ModelRefError, match=r"expected a model reference, 'zoo:NAME' or a"):
            resolve_model_path(ref)
