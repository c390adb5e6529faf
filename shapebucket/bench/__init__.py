"""The steps/sec benchmark (``python -m shapebucket bench``, docs/benchmarks.md).

:mod:`.model` (the small GPT) and :mod:`.workloads` import nothing else from here, so the
examples that only need the model do not load the harness.
"""
