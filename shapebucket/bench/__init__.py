"""The steps/sec benchmark (``python -m shapebucket bench``):

* :mod:`shapebucket.bench.harness`: the run: its setup, every strategy warmed up, the
  interleaved timed rounds and the padding-invariance check;
* :mod:`shapebucket.bench.strategies`: the strategies and the record of each;
* :mod:`shapebucket.bench.runner`: one strategy's model, compiled step, warm-up,
  timed round and summary;
* :mod:`shapebucket.bench.batching` and :mod:`shapebucket.bench.peers`: each family's
  batches, and the peers' length-grouped batching;
* :mod:`shapebucket.bench.report`: the loss-agreement check, the table and the plot;
* :mod:`shapebucket.bench.cli`: the command line.

:mod:`shapebucket.bench.model` (the small GPT) and :mod:`shapebucket.bench.workloads`
(the length distributions) import nothing else from here, so the examples that
only need the model do not load the harness.
"""
