"""The image mini-world: offline tasks and pretraining pool (:mod:`.data`), open_clip encoders
and heads (:mod:`.models`), pretraining and fine-tuning (:mod:`.finetune`), and the world itself: the
hash-keyed checkpoint cache of base, experts and MTL (:mod:`.zoo`; the shipped base in ``assets/``).

Nothing in :mod:`acetools.merging` imports it: the merge methods run on any state dict.
"""
