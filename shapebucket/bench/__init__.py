"""The steps/sec benchmark (``python -m shapebucket bench``), in three modules:

* :mod:`shapebucket.bench.harness`: each strategy's batches, model and timed steps;
* :mod:`shapebucket.bench.report`: the loss-agreement check, the table and the plot;
* :mod:`shapebucket.bench.cli`: the command line.

:mod:`shapebucket.bench.model` (the small GPT) and :mod:`shapebucket.bench.workloads`
(the length distributions) import nothing else from here, so the examples that
only need the model do not load the harness.
"""
