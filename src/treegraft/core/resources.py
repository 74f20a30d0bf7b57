"""Heavy resources shared by the components of one pipeline: models, tokenizer, device, dtype.

Model references are `zoo:NAME` (the embedded model zoo), a local directory in Hugging Face format,
or a name registered in memory with `Resources.add_model` (tests, notebooks). Each model is
loaded once per `Resources`, so a target used as its own drafter is not loaded twice.
"""

from __future__ import annotations

import errno
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from treegraft.core.arguments import check_ref, check_runner_forward
from treegraft.core.devices import device_problem, dtype_problem
from treegraft.core.errors import (
    ArgumentError,
    ModelRefError,
    check_argument,
    clipped,
    shown,
)
from treegraft.core.inputs import is_dir, is_file
from treegraft.core.model_files import (
    broken_link,
    file_problems,
    hf_config,
    json_object,
    lacking_message,
    model_folder_problems,
    other_format_hint,
    own_code,
    own_code_message,
    shape_message,
)
from treegraft.core.runner import CausalLMRunner, SequenceRunner, StateRunner, runner_for
from treegraft.core.runner.attention_rules import (
    STATE_DRAFTER,
    ModelRefused,
    refusal,
    refused_message,
    text_config,
)
from treegraft.core.runner.forwards import ForwardPlan, attend, attention_for, plan_forward
from treegraft.core.runner.placement import load_kwargs, map_problem
from treegraft.core.runner.sequence_runner import chain_runner
from treegraft.core.runner.state_models import has_state_layers
from treegraft.core.tokenizer_files import folder_tokenizer
from treegraft.kernels.tree_attention.hf import register

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


#: output settings of a checkpoint's config reset at load (no logit changes): transformers refuses
#: `output_attentions` beside SDPA, and its forward fails on `return_dict: false` (tuples)
QUIET_CONFIG = {"output_attentions": False, "output_hidden_states": False, "return_dict": True}


class OwnCodeWarning(UserWarning):
    """A checkpoint's `config.json` maps its model to the folder's own code (`auto_map`), which
    treegraft never runs: transformers' own class of its `model_type` is loaded instead."""


def load_failure(ref: str, path: Path, exc: Exception) -> Exception:
    """What to raise when transformers failed with `exc` to load the model folder `path`: a
    `ModelRefError` naming what is wrong with the folder (`model_folder_problems`: its files, a
    config transformers refuses or that holds no causal LM, weights of other shapes), else
    transformers' own reason; `--debug` shows its traceback."""
    if problems := model_folder_problems(path):
        return ModelRefError(f"{ref}: {'; '.join(problems)}")
    return ModelRefError(
        f"{ref}: transformers could not load the model in {path}: {type(exc).__name__}: "
        + reason_line(exc)
    )


def reason_line(exc: Exception) -> str:
    """The line of `exc`'s message that says what is wrong (torch's refusal to unpickle an
    object other than a tensor is a page of advice around one such line), without terminal
    colour codes; a first line that ends in a colon is followed by the next, which holds the
    reason (transformers' config validators)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line] or [type(exc).__name__]
    found = [line for line in lines if line.startswith("WeightsUnpickler error:")]
    if found:
        return found[0]
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def resolve_device(name: str) -> torch.device:
    """`auto` -> CUDA when present, else CPU; anything else must pass `device_problem` (else an
    `ArgumentError`, a `ValueError`)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    problem = device_problem(name)
    if problem:
        raise ArgumentError(problem)
    return torch.device(name)


def as_dtype(value: Any) -> torch.dtype:
    """`Resources.dtype` from a torch floating dtype of `DTYPES` or its name (`"float64"`)."""
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    raise ArgumentError(
        f"Resources: dtype: expected one of {', '.join(DTYPES)} (a name or the torch dtype), "
        f"got {value!r}"
    )


def as_device(value: Any) -> torch.device:
    """`Resources.device` from a `torch.device` or a device name (`resolve_device`); either must
    name a device this machine has (`device_problem`)."""
    if isinstance(value, torch.device):
        if value.type == "cpu":  # `cpu:0` is the one CPU device
            return torch.device("cpu")
        if problem := device_problem(str(value)):
            raise ArgumentError(f"Resources: device: {problem}")
        return value
    if isinstance(value, str):
        try:
            return resolve_device(value)
        except ArgumentError as exc:
            raise ArgumentError(f"Resources: device: {exc}") from None
    raise ArgumentError(
        f"Resources: device: expected a torch.device or a device name ('cpu', 'cuda:0', 'auto'), "
        f"got {value!r}"
    )


