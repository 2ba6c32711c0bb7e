"""The file side: checkpoints on disk and the drivers that read them.

:mod:`.checkpoints` reads and writes checkpoint files and folders (safetensors, torch, shards)
one tensor at a time; :mod:`.merge_files` merges checkpoint files (streamed key by key where the
method allows); :mod:`.activations` captures layer inputs with forward hooks (ESM activations,
RegMean Grams, input covariances); :mod:`.esm_inputs` collects ESM's inputs for a model;
:mod:`.diagnose` diagnoses a set of checkpoints before merging. They use :mod:`acetools.layouts`
and :mod:`acetools.keys`, which stay at the top because :mod:`acetools.merging` uses them too; a
merge method never imports this package.
"""
