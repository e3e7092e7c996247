"""Exposed data time per training step on a GPU (issue 14 item 1), before/after staging.

    python -m benchmarks.gpu_step                 # GPU: table + bench-out/gpu_step.json
    python -m benchmarks.gpu_step --cpu-smoke     # tiny, CPU: checks the logic only

A ResNet-50-like network (plain torch.nn: bottleneck stages 3-4-6-3, bfloat16 autocast,
channels_last, SGD) trains on batches of ImageNet-like JPEGs (synthetic, about 500x375,
made by ``dlpack_io.tools.synth`` and packed once into ``--work-dir``), transformed on the
GPU with ``RandomResizedCrop(224)``, a flip and ``Normalize`` to float16. Each step is
``next(loader)``, forward, backward, SGD, then ``loss.item()``: the per-step sync of a loop
that logs its loss, the case where a copy issued late is exposed. Contenders, interleaved
round by round (one epoch each per round, the first ``--warmup`` steps untimed):

* ``resident``: one batch kept on the GPU: the step alone (the floor);
* ``staged``: ``Loader(device="cuda")`` as shipped (batch k+1's host->device copy starts
  on a side stream before batch k is yielded);
* ``unstaged``: the same Loader under :func:`steps.no_staging` (the copy of batch k is issued
  only when batch k is due, as before issue 14 item 1).

Exposed data time = median step time with the loader - median step time of ``resident``;
issue 14's target: under 5% of the step (about 5 ms of ~100 ms on an H100 at batch 256).
Also reported: the median host wait inside ``next()``.
"""

# Modules: model (the ResNet-50-like network and its step), data (the synthetic data set),
# steps (the contenders, the no_staging switch, interleaved timed rounds), main (the
# command, the summary and its report).