def resolve_model_path(ref: str) -> Path:
    """Directory of a model reference (`zoo:NAME` or a path), without loading anything."""
    if ref.startswith("zoo:"):
        from treegraft import zoo

        try:
            return Path(zoo.resolve(ref))
        except (KeyError, LookupError, FileNotFoundError, ValueError) as exc:
            text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            raise ModelRefError(text) from None  # a KeyError's str() is its message quoted
    if not ref.strip():  # Path("") is the current folder, which may hold a model
        raise ModelRefError(
            f"model {shown(ref)}: expected a model reference, 'zoo:NAME' or a model folder"
        )
    path = Path(ref).expanduser()
    try:
        if (path / "config.json").is_file():
            return path
    except OSError as exc:  # a folder without read or search permission
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise ModelRefError(
                f"model {shown(ref)}: cannot read the folder {clipped(str(path))}: {exc.strerror}"
            ) from None
    except ValueError:  # a NUL byte: no such file
        pass
    expected = (
        "expected 'zoo:NAME' or a directory holding a Hugging Face model (config.json + weights)"
    )
    if is_file(path):
        hint = other_format_hint(path.parent)
        if not hint and is_file(path.parent / "config.json"):
            hint = f"; use the folder that holds it, {str(path.parent)!r}"
        raise ModelRefError(f"model {shown(ref)} is a file, not a folder: {expected}" + hint)
    if is_dir(path) and (link := broken_link(path / "config.json")):
        raise ModelRefError(f"model {shown(ref)}: {link}; {expected}")
    if is_dir(path):
        raise ModelRefError(
            f"model {shown(ref)} holds no config.json: {expected}" + other_format_hint(path)
        )
    raise ModelRefError(f"model {shown(ref)} not found: {expected}" + hub_hint(ref))


#: A Hugging Face Hub model id: `name` or `owner/name`.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
#: the longest Hub id (the Hub's own limit on `owner/name`)
HUB_ID_CHARS = 96


def hub_hint(ref: str) -> str:
    """How to use a Hub model here, when `ref` looks like a Hub id and is not a local path."""
    if len(ref) > HUB_ID_CHARS or not HUB_ID.fullmatch(ref) or is_dir(Path(ref).expanduser()):
        return ""
    folder = f"models/{ref.rsplit('/', 1)[-1]}"
    return (
        f"; {ref!r} looks like a Hugging Face Hub id, but treegraft loads models from local "
        f"folders (nothing is downloaded at decode time). Download it once with "
        f"`huggingface-cli download {ref} --local-dir {folder}` (or in Python: "
        f"`AutoModelForCausalLM.from_pretrained({ref!r}).save_pretrained({folder!r})` and the "
        f"same with AutoTokenizer), then use {folder!r} as the model reference"
    )


def check_tokenizer(tokenizer: Any, where: str = "Resources: tokenizer") -> None:
    """An `ArgumentError` unless `tokenizer` is None or a tokenizer (called on text, as a
    transformers tokenizer is), not only once a text prompt reaches it."""
    if tokenizer is not None and not callable(tokenizer):
        raise ArgumentError(
            f"{where}: expected a transformers tokenizer (AutoTokenizer.from_pretrained) or "
            f"None, got {type(tokenizer).__name__} {shown(tokenizer)}"
        )


def model_vocab_size(ref: str, memory: dict[str, PreTrainedModel] | None = None) -> int:
    """Vocabulary size from a model's config, without loading its weights."""
    if memory and ref in memory:  # a composite config (Gemma 3, Llava...) has it in its text config
        return int(text_config(memory[ref].config).vocab_size)
    folder = resolve_model_path(ref)
    config = json_object(folder / "config.json")[0] or {}
    cfg = config.get("text_config", config)
    vocab = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
        return vocab
    if problems := model_folder_problems(folder):
        raise ModelRefError(f"{ref}: {'; '.join(problems)}")
    config = hf_config(folder)  # config.json leaves vocab_size to the class default
    vocab = None if isinstance(config, str) else config.get_text_config().vocab_size
    if isinstance(vocab, int) and vocab > 0:
        return vocab
    raise ModelRefError(
        f"{ref}: {folder / 'config.json'} states no vocab_size (expected a positive integer)"
    )


