"""The learned scheduler: its runtime and its offline training pipeline.

Runtime (read by the `distilled` scheduler plugin at decode time; imports core only):

- `features`: the feature contract (`FEATURE_NAMES`, `layer_features`);
- `artifact`: the fitted model on disk (`SchedulerArtifact`) and the zoo's shipped one;
- `mlp`: the artifact's MLP folded for one decision at a time on the host.

Offline pipeline (`treegraft scheduler ...`, `cli`): the value system that values every schedule
of every step through the decoder's own step (`value_system`, `value_costs`, `value_labels`,
`value_data`), replay and evaluation (`value_eval`, `replay`), fitting (`fit`), leave one pair
out (`loo`), training prompts (`training_prompts`) and figures (`plots`).

Nothing is imported here, so `import treegraft.scheduling.features` stays light.
"""
