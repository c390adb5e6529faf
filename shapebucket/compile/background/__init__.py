"""Compile while training: train eagerly at once while a spawned process compiles each
shape of the plan; each shape switches to its compiled graph when its cache is
published (:func:`~shapebucket.compile.compile_in_background`).

:mod:`shapebucket.compile` exports what a user constructs or calls; the handle
(:mod:`.handle`) and the record it returns (:mod:`.report`) are reached by their modules.
"""