@attrs.define
class Resources:
    """Loads and shares models and tokenizers for one pipeline, or several pipelines that use
    one `decoding.forward` (`use_forward`).

    Tokenizers are per model reference (`load_tokenizer`): a model folder's own tokenizer files
    serve that model alone. `tokenizer`, when set explicitly (tests, notebooks), serves the
    models that have none of their own: in-memory models (`add_model` without a tokenizer) and
    folders without tokenizer files; it is never handed out for a folder with its own files.
    """

    device: torch.device = attrs.field(factory=lambda: torch.device("cpu"), converter=as_device)
    dtype: torch.dtype = attrs.field(default=torch.float32, converter=as_dtype)
    models: dict[str, PreTrainedModel] = attrs.field(factory=dict)
    #: the tokenizer of the models without one of their own (set explicitly; never loaded here)
    tokenizer: Any = attrs.field(default=None, validator=lambda _, __, v: check_tokenizer(v))
    #: tokenizers by model reference: a folder's own (None: it has no tokenizer files), or one
    #: given to `add_model`
    tokenizers: dict[str, Any] = attrs.field(factory=dict)
    target_ref: str = ""
    in_memory: set[str] = attrs.field(factory=set)
    #: how runners forward models (`decoding.forward`, `runner.forwards`); set by `use_forward`
    forward: str = "auto"
    check_model: bool = True  # probe models before their first runner (`decoding.check_model`)
    #: runners' padding of 2-3 token blocks (`decoding.pad_small_blocks`; None: measured)
    pad_small_blocks: bool | None = None
    #: refusal message (None: servable) per (model reference, forward, attention) already checked
    checked: dict[tuple[str, str, str], str | None] = attrs.field(factory=dict)
    #: per model reference, a device map (`treegraft.core.runner.placement`): the model is placed by
    #: accelerate at load instead of moved to `device`
    device_maps: dict[str, Any] = attrs.field(factory=dict)
    offload_folder: str | None = None
    attention: str = "sdpa"  # what models load with: `treegraft_tree` under `tree` (`use_forward`)
    #: models whose hidden states a drafter reads (`runner(features=True)`): never on the kernel
    read_features: set[str] = attrs.field(factory=set)
    #: the pipeline's target runner, for drafters that read its state (set by `Pipeline.from_spec`)
    target_runner: Any = None
    #: token datastores loaded (`datastore`), by reference (and target, for `zoo:` ones)
    datastores: dict[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if problem := dtype_problem(self.device, self.dtype):
            raise ArgumentError(f"Resources: dtype: {problem}")
        given, self.models = self.models, {}
        for ref, model in given.items():  # as `add_model` adds them: checked, in memory
            try:
                self.add_model(ref, model)
            except ArgumentError as exc:
                raise ArgumentError(
                    f"Resources: models: {exc}".replace("add_model: ", "")
                ) from None

    @classmethod
    def create(
        cls,
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "float32",
        forward: str = "auto",
    ) -> Resources:
        """Resources on `device` (`auto`: CUDA when present) in `dtype` (a name of `DTYPES`, or
        either as torch's own object, as the constructor takes them); a bad value is an
        `ArgumentError` (a `ValueError`) naming the argument."""
        try:
            res = cls(device=device, dtype=dtype)
        except ArgumentError as exc:
            raise ArgumentError(str(exc).removeprefix("Resources: ")) from None
        res.use_forward(forward)
        return res

    @property
    def plan(self) -> ForwardPlan:
        """What `forward` (`decoding.forward`) means on this device (`runner.forwards`)."""
        return plan_forward(self.forward, self.device)

    def plan_for(self, ref: str) -> ForwardPlan:
        """What `forward` means for the model `ref` (`auto` on CUDA chooses per model, and SDPA
        for one in `read_features`: `ForwardPlan.for_model`)."""
        return self.plan.for_model(self.model(ref), features=ref in self.read_features)

    def use_forward(self, setting: str) -> None:
        """Forward models as `decoding.forward: setting` says: load them with its attention
        implementation and switch every model loaded already (runners notice at their next
        `begin`). Once a pipeline is built on these resources, another setting is an
        `ArgumentError` (`forward_conflict`)."""
        if problem := self.forward_conflict(setting):
            raise ArgumentError(f"forward: {problem}")
        plan = plan_forward(setting, self.device)
        self.forward = setting
        self.attention = register() if setting == "tree" else "sdpa"
        for model in self.models.values():
            attend(model, plan.for_model(model))

    def forward_conflict(self, setting: str) -> str | None:
        """Why these resources cannot forward as `setting` (None: they can): a pipeline built on
        them (`target_runner`) forwards otherwise, and switching would change how its models
        attend (and the forwards its runners and cost curves assume) under it."""
        if self.target_runner is None or setting == self.forward:
            return None
        return (
            f"{setting!r}, but these Resources already serve a pipeline with {self.forward!r} "
            "(one decoding.forward per Resources: it sets how the shared models attend); "
            "build this pipeline on a separate Resources"
        )

    def place(self, device_maps: Mapping[str, Any], offload_folder: str | None) -> None:
        """Load the models of `device_maps` as their maps say (`runner.placement`), sending
        weights to disk in `offload_folder` (the first one given stays). A map cannot apply to a
        model held already (added with `add_model`, or loaded by an earlier pipeline under
        another map), nor a second map to one model or a second folder to these Resources:
        `ArgumentError`s."""
        check_argument("Resources.place", "device_maps", device_maps, Mapping, "a mapping")
        if offload_folder is not None:
            check_argument("Resources.place", "offload_folder", offload_folder, str, "a folder")
        for ref, device_map in device_maps.items():
            if self.device_maps.get(ref, device_map) != device_map and ref not in self.models:
                raise ArgumentError(
                    f"device_map: {ref!r}: {device_map!r}, but these Resources place it as "
                    f"{self.device_maps[ref]!r} already (one placement per model and Resources); "
                    "use a separate Resources"
                )
            if ref in self.models and self.device_maps.get(ref) != device_map:
                how = (
                    "was added in memory (add_model): save it (save_pretrained) and name its folder "
                    "to have it placed"
                    if ref in self.in_memory
                    else "was loaded by an earlier pipeline on these Resources under another "
                    "placement: give its map to the first pipeline, or use a separate Resources"
                )
                raise ArgumentError(
                    f"device_map: {ref!r}: a device map applies when a model loads, and this one {how}"
                )
        if (
            device_maps
            and offload_folder
            and offload_folder != (self.offload_folder or offload_folder)
        ):
            raise ArgumentError(
                f"offload_folder: {offload_folder!r}, but these Resources offload weights into "
                f"{self.offload_folder!r} already (one folder per Resources); use a separate Resources"
            )
        self.device_maps |= device_maps
        self.offload_folder = self.offload_folder or offload_folder

    def add_model(self, ref: str, model: PreTrainedModel, *, tokenizer: Any = None) -> None:
        """Make an in-memory model available under `ref` (moved to this device and dtype), with
        its `tokenizer` (default: none of its own; `load_tokenizer` then gives `tokenizer`)."""
        if not isinstance(ref, str) or not ref.strip():
            raise ArgumentError(f"add_model: ref: expected a non-empty string, got {ref!r}")
        if not isinstance(model, PreTrainedModel) or getattr(model, "config", None) is None:
            raise ArgumentError(
                f"add_model: model {ref!r}: expected a transformers PreTrainedModel with a "
                f"config (e.g. from AutoModelForCausalLM), got {type(model).__name__}"
            )
        if any(p.device.type == "meta" for p in model.parameters()):
            raise ArgumentError(
                f"add_model: model {ref!r}: its weights are on the meta device (shapes without "
                "data, as a model built under `torch.device('meta')`); load them first, e.g. "
                "with from_pretrained"
            )
        check_tokenizer(tokenizer, "add_model: tokenizer")
        self.models[ref] = model.to(device=self.device, dtype=self.dtype).eval()
        attend(model, self.plan.for_model(model))
        self.in_memory.add(ref)
        # another model under a used name: probed again, no tokenizer of the one it replaces
        self.checked = {key: why for key, why in self.checked.items() if key[0] != ref}
        self.tokenizers.pop(ref, None)
        if tokenizer is not None:
            self.tokenizers[ref] = tokenizer

    def model(self, ref: str) -> PreTrainedModel:
        """The model behind `ref`, loaded on first use with `AutoModelForCausalLM.from_pretrained`."""
        check_ref("Resources.model", ref)
        if ref not in self.models:
            path = resolve_model_path(ref)
            hf_logging.disable_progress_bar()  # our CLI streams text on stdout; keep stderr quiet
            if problems := file_problems(path)[2]:
                raise ModelRefError(f"{ref}: {'; '.join(problems)}")
            placed = ref in self.device_maps
            if placed and (problem := map_problem(path, self.device_maps[ref])):
                raise ModelRefError(f"{ref}: device_map: {problem}")
            kwargs = load_kwargs(self.device_maps[ref], self.offload_folder) if placed else {}
            try:
                model, info = AutoModelForCausalLM.from_pretrained(
                    path,
                    dtype=self.dtype,
                    attn_implementation=attention_for(path)
                    if self.attention == "sdpa"
                    else self.attention,
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,  # told below, naming the tensors
                    **QUIET_CONFIG,
                    trust_remote_code=False,
                    **kwargs,
                )
            except Exception as exc:
                raise load_failure(ref, path, exc) from exc
            if mismatched := sorted(info.get("mismatched_keys") or ()):  # as validate says
                text = model.config.get_text_config()
                problems = model_folder_problems(path) or [shape_message(path, text, mismatched)]
                raise ModelRefError(f"{ref}: {'; '.join(problems)}")
            if missing := sorted(info.get("missing_keys") or ()):
                if problems := model_folder_problems(path):  # as `treegraft validate` says
                    raise ModelRefError(f"{ref}: {'; '.join(problems)}")
                raise ModelRefError(
                    f"{ref}: {lacking_message(path, type(model).__name__, missing)}"
                )
            self.models[ref] = (model if placed else model.to(self.device)).eval()
            attend(model, self.plan.for_model(model))
            if module := own_code(json_object(path / "config.json")[0] or {}):
                message = own_code_message(ref, module, type(model).__name__)
                warnings.warn(message, OwnCodeWarning, stacklevel=2)
        return self.models[ref]

    def runner(
        self, ref: str, *, forward: str | None = None, target: bool = False, features: bool = False
    ) -> CausalLMRunner | StateRunner | SequenceRunner:
        """A fresh runner over the model `ref` (`runner_for`: a chain runner for a target
        verified one chain per step, else a `CausalLMRunner`), forwarding as `forward` says (a runner
        forward; default: the target's under `decoding.forward`, `plan_for`), once `check` has
        passed it (as the pipeline's target with `target`; with `features` a drafter reads its
        hidden states: `read_features`, for good)."""
        check_ref("Resources.runner", ref)
        check_runner_forward("Resources.runner", forward)
        self.read_features |= {ref} if features else set()
        attend(self.model(ref), plan := self.plan_for(ref))
        self.check(ref, forward := forward or plan.target, target=target)
        pad = self.pad_small_blocks
        return runner_for(
            self.model(ref), forward=forward, bitwise=plan.bitwise, pad_small_blocks=pad
        )

    def check(self, ref: str, forward: str | None = None, *, target: bool = False) -> None:
        """Raise `ModelRefused` unless the model `ref` can be served exactly: no architecture
        rule excludes it (`attention_rules.refusal`) and, with `check_model`, its tree forwards
        match its own forward (`model_check.probe_model`) and, as a `target`, its own `generate`
        decodes as that forward does (`model_check.probe_generate`). Each (model, forward,
        attention) is checked once."""
        from treegraft.core.runner.model_check import probe_generate, probe_model  # -> runner
        from treegraft.core.runner.state_check import probe_chains

        check_ref("Resources.check", ref)
        check_runner_forward("Resources.check", forward)
        attention = getattr(self.model(ref).config, "_attn_implementation", None)
        keys = [(ref, forward or self.plan_for(ref).target, attention)]
        keys += [(ref, "generate", attention)] if target and self.check_model else []
        copies: dict = {}  # `model_check.on_wide_copy`: a low-precision model's, for both probes
        model = self.model(ref)
        if has_state_layers(model.config) and not target:  # verifies chains only
            raise ModelRefused(refused_message(model, ref, refusal(model) or STATE_DRAFTER))
        chains = target and chain_runner(model) is not None  # probed a chain per step
        for key in keys:
            if key not in self.checked:
                why = refusal(model, target=target)
                if why is None and self.check_model and key[1] == "generate":
                    why = probe_generate(model, copies=copies)
                elif why is None and self.check_model and chains:
                    why = probe_chains(model, forward=key[1], copies=copies)
                elif why is None and self.check_model:
                    why = probe_model(model, forward=key[1], copies=copies)
                self.checked[key] = None if why is None else refused_message(model, ref, why)
            if self.checked[key] is not None:
                raise ModelRefused(self.checked[key])

    def vocab_size(self, ref: str) -> int:
        check_ref("Resources.vocab_size", ref)
        return model_vocab_size(ref, self.models)

    def tokenizer_file(self, ref: str) -> Path | None:
        """The `tokenizer.json` stored beside the model `ref` (None: in memory, or none)."""
        check_ref("Resources.tokenizer_file", ref)
        if ref in self.in_memory:
            return None
        path = resolve_model_path(ref) / "tokenizer.json"
        return path if path.is_file() else None

    def tokenizer_of(self, ref: str) -> Any:
        """The tokenizer stored beside the model `ref` (loaded each call; not cached; files that
        do not load are a `ModelRefError`, `folder_tokenizer`), or given to `add_model` with it;
        None: in memory without one, or no files."""
        check_ref("Resources.tokenizer_of", ref)
        if ref in self.in_memory:
            return self.tokenizers.get(ref)
        return folder_tokenizer(resolve_model_path(ref), ref)

    def real_vocab(self, ref: str) -> int | None:
        """Token ids the tokenizer of `ref` defines (its embedding may have padding rows past
        them); None without a tokenizer."""
        check_ref("Resources.real_vocab", ref)
        tokenizer = self.tokenizer_of(ref)
        return None if tokenizer is None else len(tokenizer)

    def token_counts(self, ref: str) -> np.ndarray:
        """`[V]` int64 per-token counts from `zoo:token-counts` (the zoo tokenizer's) or a JSON
        file written by `treegraft zoo token-counts`; a component names them, Resources reads
        them (plugins do not import the zoo)."""
        from treegraft.zoo.token_counts import load_counts

        check_argument("Resources.token_counts", "ref", ref, str, "a token counts reference")
        return load_counts(ref)

    def datastore(self, ref: str) -> Any:
        """The token datastore `ref`, loaded once and shared by the drafters that name it: a
        file written by `treegraft datastore build`, or `zoo:corpus` (the zoo's training corpus
        in the target's tokens, built at first use and cached: one per target)."""
        check_argument("Resources.datastore", "ref", ref, str, "a datastore file or 'zoo:corpus'")
        key = f"{ref} for {self.target_ref}" if ref.startswith("zoo:") else ref
        if key not in self.datastores:
            from treegraft.core.datastore import Datastore, DatastoreError, DatastoreUnavailable

            path: str | Path = ref
            if ref.startswith("zoo:"):
                from treegraft.zoo.datastore import REF, corpus_datastore

                if ref != REF:
                    raise DatastoreError(f"unknown zoo datastore {ref!r}; expected {REF!r}")
                tokenizer = self.tokenizer_file(self.target_ref) if self.target_ref else None
                if tokenizer is None:
                    raise DatastoreUnavailable(self.corpus_unavailable())
                path = corpus_datastore(tokenizer, self.vocab_size(self.target_ref))
            self.datastores[key] = Datastore.load(path)
        return self.datastores[key]

    def corpus_unavailable(self) -> str | None:
        """Why `zoo:corpus` cannot be built for the target (None: it can): it is built in the
        target's tokens, from its `tokenizer.json`. Read without building it."""
        if self.target_ref and self.tokenizer_file(self.target_ref) is not None:
            return None
        return (
            "zoo:corpus is built in the target's tokens, from the tokenizer.json beside the "
            f"target; the target {self.target_ref or '(none)'!r} has none: build a datastore "
            "with `treegraft datastore build` and name its file"
        )

    def load_tokenizer(self, ref: str) -> Any:
        """The tokenizer of the model `ref`: its own (the folder's files, loaded once:
        `folder_tokenizer`; or the one given to `add_model`), else the explicitly set
        `tokenizer`, else None (the model takes token ids, not text)."""
        check_ref("Resources.load_tokenizer", ref)
        if ref not in self.tokenizers and ref not in self.in_memory:
            self.tokenizers[ref] = folder_tokenizer(resolve_model_path(ref), ref)
        own = self.tokenizers.get(ref)
        return own if own is not None else self.tokenizer
