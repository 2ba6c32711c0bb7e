"""The file side: checkpoints on disk (:mod:`.checkpoints`) and what reads them: merging files
(:mod:`.merge_files`), per-task heads, the lineage check, diagnosis, captured activations and ESM's
inputs. A merge method never imports this package (docs/your-models.md).
"""
