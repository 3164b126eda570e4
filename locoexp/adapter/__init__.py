"""Parameter-efficient adapters (`adapter` config group): what the trainer updates.

`adapter=none` trains every weight; `adapter=lora` (App. G's Tunix recipe: rank 64) wraps the
decoder's projections in flax's `nnx.LoRA` and trains only those low-rank factors (and the base
modules PEFT's `modules_to_save` names, in full). The package owns the adapted model, merging
it into plain weights for the engines and the PEFT directory it exports; it never builds a
model, an engine or an optimizer.
"""
